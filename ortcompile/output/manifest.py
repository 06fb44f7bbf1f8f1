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
from ortcompile.options import CHECK_MODES
from ortcompile.paths import UnsafePath, is_plain_name, model_dir, resolve_inside, shown

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
class NodeCounts:
    """`nodes`: the EPContext nodes, the source's ops they replaced and the ops left outside them (finish.node_counts).
    Read as written: a reader that needs a count takes it from here (a missing one: 0, or None for compiled_ops)."""

    epcontext: int = 0
    compiled_ops: dict[str, int] | None = None  # op type -> source nodes inside EPContext nodes (None: not recorded)
    remaining_ops: dict[str, int] = field(default_factory=dict)  # op type -> nodes outside them

    def to_json(self) -> JsonObject:
        return {"epcontext": self.epcontext, "compiled_ops": self.compiled_ops, "remaining_ops": self.remaining_ops}

    @classmethod
    def from_json(cls, document: JsonObject) -> NodeCounts:
        return cls(document.get("epcontext", 0), document.get("compiled_ops"), document.get("remaining_ops", {}))


@dataclass(frozen=True)
class InitializerCounts:
    """`initializers`: how many weights live in data files and how many inline in the graph."""

    external: int = 0
    inline: int = 0

    def to_json(self) -> JsonObject:
        return {"external": self.external, "inline": self.inline}

    @classmethod
    def from_json(cls, document: JsonObject) -> InitializerCounts:
        return cls(document.get("external", 0), document.get("inline", 0))


@dataclass(frozen=True)
class CheckRecord:
    """`check`: what the pre-publish check proved (readback/check.record; deterministic: no times, no measured
    numbers). `passed` None: no check ran (`reason` says why, if anything stopped it)."""

    mode: str  # none | load | run
    passed: bool | None
    criterion: str | None = None  # run: the criterion's kind and the precision it judged by
    inputs: str | None = None  # run: what was fed
    compared: bool | None = None  # run: False when the outputs could not be compared (the check's warning)
    reason: str | None = None  # why the check did not run, or ran elsewhere
    on: str | None = None  # --share-weights checked on twins: what it ran on (compile/twins.py)

    def to_json(self) -> JsonObject:
        document: JsonObject = {"mode": self.mode, "passed": self.passed}
        for key in ("criterion", "inputs", "compared", "reason", "on"):
            if getattr(self, key) is not None:
                document[key] = getattr(self, key)
        return document

    @classmethod
    def from_json(cls, document: JsonObject) -> CheckRecord:
        return cls(document.get("mode", "none"), document.get("passed"), document.get("criterion"), document.get("inputs"),
                   document.get("compared"), document.get("reason"), document.get("on"))

    @property
    def strength(self) -> int:
        """How much it proved, as an index of CHECK_MODES (none < load < run): a check that did not pass proved nothing."""
        return CHECK_MODES.index(self.mode) if self.passed and self.mode in CHECK_MODES else 0


@dataclass(frozen=True)
class Manifest:
    model: str
    files: tuple[FileEntry, ...]
    input_sha256: str
    input_files: tuple[InputFile, ...]
    versions: Versions
    options: JsonObject  # what shaped the output (CompileOptions.recorded, made from the option table): compared whole by --if-changed
    nodes: NodeCounts = field(default_factory=NodeCounts)
    initializers: InitializerCounts = field(default_factory=InitializerCounts)
    check: CheckRecord | None = None  # what the pre-publish check proved
    # The sections below stay JSON as written: each is made by the step that owns it, kept byte for byte, and read
    # back whole (inspect, --json) or by the one reader named, which checks the field it needs.
    prepare: JsonObject | None = None  # what the prepare step did to the graph before the EP saw it (compile/prepare.py)
    target: JsonObject | None = None  # what the EP compiled for, with the device's own metadata (eps.ResolvedEp.target_record)
    parts: tuple[JsonObject, ...] | None = None  # a stitched model: the parts it was compiled as (compile/stitch.py; inspect shows them)
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
            nodes=NodeCounts.from_json(document.get("nodes") or {}),
            initializers=InitializerCounts.from_json(document.get("initializers") or {}),
            check=CheckRecord.from_json(document["check"]) if document.get("check") is not None else None,
            prepare=document.get("prepare"),
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

    @property
    def input_bytes(self) -> int:
        """The recorded inputs' size (what `--check auto` went by)."""
        return sum(f.size for f in self.input_files)

    def inputs_beside(self, source: Path) -> tuple[Path | str, ...]:
        """Each recorded input as a path beside `source` (the model itself first), or why its name cannot be one: a
        manifest is a file anyone can edit, so the names it records must stay in the source's directory."""
        base = model_dir(source)
        paths: list[Path | str] = []
        for index, entry in enumerate(self.input_files):
            try:
                paths.append(source if index == 0 else resolve_inside(base, entry.name))
            except UnsafePath as exc:
                paths.append(f"input {shown(entry.name)!r} {exc.reason}")
        return tuple(paths)

    # ---------------------------------------------------------------- writing

    def to_json(self) -> JsonObject:
        document: JsonObject = {
            "format": MANIFEST_FORMAT,
            "model": self.model,
            "files": [f.to_json() for f in self.files],
            "input": {"sha256": self.input_sha256, "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in self.input_files]},
            "versions": self.versions.to_json(),
            "options": self.options,
            "nodes": self.nodes.to_json(),
            "initializers": self.initializers.to_json(),
        }
        if self.prepare is not None:
            document["prepare"] = self.prepare
        if self.check is not None:
            document["check"] = self.check.to_json()
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
