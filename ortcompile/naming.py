"""The file names one compile publishes. Imports nothing from the package: every layer may use it.

`-o build/` names the model after the source (`model.onnx` -> `build/model_ctx.onnx`); `-o build/x.onnx`
names it directly. Everything else follows from the model's file name: its manifest, its data files and the
EP's blobs (EPs name them after the model path they are given).

Files a graph references are published under content-addressed names (`content_addressed`): the first 12 hex
digits of their own sha256 in the name, so a new output never replaces bytes an older graph still points at
(see output/publish.py). They are written under provisional names (`data_file_name`, the EP's own) and
renamed in the stage once hashed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MODEL_SUFFIX = ".onnx"
COMPILED_SUFFIX = "_ctx"
MANIFEST_SUFFIX = ".manifest.json"
DIGEST_CHARS = 12  # 48 bits of sha256: readable, and no accidental collision between two generations of an output

_HEX = f"[0-9a-f]{{{DIGEST_CHARS}}}"
# A data file, provisional (`m_ctx.onnx.data.1`, `m_shared.data`) or already addressed (`m_ctx.<digest>.data.1`).
_DATA_NAME = re.compile(rf"(?P<stem>.+?)(?:\.onnx|\.{_HEX})?\.data(?P<shard>\.[0-9]+)?")
_ADDRESSED_STEM = re.compile(rf"(?P<stem>.+)\.{_HEX}")


def strip_onnx(name: str) -> str:
    return name[: -len(MODEL_SUFFIX)] if name.endswith(MODEL_SUFFIX) else name


@dataclass(frozen=True)
class OutputNames:
    """Names of one compiled model's files inside its output directory."""

    model: str  # e.g. "model_ctx.onnx"

    @classmethod
    def for_source(cls, source: str | os.PathLike[str]) -> OutputNames:
        """The default: `<source stem>_ctx.onnx`."""
        return cls(f"{strip_onnx(Path(source).name)}{COMPILED_SUFFIX}{MODEL_SUFFIX}")

    @classmethod
    def for_compile(cls, source: str | os.PathLike[str], model_name: str | None) -> OutputNames:
        """`-o DIR/FILE.onnx` names the model; `-o DIR/` gives the default."""
        return cls(model_name) if model_name else cls.for_source(source)

    @property
    def base(self) -> str:
        """The model's name without `.onnx`: the prefix every file of this output starts with."""
        return strip_onnx(self.model)

    @property
    def manifest(self) -> str:
        return f"{self.base}{MANIFEST_SUFFIX}"

    def data_file(self, index: int) -> str:
        return data_file_name(self.model, index)


def data_file_name(model_file_name: str, file_index: int) -> str:
    """External data files as written: `<model>.data`, then `<model>.data.1`, `.data.2`, ... with --shard-size.
    Published outputs rename them (`content_addressed`); split's parts and in-memory buffers keep these names."""
    return f"{model_file_name}.data" if file_index == 0 else f"{model_file_name}.data.{file_index}"


def content_addressed(name: str, sha256: str) -> str:
    """The published name of a file a graph references: the first DIGEST_CHARS hex digits of its sha256 before its
    extension. `m_ctx.onnx.data` -> `m_ctx.<digest>.data`, shard `m_ctx.onnx.data.1` -> `m_ctx.<digest>.data.1`,
    `m_shared.data` -> `m_shared.<digest>.data`, EP blob `m_ctx_qnn.bin` -> `m_ctx_qnn.<digest>.bin`.

    A name that already carries a digest (a compiled part's blob, linked by stitch) gets this one in its place,
    so the same bytes keep the same name: `content_addressed(content_addressed(n, h), h) == content_addressed(n, h)`.
    """
    digest = sha256[:DIGEST_CHARS]
    if data := _DATA_NAME.fullmatch(name):
        return f"{data['stem']}.{digest}.data{data['shard'] or ''}"
    if bare := _ADDRESSED_STEM.fullmatch(name):  # `blob.<digest>`: no extension
        return f"{bare['stem']}.{digest}"
    stem, dot, extension = name.rpartition(".")
    if not (dot and stem):
        return f"{name}.{digest}"
    if addressed := _ADDRESSED_STEM.fullmatch(stem):
        stem = addressed["stem"]
    return f"{stem}.{digest}.{extension}"


def carries_digest(name: str, sha256: str) -> bool:
    """Is `name` the content-addressed name of a file with this sha256 (one ortcompile published)?"""
    return bool(re.fullmatch(r"[0-9a-f]{64}", sha256)) and content_addressed(name, sha256) == name


@dataclass(frozen=True)
class OutputTarget:
    """Where one compiled model is published, resolved once from `-o`: its directory and its files' names. Every
    room after the driver's entry (plan, incremental, publish, finish) receives this record, never `-o` again."""

    directory: Path
    names: OutputNames

    @property
    def model_path(self) -> Path:
        return self.directory / self.names.model

    @property
    def manifest_path(self) -> Path:
        return self.directory / self.names.manifest


@dataclass(frozen=True)
class Destination:
    """Where a batch of compiled models goes, read once from `-o` for the models given: the output directory, the
    compiled model's file name when `-o` names one, and each model's OutputTarget, in the models' order. The drivers
    receive this record and read each model's target from it; nothing after it reads `-o` again."""

    directory: Path
    model_name: str | None  # -o DIR/FILE.onnx (None: each model is named `<stem>_ctx.onnx`)
    targets: tuple[OutputTarget, ...]

    @classmethod
    def parse(cls, output: str | os.PathLike[str], sources: Sequence[str | os.PathLike[str]]) -> Destination:
        """`-o` as typed: a path ending in `.onnx` that is not a directory names the compiled model (its files go
        beside it); anything else is the output directory."""
        path = Path(output)
        if path.name.lower().endswith(MODEL_SUFFIX) and not path.is_dir() and len(path.name) > len(MODEL_SUFFIX):
            return cls.of(path.parent, sources, path.name)
        return cls.of(path, sources)

    @classmethod
    def of(cls, directory: str | os.PathLike[str], sources: Sequence[str | os.PathLike[str]], model_name: str | None = None) -> Destination:
        """`-o` as the library is given it: a directory, and the compiled model's file name (CompileOptions.output_name)."""
        directory = Path(directory)
        return cls(directory, model_name, tuple(OutputTarget(directory, OutputNames.for_compile(s, model_name)) for s in sources))


def manifest_path_for(model_path: Path) -> Path:
    """`build/model_ctx.onnx` -> `build/model_ctx.manifest.json`."""
    return model_path.with_name(OutputNames(model_path.name).manifest)
