"""Check a compiled output against the manifest beside it: sizes always, sha256 when asked."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile.naming import manifest_path_for
from ortcompile.output.manifest import MANIFEST_FORMAT, hash_file


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


def check_manifest(model_path: Path, hash_files: bool) -> ManifestStatus:
    path = manifest_path_for(model_path)
    status = ManifestStatus(path, path.is_file(), hash_files)
    if not status.found:
        return status
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        status.error = f"{path.name}: unreadable manifest ({exc})"
        return status
    if isinstance(manifest, dict) and manifest.get("format") != MANIFEST_FORMAT:
        status.error = f"{path.name}: unknown manifest format {str(manifest.get('format'))[:60]!r}"
        return status
    shape_error = _shape_error(manifest)
    if shape_error:
        status.error = f"{path.name}: unreadable manifest ({shape_error})"
        return status
    status.manifest = manifest  # only a manifest of the right shape is ever read by callers
    for entry in manifest["files"]:
        status.files.append(_check_file(model_path.parent, entry, hash_files))
    return status


def _shape_error(manifest: Any) -> str:
    """Why a parsed manifest is not one ortcompile wrote (hand-edited, truncated, from elsewhere), or ''."""
    if not isinstance(manifest, dict):
        return "not a JSON object"
    if manifest.get("format") != MANIFEST_FORMAT:
        return f"unknown format {str(manifest.get('format'))[:60]!r}"
    files = manifest.get("files")
    if not isinstance(files, list) or not all(_valid_entry(f) for f in files):
        return "'files' must list objects with a plain name, an integer size and a sha256"
    for key in ("options", "nodes", "versions", "input"):
        if key in manifest and not isinstance(manifest[key], dict):
            return f"{key!r} must be an object"
    layout = manifest.get("options", {}).get("layout", {})
    if not isinstance(layout, dict):
        return "'options.layout' must be an object"
    for key in ("align", "align_threshold", "inline_threshold"):
        value = layout.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "align" else 0):
            return f"'options.layout.{key}' must be a non-negative integer"
    return ""


def _valid_entry(entry: Any) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("name"), str) and 0 < len(entry["name"]) <= 255
            and isinstance(entry.get("size"), int) and not isinstance(entry.get("size"), bool) and entry["size"] >= 0
            and isinstance(entry.get("sha256"), str) and isinstance(entry.get("role", ""), str))


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
