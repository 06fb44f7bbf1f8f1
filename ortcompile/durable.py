"""Writing files that survive a crash or a power loss: the one way ortcompile does it.

Two shapes. A new file in a stage (`write_new`, `new_file`, `new_fd` + `close_synced`): created exclusively
(never over anything), fsynced before its caller renames it into place. A file replaced in place
(`replace_file`): written beside it under a temporary name, fsynced, renamed over it, and the directory fsynced,
so it exists complete or not at all. `fsync_dir` makes renames in a directory durable. A leaf: imports nothing
of ortcompile, so every floor may use it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def fsync_dir(directory: Path) -> None:
    """Make the renames and creations in `directory` durable (its entries, not the files' bytes)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def new_file(path: Path, text: bool = False) -> Iterator[IO[Any]]:
    """A stream on a file created exclusively at `path`, flushed and fsynced when the block ends without error
    (streaming writers: the EP's blob callback, the journal)."""
    with open(path, "x" if text else "xb") as stream:
        yield stream
        stream.flush()
        os.fsync(stream.fileno())


def write_new(path: Path, content: bytes | str) -> None:
    """Create `path` exclusively with `content` and fsync it (text as the platform's default encoding)."""
    with new_file(path, text=isinstance(content, str)) as stream:
        stream.write(content)


def new_fd(path: Path) -> int:
    """A raw descriptor on a file created exclusively (for writers that need os.write and copy_file_range)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)


def close_synced(fd: int) -> None:
    """Fsync then close a descriptor from `new_fd`."""
    os.fsync(fd)
    os.close(fd)


def replace_file(path: Path, content: bytes | str, pending: Path | None = None, sync: bool = True) -> None:
    """Write `content` beside `path` (at `pending`, default `<name>.tmp`) and rename it over `path`: readers see
    the old file or the new one, whole. With `sync` the bytes and the rename are fsynced first (durable);
    without, only atomic (caches, whose loss costs a recomputation). The temporary file is removed on failure."""
    pending = pending if pending is not None else path.with_name(path.name + ".tmp")
    try:
        with open(pending, "w" if isinstance(content, str) else "wb") as stream:
            stream.write(content)
            if sync:
                stream.flush()
                os.fsync(stream.fileno())
        os.replace(pending, path)
    except BaseException:
        pending.unlink(missing_ok=True)
        raise
    if sync:
        fsync_dir(path.parent)
