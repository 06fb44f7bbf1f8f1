"""The file names one compile publishes. Imports nothing from the package: every layer may use it.

`-o build/` names the model after the source (`model.onnx` -> `build/model_ctx.onnx`); `-o build/x.onnx`
names it directly. Everything else follows from the model's file name: its data files, its manifest,
and the EP's blobs (EPs name them after the model path they are given).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MODEL_SUFFIX = ".onnx"
COMPILED_SUFFIX = "_ctx"
MANIFEST_SUFFIX = ".manifest.json"


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
    """External data files: `<model>.data`, then `<model>.data.1`, `.data.2`, ... with --shard-size."""
    return f"{model_file_name}.data" if file_index == 0 else f"{model_file_name}.data.{file_index}"


def split_output(output: str | os.PathLike[str]) -> tuple[Path, str | None]:
    """`-o`: a path ending in `.onnx` that is not a directory names the compiled model (its files go beside it);
    anything else is the output directory."""
    path = Path(output)
    if path.name.lower().endswith(MODEL_SUFFIX) and not path.is_dir() and len(path.name) > len(MODEL_SUFFIX):
        return path.parent, path.name
    return path, None


def manifest_path_for(model_path: Path) -> Path:
    """`build/model_ctx.onnx` -> `build/model_ctx.manifest.json`."""
    return model_path.with_name(OutputNames(model_path.name).manifest)
