"""Atomic publishing: build everything in a staging directory beside the destination, then rename.

The staging directory lives inside the output directory (same filesystem, so renames are atomic) and
is named `.ortcompile-stage-<pid>-<random>`; a run that finds one whose process is gone removes it, so a
killed run never leaves junk that a later run could mistake for output. Files move into place data
first, then blobs, then the model, then the manifest: a model never points at bytes that are not there yet.
Publishing is serialized per directory and journaled, so a kill between two renames is completed by
the next run instead of leaving a mix of two outputs.

Replacing an output (`--force`, `--if-changed`) is atomic for readers too: every file a graph references has
its own digest in its name (naming.content_addressed), so the new generation's files never take a name the
old graph uses, and the model file is replaced by one rename. The previous generation's files are removed
only after the new model and manifest are in place. A reader that opened the old graph therefore finds the
old bytes, or (once they are removed) no file: its load fails cleanly, never with new bytes under an old graph.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ortcompile.durable import fsync_dir, replace_file
from ortcompile.errors import OutputError, output_error
from ortcompile.naming import MANIFEST_SUFFIX, OutputNames, OutputTarget, carries_digest
from ortcompile.output.manifest import Manifest, ManifestError
from ortcompile.paths import is_plain_name

STAGE_PREFIX = ".ortcompile-stage-"
JOURNAL = "publish.journal"  # inside a stage: the renames to finish if the publisher was killed


def prepare_output_dir(output_dir: Path) -> list[Path]:
    """Create the output directory (the stage must live inside it); return what was created, deepest last."""
    if output_dir.exists() and not output_dir.is_dir():
        raise OutputError(f"output path {output_dir} is a file, not a directory")
    missing = [p for p in [output_dir.absolute(), *output_dir.absolute().parents] if not p.exists()][::-1]
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        remove_created_dirs(missing)
        raise output_error(exc, f"output directory {output_dir}") from exc
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write output directory {output_dir}: permission denied; choose a writable -o")
    return missing


def remove_created_dirs(created: list[Path]) -> None:
    """After a failure: remove the directories this run created, if still empty (the destination as before)."""
    for directory in reversed(created):
        try:
            directory.rmdir()
        except OSError:
            return  # not empty (someone else's files) or already gone: leave it and its parents


def previous_outputs(target: OutputTarget) -> list[str]:
    """Files an earlier compile of this model published here, per its manifest (or the model alone)."""
    found: list[str] = []
    names, manifest = target.names, target.manifest_path
    if manifest.is_file():
        try:
            found += Manifest.load(manifest).names()
        except ManifestError:
            pass  # an unreadable manifest is replaced; its files are found by name below
        found.append(names.manifest)
    if target.model_path.exists():
        found.append(names.model)
    return sorted(set(found))


def superseded(output_dir: Path, names: list[OutputNames], published: list[str]) -> list[str]:
    """What to remove once `published` is in place: the files the previous manifests of `names` list that are not
    published again and that ortcompile named (each carries its own digest, or has a name ortcompile gave before
    names were content-addressed). Never a file another output in the directory still lists, nor anything else."""
    if not names:
        return []
    kept = set(published) | _listed_by_others(output_dir, names)
    found: set[str] = set()
    for output in names:
        manifest_path = output_dir / output.manifest
        if not manifest_path.is_file():
            continue
        try:
            manifest = Manifest.load(manifest_path)
        except ManifestError:
            continue  # its files cannot be told from anyone else's: leave them
        found |= {f.name for f in manifest.files if f.role != "model" and (carries_digest(f.name, f.sha256) or _legacy_name(f.name, f.role, output))}
    return sorted(found - kept)


def _legacy_name(name: str, role: str, names: OutputNames) -> bool:
    """Data and blob names published before content addressing: `<model>.data[.N]`, `<stem>_shared.data[.N]`, and
    the EP's own `<model base>_*` blob names."""
    if role == "data":
        return bool(re.fullmatch(rf"(?:{re.escape(names.model)}|.+_shared)\.data(?:\.[0-9]+)?", name))
    return role == "ep_context" and name.startswith(f"{names.base}_")


def _listed_by_others(output_dir: Path, names: list[OutputNames]) -> set[str]:
    """Every file the other manifests in the directory list (a batch's shared data, another model's files)."""
    ours = {n.manifest for n in names}
    listed: set[str] = set()
    for path in output_dir.glob(f"*{MANIFEST_SUFFIX}"):
        if path.name in ours:
            continue
        try:
            listed |= {path.name, *Manifest.load(path).names()}
        except ManifestError:
            continue
    return listed


def already_exists(target: OutputTarget, existing: list[str]) -> str:
    """Name the model (what the user asked for), not whichever of its files sorts first."""
    names = target.names
    shown = names.model if names.model in existing or names.manifest in existing else existing[0]
    return f"{target.directory / shown} already exists; replace it with --force (CompileOptions(force=True) from Python)"


def check_destination(target: OutputTarget, force: bool, inputs: list[Path]) -> None:
    """Refuse to overwrite earlier outputs without --force, and the input model ever."""
    existing, names, output_dir = previous_outputs(target), target.names, target.directory
    targets = {(output_dir / n).resolve() for n in [*existing, names.model, names.manifest]}
    out = output_dir.resolve()
    for path in inputs:
        resolved = path.resolve()
        # Data files (<stem>_ctx.<digest>.data[.N]) and EP blobs (<stem>_ctx_*) are named only once staged.
        ours = resolved.parent == out and resolved.name.startswith(names.base)
        if resolved in targets or ours:
            raise OutputError(f"the output would overwrite the input {path}; choose another -o")
    if existing and not force:
        raise OutputError(already_exists(target, existing))


def _stage_owner(stage: Path) -> int | None:
    """The pid in a stage's name, or None when the name is not one ortcompile makes."""
    pid_text = stage.name[len(STAGE_PREFIX) :].split("-", 1)[0]
    if not (pid_text.isascii() and pid_text.isdigit()) or len(pid_text) > 9:
        return None
    return int(pid_text)


def _is_dead_stage(stage: Path) -> bool:
    pid = _stage_owner(stage)
    return pid is not None and stage.is_dir() and not _process_alive(pid)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # not ours to judge: leave it alone
    return True


@contextlib.contextmanager
def directory_lock(directory: Path) -> Iterator[None]:
    """Serialize publishing into one directory across processes (flock on the directory itself: no lock file)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock; a killed process releases it too


def remove_stale_stages(output_dir: Path) -> list[Path]:
    """Clean up after killed runs (their process no longer exists).

    A stage with a committed journal was killed while renaming into place: finish its renames, so the
    destination holds that complete output. Any other stale stage never published anything: delete it.
    """
    removed = []
    for entry in sorted(output_dir.glob(STAGE_PREFIX + "*")):
        if _is_dead_stage(entry):
            journal = _read_journal(entry)
            if journal is not None:
                _apply_journal(entry, output_dir, journal)
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def pending_publishes(output_dir: Path) -> list[str]:
    """Stages of killed runs whose journal was committed: the directory mixes two outputs until a compile
    there finishes the renames. Read-only (inspect and verify report it; compile repairs it)."""
    pending = []
    for entry in sorted(output_dir.glob(STAGE_PREFIX + "*")):
        journal = _read_journal(entry) if _is_dead_stage(entry) else None
        if journal is not None and _journal_has_work(entry, output_dir, journal):
            pending.append(entry.name)
    return pending


def _journal_has_work(stage: Path, output_dir: Path, journal: dict[str, list[str]]) -> bool:
    """A staged file still waiting to move, or an old output still waiting to be deleted."""
    return any((stage / n).exists() for n in journal["move"]) or any((output_dir / n).exists() for n in journal["delete"])


def _read_journal(stage: Path) -> dict[str, list[str]] | None:
    try:
        journal = json.loads((stage / JOURNAL).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(journal, dict):
        return None
    lists: dict[str, list[Any]] = {}
    for key in ("move", "delete"):
        value = journal.get(key)
        lists[key] = value if isinstance(value, list) else []
    return {key: [n for n in names if is_plain_name(n)] for key, names in lists.items()}


def _apply_journal(stage: Path, output_dir: Path, journal: dict[str, list[str]]) -> None:
    """Idempotent: files already moved are skipped, so a crash during this is recovered the same way."""
    for name in journal["move"]:
        try:
            os.replace(stage / name, output_dir / name)
        except FileNotFoundError:
            pass  # moved already (by an earlier, interrupted recovery)
    fsync_dir(output_dir)
    for name in journal["delete"]:
        (output_dir / name).unlink(missing_ok=True)


class Staging:
    """A private directory for one compile; removed on exit whether or not it was published."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        # Absolute: ORT compiles with the source's directory as the working directory (see ortstep).
        self.path = output_dir.absolute() / f"{STAGE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"

    def __enter__(self) -> Staging:
        try:
            self.path.mkdir()
        except OSError as exc:
            raise output_error(exc, f"staging directory in {self.output_dir}") from exc
        return self

    def __exit__(self, *exc_info: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def publish(self, ordered_names: list[str], targets: list[OutputTarget], force: bool, inputs: list[Path] = ()) -> None:  # type: ignore[assignment]
        """Move staged files into place in order (data, blobs, model, manifest), then drop the previous generation's
        files the new one does not use (`superseded`).

        Under the directory lock: recover killed publishes first, re-check --force (another process may
        have published since we started), then commit a journal so a kill mid-rename is finished later.
        """
        try:
            with directory_lock(self.output_dir):
                remove_stale_stages(self.output_dir)
                _refuse_overwriting_inputs(self.output_dir, ordered_names, inputs)
                outputs = [t.names for t in targets]
                existing = sorted({f for t in targets for f in previous_outputs(t)})
                clashing = [n for n in ordered_names if (self.output_dir / n).exists() or (self.output_dir / n).is_symlink()]
                if (existing or clashing) and not force:
                    raise OutputError(f"{self.output_dir / (existing or clashing)[0]} already exists; replace it with --force "
                                      "(CompileOptions(force=True) from Python)")
                journal = {"move": ordered_names, "delete": superseded(self.output_dir, outputs, ordered_names)}
                _write_journal(self.path, journal)
                self._apply_or_roll_back(journal)
        except OSError as exc:
            raise output_error(exc, f"outputs into {self.output_dir}") from exc

    def _apply_or_roll_back(self, journal: dict[str, list[str]]) -> None:
        """Rename into place; if a rename fails (not a kill: that is rolled forward), put the old files back."""
        backup = self.path / "replaced"
        backup.mkdir()
        moved: list[tuple[str, bool]] = []
        try:
            for name in journal["move"]:
                target = self.output_dir / name
                had_old = target.exists()
                if had_old:
                    _keep_copy(target, backup / name)
                os.replace(self.path / name, target)
                moved.append((name, had_old))
        except OSError:
            (self.path / JOURNAL).unlink(missing_ok=True)  # a later run must not roll this forward
            for name, had_old in reversed(moved):
                if had_old:
                    os.replace(backup / name, self.output_dir / name)
                else:
                    (self.output_dir / name).unlink(missing_ok=True)
            raise
        fsync_dir(self.output_dir)
        for name in journal["delete"]:
            (self.output_dir / name).unlink(missing_ok=True)
        # Done: a kill from here on must not read as a pending publish, nor hold the old files' space.
        (self.path / JOURNAL).unlink(missing_ok=True)
        shutil.rmtree(backup, ignore_errors=True)


def _keep_copy(path: Path, backup: Path) -> None:
    """A hard link costs nothing and leaves `path` in place; where links are impossible, copy."""
    try:
        os.link(path, backup)
    except OSError:
        shutil.copy2(path, backup)


def _refuse_overwriting_inputs(output_dir: Path, ordered_names: list[str], inputs: list[Path]) -> None:
    """The definitive check, on the real staged names: never replace the model we compiled from or its data."""
    protected = {p.resolve() for p in inputs}
    for name in ordered_names:
        if (output_dir / name).resolve() in protected:
            raise OutputError(f"the output file {name} would overwrite an input file; choose another -o")


def _write_journal(stage: Path, journal: dict[str, list[str]]) -> None:
    """Write then rename: the journal exists complete or not at all."""
    replace_file(stage / JOURNAL, json.dumps(journal), pending=stage / (JOURNAL + ".tmp"))
