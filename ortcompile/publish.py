"""Atomic publishing: build everything in a staging directory beside the destination, then rename.

The staging directory lives inside the output directory (same filesystem, so renames are atomic) and
is named `.ortcompile-stage-<pid>-<random>`; a run that finds one whose process is gone removes it, so a
killed run never leaves junk that a later run could mistake for output. Files move into place data
first, then the model, then the manifest: a model never points at bytes that are not there yet.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from ortcompile.errors import OutputError

STAGE_PREFIX = ".ortcompile-stage-"


@dataclass(frozen=True)
class OutputNames:
    """The file names one compile publishes, from the source model's stem."""

    stem: str

    @classmethod
    def for_source(cls, source: Path) -> OutputNames:
        name = source.name
        return cls(name[: -len(".onnx")] if name.endswith(".onnx") else name)

    @property
    def model(self) -> str:
        return f"{self.stem}_ctx.onnx"

    @property
    def manifest(self) -> str:
        return f"{self.stem}_ctx.manifest.json"


def output_error(exc: OSError, what: str) -> OutputError:
    """Turn the OS's reason into a one-line message that says what to do."""
    hints = {
        errno.ENOSPC: "no space left on the device; free some space or choose another -o",
        errno.EDQUOT: "disk quota exceeded; free some space or choose another -o",
        errno.EACCES: "permission denied; choose a writable -o",
        errno.EPERM: "operation not permitted; choose a writable -o",
        errno.EROFS: "read-only filesystem; choose a writable -o",
    }
    reason = hints.get(exc.errno or 0, exc.strerror or str(exc))
    return OutputError(f"cannot write {what}: {reason}")


def prepare_output_dir(output_dir: Path) -> None:
    if output_dir.exists() and not output_dir.is_dir():
        raise OutputError(f"output path {output_dir} is a file, not a directory")
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(exc, f"output directory {output_dir}") from exc
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write output directory {output_dir}: permission denied; choose a writable -o")


def previous_outputs(output_dir: Path, names: OutputNames) -> list[str]:
    """Files an earlier compile of this model published here, per its manifest (or the model alone)."""
    found: list[str] = []
    manifest = output_dir / names.manifest
    if manifest.is_file():
        try:
            recorded = json.loads(manifest.read_text())
            found += [f["name"] for f in recorded.get("files", []) if _plain_name(f.get("name", ""))]
        except (OSError, ValueError, AttributeError, TypeError):
            pass  # an unreadable manifest is replaced; its files are found by name below
        found.append(names.manifest)
    if (output_dir / names.model).exists():
        found.append(names.model)
    return sorted(set(found))


def check_destination(output_dir: Path, names: OutputNames, force: bool, inputs: list[Path]) -> None:
    """Refuse to overwrite earlier outputs without --force, and the input model ever."""
    existing = previous_outputs(output_dir, names)
    targets = {(output_dir / n).resolve() for n in [*existing, names.model, names.manifest]}
    for path in inputs:
        if path.resolve() in targets or (output_dir / names.model).resolve() == path.resolve():
            raise OutputError(f"the output would overwrite the input {path}; choose another -o")
    if existing and not force:
        raise OutputError(f"{output_dir / existing[0]} already exists; pass --force to replace it")


def _plain_name(name: str) -> bool:
    return bool(name) and len(Path(name).parts) == 1 and not Path(name).is_absolute() and name not in (".", "..")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_stages(output_dir: Path) -> list[Path]:
    """Delete staging directories left by killed runs (their process no longer exists)."""
    removed = []
    for entry in output_dir.glob(STAGE_PREFIX + "*"):
        pid_text = entry.name[len(STAGE_PREFIX) :].split("-", 1)[0]
        if pid_text.isdigit() and not _process_alive(int(pid_text)):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


class Staging:
    """A private directory for one compile; removed on exit whether or not it was published."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        self.path = output_dir / f"{STAGE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"

    def __enter__(self) -> Staging:
        try:
            self.path.mkdir()
        except OSError as exc:
            raise output_error(exc, f"staging directory in {self.output_dir}") from exc
        return self

    def __exit__(self, *exc_info: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def publish(self, ordered_names: list[str], replaced: list[str]) -> None:
        """Rename staged files into place in the given order; then drop earlier outputs no longer produced."""
        try:
            for name in ordered_names:
                os.replace(self.path / name, self.output_dir / name)
            _fsync_dir(self.output_dir)
            for name in replaced:
                if name not in ordered_names:
                    (self.output_dir / name).unlink(missing_ok=True)
        except OSError as exc:
            raise output_error(exc, f"outputs into {self.output_dir}") from exc


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
