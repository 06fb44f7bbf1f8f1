"""Start the disk writing a file's finished windows while later ones are still being written.

Every output is fsynced before it is published. Left alone, the kernel writes a multi-GB data file back only
when that fsync asks (or its dirty-page limits push), so the fsync waits for most of the file after the copy
is done. Asking for writeback of each finished window (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which only
starts it) overlaps the disk with the copy; the final fsync then waits for the tail and the metadata. It is a
hint: where the call is missing (not Linux) or refused, nothing changes but the timing.
"""

from __future__ import annotations

import ctypes
import os

WINDOW = 64 << 20  # bytes written between two writeback requests: large enough to keep requests few
_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h: start writeback of dirty pages in the range, do not wait


def _load_sync_file_range() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own C library (find_library would run ldconfig)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    call.restype = ctypes.c_int
    return call


_sync_file_range = _load_sync_file_range() if os.uname().sysname == "Linux" else None


class WriteBehind:
    """Tracks how far a file written front to back has been handed to the disk."""

    def __init__(self, fd: int, window: int = WINDOW) -> None:
        self._fd = fd
        self._window = window
        self._started = 0  # bytes [0, _started) have had their writeback started
        self._enabled = _sync_file_range is not None

    def advance(self, position: int) -> None:
        """The file now holds `position` bytes: start writing back each complete window not yet started."""
        if not self._enabled or position - self._started < self._window:
            return
        if _sync_file_range(self._fd, self._started, position - self._started, _SYNC_FILE_RANGE_WRITE) != 0:
            self._enabled = False  # e.g. a filesystem that refuses it: fsync alone still makes the file durable
            return
        self._started = position
