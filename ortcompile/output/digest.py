"""sha256 of output files (as they are written or after an EP wrote them) and of a compile's inputs.

An input's sha256 is remembered by the file's identity (hashcache.py: size, inode, device, mtime and ctime, as in
git's index), so a compile of an unchanged source and `--if-changed`'s check read none of its bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import mmap
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortcompile.errors import InvalidModel
from ortcompile.output.hashcache import Fingerprint, remembered_sha256
from ortcompile.output.manifest import InputFile
from ortcompile.paths import model_dir

HASH_WINDOW = 32 << 20


@dataclass(frozen=True)
class WrittenFile:
    name: str  # relative to the output directory
    size: int
    sha256: str


def hash_and_sync(path: Path) -> WrittenFile:
    """For files the EP wrote (never fsynced): hash and flush to disk at once, the flush on another thread.

    Everything ortcompile writes itself is fsynced before its rename; an EP's blob must be too, or a power
    loss after publishing could leave a model whose context file is empty.
    """
    from concurrent.futures import ThreadPoolExecutor

    fd = os.open(path, os.O_RDONLY)
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortcompile-fsync") as flusher:
            flushed = flusher.submit(os.fsync, fd)  # waits on the disk while the hash uses the CPU
            written = hash_file(path)
            flushed.result()
    finally:
        os.close(fd)
    return written


def hash_file(path: Path) -> WrittenFile:
    """Through mmap windows of HASH_WINDOW: read() copied every byte once more into a buffer (0.2-0.5 s of system
    time per 1.6 GB of page cache, measured), and a window unmapped after use leaves no buffer behind for a
    thread's malloc arena to keep (a batch's footprint would grow with each hashing thread)."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size:
            hash_file_range(digest, fd, 0, size)
    finally:
        os.close(fd)
    return WrittenFile(path.name, size, digest.hexdigest())


def hash_file_range(digest: Any, fd: int, offset: int, length: int) -> None:
    """Feed bytes [offset, offset + length) of a file to `digest`, mapping at most HASH_WINDOW at a time
    (a tensor being copied inside the kernel is hashed from the source's page cache, never read twice)."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    end = offset + length
    while start < end:
        size = min(HASH_WINDOW, end - start)
        with mmap.mmap(fd, size, prot=mmap.PROT_READ, offset=start) as window, memoryview(window) as view:
            digest.update(view[max(offset, start) - start : size])
        start += size


@dataclass(frozen=True)
class InputDigest:
    """sha256 of the model file and of every external data file it references (paths relative to it)."""

    files: tuple[tuple[str, int, str], ...]  # (relative name, size, sha256)
    fingerprints: tuple[dict[str, int], ...] = ()  # os.stat taken just before each hash (for --if-changed)
    hashed_at_ns: int = 0

    @property
    def combined(self) -> str:
        digest = hashlib.sha256()
        for name, size, sha in self.files:
            digest.update(f"{name}\0{size}\0{sha}\n".encode())
        return digest.hexdigest()

    @property
    def input_files(self) -> tuple[InputFile, ...]:
        return tuple(InputFile(n, s, h) for n, s, h in self.files)


def digest_inputs_in_background(model_path: Path, external_files: Iterable[Path]) -> InputDigest:
    """digest_inputs at idle CPU priority: it fills the gaps while an EP compiles in the worker child instead of
    competing with it for the cores (hashing gigabytes costs as much CPU as copying them). Not for pass-through,
    whose data pass is this process's own and must finish with it (CompileJob.digest_inputs)."""
    import threading

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux)
    except (OSError, AttributeError):
        pass
    return digest_inputs(model_path, external_files)


def digest_inputs(model_path: Path, external_files: Iterable[Path]) -> InputDigest:
    """Stat, then hash (or take the sha256 remembered for that fingerprint): a write during hashing changes ctime
    after the stat, so it is never remembered as current."""
    base = model_dir(model_path)
    hashed_at = time.time_ns()
    entries, fingerprints = [], []
    for path, name in [(model_path, model_path.name), *((p, p.relative_to(base).as_posix()) for p in external_files)]:
        try:
            fingerprint = Fingerprint.of(path)
            size, sha256 = remembered_sha256(path, fingerprint, _size_and_sha256)
        except OSError as exc:  # read (and checked) by the plan moments ago: gone, or the disk failed, since
            raise InvalidModel(f"{name}: cannot read the input to record its sha256: {exc.strerror or exc}") from exc
        fingerprints.append(dataclasses.asdict(fingerprint))
        entries.append((name, size, sha256))
    return InputDigest(tuple(entries), tuple(fingerprints), hashed_at)


def _size_and_sha256(path: Path) -> tuple[int, str]:
    written = hash_file(path)
    return written.size, written.sha256


def inputs_changed(source: Path, recorded: tuple[InputFile, ...], paths: tuple[Path | str, ...]) -> str:
    """'' when every recorded input (at `paths`, or why its recorded name cannot be used) still has its recorded
    sha256 (remembered for its fingerprint, else hashed, and then remembered); else why not."""
    if not recorded or recorded[0].name != source.name:
        return "the manifest was made from another input"
    for entry, path in zip(recorded, paths):
        if isinstance(path, str):
            return path
        if not path.is_file():
            return f"input {entry.name} is missing"
        fingerprint = Fingerprint.of(path)  # before hashing, as digest_inputs does
        if fingerprint.size != entry.size or remembered_sha256(path, fingerprint, _size_and_sha256)[1] != entry.sha256:
            return f"input {entry.name} changed"
    return ""
