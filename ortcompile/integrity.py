"""Check a compiled output against the manifest beside it: sizes always, sha256 when asked."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile.manifest import MANIFEST_FORMAT, hash_file


@dataclass(frozen=True)
class FileStatus:
    name: str
    role: str
    expected_size: int
    actual_size: int | None  # None: missing
    sha256_ok: bool | None  # None: not hashed

    @property
    def problem(self) -> str:
        if self.actual_size is None:
            return "missing"
        if self.actual_size != self.expected_size:
            return f"size {self.actual_size}, manifest says {self.expected_size}"
        if self.sha256_ok is False:
            return "sha256 differs from the manifest"
        return ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "size": self.expected_size,
            "actual_size": self.actual_size,
            "sha256_ok": self.sha256_ok,
            "status": self.problem or "ok",
        }


@dataclass
class ManifestStatus:
    path: Path
    found: bool
    hashed: bool
    files: list[FileStatus] = field(default_factory=list)
    error: str = ""
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.found and not self.error and all(not f.problem for f in self.files)

    @property
    def problems(self) -> list[str]:
        if not self.found:
            return [f"no manifest at {self.path.name}"]
        if self.error:
            return [self.error]
        return [f"{f.name}: {f.problem}" for f in self.files if f.problem]

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path.name,
            "found": self.found,
            "hashed": self.hashed,
            "ok": self.ok,
            "problems": self.problems,
            "files": [f.to_json() for f in self.files],
        }


def manifest_path_for(model_path: Path) -> Path:
    """`build/model_ctx.onnx` -> `build/model_ctx.manifest.json`."""
    name = model_path.name
    stem = name[: -len(".onnx")] if name.endswith(".onnx") else name
    return model_path.with_name(f"{stem}.manifest.json")


def check_manifest(model_path: Path, hash_files: bool) -> ManifestStatus:
    path = manifest_path_for(model_path)
    status = ManifestStatus(path, path.is_file(), hash_files)
    if not status.found:
        return status
    try:
        status.manifest = json.loads(path.read_text())
        entries = status.manifest["files"]
        if status.manifest.get("format") != MANIFEST_FORMAT:
            status.error = f"{path.name}: unknown manifest format {status.manifest.get('format')!r}"
            return status
    except (OSError, ValueError, KeyError, TypeError) as exc:
        status.error = f"{path.name}: unreadable manifest ({exc})"
        return status
    for entry in entries:
        status.files.append(_check_file(model_path.parent, entry, hash_files))
    return status


def _check_file(directory: Path, entry: dict[str, Any], hash_files: bool) -> FileStatus:
    name, size, role = str(entry.get("name", "")), int(entry.get("size", -1)), str(entry.get("role", ""))
    target = directory / name
    if not name or Path(name).is_absolute() or len(Path(name).parts) != 1 or not target.is_file():
        return FileStatus(name, role, size, None, None)
    actual = target.stat().st_size
    sha_ok = None
    if hash_files and actual == size:
        sha_ok = hash_file(target).sha256 == entry.get("sha256")
    return FileStatus(name, role, size, actual, sha_ok)
