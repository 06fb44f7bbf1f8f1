"""sha256 of output files (as they are written or after an EP wrote them) and of a compile's inputs.

A compile's input digest is also cached for `--if-changed`: hashing a multi-GB input costs seconds. The
stamp file under `$XDG_CACHE_HOME/ortcompile/stamps/` (keyed by the manifest's absolute path; not an output:
it holds inode numbers and timestamps, which must stay out of the deterministic manifest and the output
directory) remembers each input's fingerprint beside the sha256 it hashed to. Without the cache (a fresh CI
machine) the inputs are simply hashed again. A file's cached sha256 is trusted only when its size, inode,
device, mtime and ctime are all unchanged. The kernel sets ctime on every write, rename or chmod, and no API
sets it back, so any change to the bytes changes the fingerprint. One gap remains, as in git's index: a write
in the same clock tick as the stat taken before hashing. Entries whose ctime is within RACY_WINDOW_NS of that
moment are therefore never trusted and are hashed again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import mmap
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortcompile.durable import replace_file
from ortcompile.jsonedge import JsonObject
from ortcompile.naming import OutputTarget
from ortcompile.output.manifest import InputFile
from ortcompile.paths import model_dir

HASH_WINDOW = 32 << 20
RACY_WINDOW_NS = 2_000_000_000
STAMP_FORMAT = "ortcompile-stamp/1"


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


@dataclass(frozen=True)
class Fingerprint:
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int

    @classmethod
    def of(cls, path: Path) -> Fingerprint:
        st = path.stat()
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def digest_inputs_in_background(model_path: Path, external_files: Iterable[Path]) -> InputDigest:
    """digest_inputs at idle CPU priority: it fills the gaps while the EP compiles instead of competing with
    the data pass for the cores (hashing gigabytes costs as much CPU as copying them)."""
    import threading

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux)
    except (OSError, AttributeError):
        pass
    return digest_inputs(model_path, external_files)


def digest_inputs(model_path: Path, external_files: Iterable[Path]) -> InputDigest:
    """Stat, then hash: a write during hashing changes ctime after the stat, so it is never cached as current."""
    base = model_dir(model_path)
    hashed_at = time.time_ns()
    entries, fingerprints = [], []
    for path, name in [(model_path, model_path.name), *((p, p.relative_to(base).as_posix()) for p in external_files)]:
        fingerprints.append(dataclasses.asdict(Fingerprint.of(path)))
        written = hash_file(path)
        entries.append((name, written.size, written.sha256))
    return InputDigest(tuple(entries), tuple(fingerprints), hashed_at)


# ---------------------------------------------------------------- the stamp cache (--if-changed)

def stamp_path(target: OutputTarget) -> Path:
    """Outside the output directory, so outputs stay exactly the files the manifest lists."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ortcompile" / "stamps"
    key = hashlib.sha256(str(target.manifest_path.resolve()).encode()).hexdigest()[:32]
    return cache / f"{key}.json"


def write_stamp(target: OutputTarget, source: Path, digest: InputDigest) -> None:
    """Remember each input's fingerprint next to the sha256 it hashed to (a cache: failure is harmless)."""
    entries = [{"name": name, "sha256": sha, **fp} for (name, _, sha), fp in zip(digest.files, digest.fingerprints)]
    stamp = {"format": STAMP_FORMAT, "source_dir": str(model_dir(source)), "hashed_at_ns": digest.hashed_at_ns, "files": entries}
    path = stamp_path(target)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Atomic, not synced: a stamp lost to a power cut costs one re-hash, an fsync would cost every compile.
        replace_file(path, json.dumps(stamp, sort_keys=True), pending=path.with_name(path.name + f".{os.getpid()}.tmp"), sync=False)
    except OSError:
        pass


def _cached_sha256(stamp: JsonObject, name: str, path: Path) -> str | None:
    for entry in stamp.get("files", []):
        if entry.get("name") != name:
            continue
        recorded = Fingerprint(entry["size"], entry["mtime_ns"], entry["ctime_ns"], entry["ino"], entry["dev"])
        racy = recorded.ctime_ns >= stamp.get("hashed_at_ns", 0) - RACY_WINDOW_NS
        return entry["sha256"] if recorded == Fingerprint.of(path) and not racy else None
    return None


def _load_json(path: Path) -> JsonObject:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def inputs_changed(source: Path, target: OutputTarget, recorded: tuple[InputFile, ...], paths: tuple[Path | str, ...]) -> str:
    """'' when every recorded input (at `paths`, or why its recorded name cannot be used) still has its recorded
    sha256: from the stamp where its fingerprint is trusted, else hashed (and then cached again); else why not."""
    if not recorded or recorded[0].name != source.name:
        return "the manifest was made from another input"
    stamp = _load_json(stamp_path(target))
    if stamp.get("source_dir") != str(model_dir(source)):
        stamp = {}
    started_ns, rehashed = time.time_ns(), False
    files, fingerprints = [], []
    for entry, path in zip(recorded, paths):
        if isinstance(path, str):
            return path
        if not path.is_file():
            return f"input {entry.name} is missing"
        fingerprint = Fingerprint.of(path)  # before hashing, as digest_inputs does
        if fingerprint.size != entry.size:
            return f"input {entry.name} changed"
        sha = _cached_sha256(stamp, entry.name, path)
        if sha is None:
            sha, rehashed = hash_file(path).sha256, True
        if sha != entry.sha256:
            return f"input {entry.name} changed"
        files.append((entry.name, entry.size, sha))
        fingerprints.append(dataclasses.asdict(fingerprint))
    if rehashed:  # same bytes, new fingerprint (e.g. touched): cache it so the next check is fast again
        write_stamp(target, source, InputDigest(tuple(files), tuple(fingerprints), started_ns))
    return ""
