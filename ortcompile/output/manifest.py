"""The manifest beside every output: each file's size and sha256, the input digest, versions, options.

It holds no timestamps and no absolute paths, so compiling the same input twice gives the same bytes.
`Manifest.load` is the one reader: every part of ortcompile that looks at a manifest gets this typed
record or a `ManifestError` saying, in one line, why the file is not a manifest ortcompile wrote.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile.jsonedge import JsonObject
from ortcompile.naming import manifest_path_for
from ortcompile.paths import is_plain_name

MANIFEST_FORMAT = "ortcompile-manifest/1"
ROLES = ("model", "data", "ep_context")


class ManifestError(ValueError):
    """A manifest that cannot be trusted: unreadable, hand-edited into another shape, or from elsewhere."""


@dataclass(frozen=True)
class FileEntry:
    name: str  # a plain file name inside the output directory
    role: str  # model | data | ep_context
    size: int
    sha256: str
    shared: bool | None = None  # --share-weights: also used by other models of the batch (None: not a batch)

    def to_json(self) -> JsonObject:
        entry: JsonObject = {"name": self.name, "role": self.role, "size": self.size, "sha256": self.sha256}
        if self.shared is not None:
            entry["shared"] = self.shared
        return entry


@dataclass(frozen=True)
class InputFile:
    name: str  # relative to the source model's directory (the model itself first)
    size: int
    sha256: str


@dataclass(frozen=True)
class Versions:
    ortcompile: str
    onnxruntime: str
    ep_name: str
    ep_version: str

    def to_json(self) -> JsonObject:
        return {"ortcompile": self.ortcompile, "onnxruntime": self.onnxruntime, "ep": {"name": self.ep_name, "version": self.ep_version}}


@dataclass(frozen=True)
class Manifest:
    model: str
    files: tuple[FileEntry, ...]
    input_sha256: str
    input_files: tuple[InputFile, ...]
    versions: Versions
    # The sections below stay JSON as written: each is made by the step that owns it, kept byte for byte, and read
    # back only by the few readers named (a reader that needs a field checks it there).
    options: JsonObject  # what shaped the output (optiontable: CompileOptions.recorded): compared whole by --if-changed
    nodes: JsonObject = field(default_factory=dict)  # epcontext count, compiled_ops, remaining_ops (compile/finish.node_counts)
    initializers: dict[str, int] = field(default_factory=dict)  # external / inline counts
    prepare: JsonObject | None = None  # what the prepare step did to the graph before the EP saw it (compile/prepare.py)
    check: JsonObject | None = None  # what the pre-publish check proved (readback/check.record)
    target: JsonObject | None = None  # what the EP compiled for (eps.ResolvedEp.target_record)
    parts: tuple[JsonObject, ...] | None = None  # a stitched model: the parts it was compiled as (compile/stitch.py)
    cpu_nodes: JsonObject | None = None  # --cpu-nodes / --fallback auto: what was kept off the EP and why (compile/fallback.py)

    # ---------------------------------------------------------------- reading

    @classmethod
    def load(cls, path: Path) -> Manifest:
        try:
            document = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ManifestError(f"{path.name}: unreadable manifest ({exc})") from None
        try:
            return cls.from_json(document)
        except ManifestError as exc:
            raise ManifestError(f"{path.name}: {exc}") from None

    @classmethod
    def beside(cls, model_path: Path) -> Manifest | None:
        """The manifest next to a compiled model, None when there is none (errors still raise)."""
        path = manifest_path_for(model_path)
        return cls.load(path) if path.is_file() else None

    @classmethod
    def from_json(cls, document: Any) -> Manifest:
        if not isinstance(document, dict):
            raise ManifestError("unreadable manifest (not a JSON object)")
        if document.get("format") != MANIFEST_FORMAT:
            raise ManifestError(f"unknown manifest format {str(document.get('format'))[:60]!r}")
        for key in ("options", "nodes", "versions", "input", "initializers", "prepare", "check", "target", "cpu_nodes"):
            if document.get(key) is not None and not isinstance(document[key], dict):
                raise ManifestError(f"unreadable manifest ({key!r} must be an object)")
        model = document.get("model")
        if not is_plain_name(model):
            raise ManifestError("unreadable manifest ('model' must be a plain file name)")
        options = document.get("options") or {}
        _check_layout(options)
        return cls(
            model=model,
            files=tuple(_file_entry(f) for f in _list(document.get("files"), "files")),
            input_sha256=str((document.get("input") or {}).get("sha256", "")),
            input_files=tuple(_input_file(f) for f in _list((document.get("input") or {}).get("files", []), "input.files")),
            versions=_versions(document.get("versions") or {}),
            options=options,
            nodes=document.get("nodes") or {},
            initializers=document.get("initializers") or {},
            prepare=document.get("prepare"),
            check=document.get("check"),
            target=document.get("target"),
            parts=tuple(_list(document["parts"], "parts")) if document.get("parts") is not None else None,
            cpu_nodes=document.get("cpu_nodes"),
        )

    # ---------------------------------------------------------------- questions readers ask

    def names(self, role: str | None = None) -> list[str]:
        return [f.name for f in self.files if role is None or f.role == role]

    @property
    def shared_names(self) -> set[str]:
        return {f.name for f in self.files if f.shared}

    @property
    def shares_ep_context(self) -> bool:
        """Part of a --share-weights batch whose EP context several models use."""
        return any(f.role == "ep_context" and f.shared for f in self.files)

    @property
    def ep(self) -> str:
        """The short EP name the output was compiled for."""
        return str(self.options.get("ep", ""))

    @property
    def layout(self) -> JsonObject:
        return self.options.get("layout") or {}

    # ---------------------------------------------------------------- writing

    def to_json(self) -> JsonObject:
        document: JsonObject = {
            "format": MANIFEST_FORMAT,
            "model": self.model,
            "files": [f.to_json() for f in self.files],
            "input": {"sha256": self.input_sha256, "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in self.input_files]},
            "versions": self.versions.to_json(),
            "options": self.options,
            "nodes": self.nodes,
            "initializers": self.initializers,
        }
        if self.prepare is not None:
            document["prepare"] = self.prepare
        if self.check is not None:
            document["check"] = self.check
        if self.target is not None:
            document["target"] = self.target
        if self.parts is not None:
            document["parts"] = list(self.parts)
        if self.cpu_nodes is not None:
            document["cpu_nodes"] = self.cpu_nodes
        return document

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def file_entries(files: Iterable[tuple[Any, str]], shared: set[str] | None = None) -> tuple[FileEntry, ...]:
    """(WrittenFile, role) pairs as manifest entries; with `shared`, a --share-weights batch's marks."""
    return tuple(FileEntry(f.name, role, f.size, f.sha256, None if shared is None else f.name in shared) for f, role in files)


def _int(value: Any, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ManifestError(f"unreadable manifest ({what!r} must be a list)")
    return value


def _file_entry(entry: Any) -> FileEntry:
    valid = (isinstance(entry, dict) and is_plain_name(entry.get("name")) and _int(entry.get("size")) and isinstance(entry.get("sha256"), str)
             and entry.get("role", "data") in ROLES and isinstance(entry.get("shared", False), bool))
    if not valid:
        raise ManifestError("unreadable manifest ('files' must list objects with a plain name, a known role, an integer size and a sha256)")
    return FileEntry(entry["name"], entry.get("role", "data"), entry["size"], entry["sha256"], entry.get("shared"))


def _input_file(entry: Any) -> InputFile:
    if not (isinstance(entry, dict) and isinstance(entry.get("name"), str) and _int(entry.get("size")) and isinstance(entry.get("sha256"), str)):
        raise ManifestError("unreadable manifest ('input.files' must list objects with a name, a size and a sha256)")
    return InputFile(entry["name"], entry["size"], entry["sha256"])


def _versions(versions: JsonObject) -> Versions:
    ep = versions.get("ep") or {}
    if not isinstance(ep, dict):
        raise ManifestError("unreadable manifest ('versions.ep' must be an object)")
    return Versions(str(versions.get("ortcompile", "")), str(versions.get("onnxruntime", "")), str(ep.get("name", "")), str(ep.get("version", "")))


def _check_layout(options: JsonObject) -> None:
    layout = options.get("layout", {})
    if not isinstance(layout, dict):
        raise ManifestError("unreadable manifest ('options.layout' must be an object)")
    for key in ("align", "align_threshold", "inline_threshold"):
        if key in layout and not _int(layout[key], 1 if key == "align" else 0):
            raise ManifestError(f"unreadable manifest ('options.layout.{key}' must be a non-negative integer)")
