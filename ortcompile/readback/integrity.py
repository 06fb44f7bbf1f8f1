"""Check a compiled output against the manifest beside it: sizes always, sha256 when asked."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ortcompile.jsonedge import JsonObject
from ortcompile.naming import manifest_path_for
from ortcompile.output.digest import hash_file
from ortcompile.output.manifest import FileEntry, Manifest, ManifestError
from ortcompile.paths import UnsafePath, resolve_inside


@dataclass(frozen=True)
class FileStatus:
    name: str
    role: str
    expected_size: int
    actual_size: int | None  # None: missing (or unsafe)
    sha256_ok: bool | None  # None: not hashed
    unsafe: str = ""  # why the name may not be opened (a symlink leading out of the output directory)

    @property
    def problem(self) -> str:
        if self.unsafe:
            return f"unsafe path: {self.unsafe}"
        if self.actual_size is None:
            return "missing"
        if self.actual_size != self.expected_size:
            return f"size {self.actual_size}, manifest says {self.expected_size}"
        if self.sha256_ok is False:
            return "sha256 differs from the manifest"
        return ""

    def to_json(self) -> JsonObject:
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
    manifest: Manifest | None = None  # set only when the manifest is one ortcompile wrote

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

    def to_json(self) -> JsonObject:
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
        status.manifest = Manifest.load(path)
    except ManifestError as exc:
        status.error = str(exc)
        return status
    status.files = [_check_file(model_path.parent, entry, hash_files) for entry in status.manifest.files]
    return status


def _check_file(directory: Path, entry: FileEntry, hash_files: bool) -> FileStatus:
    try:  # the name is plain (Manifest.load checks that), but a file of that name may be a link leading elsewhere
        target = resolve_inside(directory, entry.name, plain=True)
    except UnsafePath as exc:
        return FileStatus(entry.name, entry.role, entry.size, None, None, exc.reason)
    if not target.is_file():
        return FileStatus(entry.name, entry.role, entry.size, None, None)
    actual = target.stat().st_size
    sha_ok = None
    if hash_files and actual == entry.size:
        sha_ok = hash_file(target).sha256 == entry.sha256
    return FileStatus(entry.name, entry.role, entry.size, actual, sha_ok)
