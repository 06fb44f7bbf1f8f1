"""The sha256 of an input file, remembered by the file's identity: a source compiled again (for another target,
with other options, into another directory) is not hashed again. A 2.4 GB source costs ~1.7 CPU s to hash, as much
as copying its bytes, on every compile that records its inputs in the manifest.

As in git's index, an entry is trusted only when the file's size, inode, device, mtime and ctime are all what they
were when it was hashed: the kernel sets ctime on every write, rename or chmod and no API sets it back, so changed
bytes change the fingerprint. One gap remains, a write in the same clock tick as the stat taken before hashing:
an entry whose file's ctime is within RACY_WINDOW_NS of the moment its hash began is never trusted.

Entries live in `$XDG_CACHE_HOME/ortcompile/hashes/` (keyed by the file's absolute path), outside every output: they
hold inode numbers and timestamps, which must stay out of the deterministic manifests. A lost or unreadable entry
costs one hash; this module never fails a compile.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ortcompile.durable import replace_file

CACHE_FORMAT = "ortcompile-hash/1"
RACY_WINDOW_NS = 2_000_000_000
MIN_BYTES = 1 << 20  # smaller files hash in well under a millisecond: faster than reading an entry
MAX_ENTRIES = 4096  # beyond this, entries of files that are gone (a stage's parts, a deleted model) are dropped


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


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ortcompile"


def _entry_path(path: Path) -> Path:
    key = hashlib.sha256(str(path.absolute()).encode()).hexdigest()[:32]
    return cache_root() / "hashes" / f"{key}.json"


def remembered_sha256(path: Path, fingerprint: Fingerprint, compute: Callable[[Path], tuple[int, str]]) -> tuple[int, str]:
    """(size, sha256) of `path`: remembered for `fingerprint` (taken now, before hashing), else `compute`d and
    remembered (a file that changed size under the hash is not)."""
    if (known := cached_sha256(path, fingerprint)) is not None:
        return fingerprint.size, known
    started_ns = time.time_ns()
    size, sha256 = compute(path)
    if size == fingerprint.size:
        remember_sha256(path, fingerprint, sha256, started_ns)
    return size, sha256


def cached_sha256(path: Path, fingerprint: Fingerprint) -> str | None:
    """The sha256 remembered for `path` when its fingerprint (taken now) is the one it was hashed with, else None."""
    if fingerprint.size < MIN_BYTES:
        return None
    try:
        entry = json.loads(_entry_path(path).read_text())
        recorded = Fingerprint(**entry["fingerprint"])
        sha256, hashed_at_ns = str(entry["sha256"]), int(entry["hashed_at_ns"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    racy = recorded.ctime_ns >= hashed_at_ns - RACY_WINDOW_NS
    fresh = entry.get("format") == CACHE_FORMAT and entry.get("path") == str(path.absolute()) and recorded == fingerprint
    return sha256 if fresh and not racy and len(sha256) == 64 else None


def remember_sha256(path: Path, fingerprint: Fingerprint, sha256: str, hashed_at_ns: int) -> None:
    """Keep `sha256` for `path` as it was when `fingerprint` was taken, before hashing began at `hashed_at_ns`."""
    if fingerprint.size < MIN_BYTES:
        return
    entry = {"format": CACHE_FORMAT, "path": str(path.absolute()), "sha256": sha256, "hashed_at_ns": hashed_at_ns,
             "fingerprint": asdict(fingerprint)}
    target = _entry_path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _drop_entries_of_missing_files(target.parent)
        # Atomic, not synced: an entry lost to a power cut costs one hash, an fsync would cost every compile.
        replace_file(target, json.dumps(entry, sort_keys=True), pending=target.with_name(f"{target.name}.{os.getpid()}.tmp"), sync=False)
    except OSError:
        pass


def _drop_entries_of_missing_files(directory: Path) -> None:
    """Keep the cache bounded: once it holds MAX_ENTRIES, forget the files that no longer exist, then, if it is still
    full of live ones, the least recently written quarter (else every later entry would read them all again)."""
    entries = list(directory.glob("*.json"))
    if len(entries) + 1 < MAX_ENTRIES:
        return
    live = []
    for entry in entries:
        try:
            if Path(json.loads(entry.read_text())["path"]).exists():
                live.append((entry.stat().st_mtime_ns, entry))
                continue
        except (OSError, ValueError, KeyError, TypeError):
            pass
        entry.unlink(missing_ok=True)
    if len(live) + 1 >= MAX_ENTRIES:
        for _, entry in sorted(live)[: max(1, len(live) // 4)]:
            entry.unlink(missing_ok=True)
