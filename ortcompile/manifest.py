"""The manifest beside every output: each file's size and sha256, the input digest, versions, options.

It holds no timestamps and no absolute paths, so compiling the same input twice gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortcompile.datapass import WrittenFile

MANIFEST_FORMAT = "ortcompile-manifest/1"
HASH_CHUNK = 16 << 20


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
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as stream:
        while chunk := stream.read(HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return WrittenFile(path.name, size, digest.hexdigest())


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

    def to_json(self) -> dict[str, Any]:
        return {
            "sha256": self.combined,
            "files": [{"name": n, "size": s, "sha256": h} for n, s, h in self.files],
        }


def _fingerprint(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino, "dev": st.st_dev}


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
    from ortcompile.source import model_dir

    base = model_dir(model_path)
    hashed_at = time.time_ns()
    entries, fingerprints = [], []
    for path, name in [(model_path, model_path.name), *((p, p.relative_to(base).as_posix()) for p in external_files)]:
        fingerprints.append(_fingerprint(path))
        written = hash_file(path)
        entries.append((name, written.size, written.sha256))
    return InputDigest(tuple(entries), tuple(fingerprints), hashed_at)


def build_manifest(
    *,
    model_name: str,
    files: list[tuple[WrittenFile, str]],
    input_digest: InputDigest,
    versions: dict[str, Any],
    options: dict[str, Any],
    nodes: dict[str, Any],
    initializers: dict[str, int],
    shared: set[str] | None = None,
    target: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`shared`: names of files other models of a --share-weights batch reference too; `target`: what the EP
    compiled for (eps.ResolvedEp.target_record: name, provider options, device)."""
    entries = []
    for f, role in files:
        entry: dict[str, Any] = {"name": f.name, "role": role, "size": f.size, "sha256": f.sha256}
        if shared is not None:
            entry["shared"] = f.name in shared
        entries.append(entry)
    return {
        "format": MANIFEST_FORMAT,
        "model": model_name,
        "files": entries,
        "input": input_digest.to_json(),
        "versions": versions,
        "options": options,
        "nodes": nodes,
        "initializers": initializers,
        **({"target": target} if target else {}),
    }


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
