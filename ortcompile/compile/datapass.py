"""Pass 1: stream initializers into aligned external data files while ONNX Runtime compiles.

ONNX Runtime calls `location_func` once per initializer left in the output graph, in name order, with a
zero-copy view of the tensor that is valid only during the call. Each tensor is written once, in
order, and hashed on the other core while it is written, so the manifest costs no second read.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from ortcompile.durable import close_synced, new_fd
from ortcompile.layout import DataLayout, Placement
from ortcompile.naming import data_file_name
from ortcompile.onnxfacts import element_count
from ortcompile.output.digest import WrittenFile, hash_file_range
from ortcompile.output.writeback import WriteBehind

CHUNK = 16 << 20  # bytes per write; hashing of one chunk overlaps the write of the next
KERNEL_COPY_MIN = 1 << 20  # tensors at least this big are copied with copy_file_range when they come from a file
_ZEROS = bytes(1 << 16)

Progress = Callable[[int], None]


class HashingFile:
    """An output file written strictly front to back, hashed in a helper thread as it goes."""

    def __init__(self, path: Path, hasher_pool: ThreadPoolExecutor) -> None:
        self.path = path
        self.name = path.name
        self.position = 0
        self._fd = new_fd(path)
        self._hash = hashlib.sha256()
        self._pool = hasher_pool
        self._write_behind = WriteBehind(self._fd)  # the disk writes while we copy, not all at close()'s fsync

    def pad_to(self, offset: int) -> None:
        while self.position < offset:
            self.write(_ZEROS[: min(len(_ZEROS), offset - self.position)])

    def write(self, data: memoryview | bytes, origin: tuple[int, int] | None = None) -> None:
        """Append `data`; with `origin` (fd, offset) holding the same bytes, copy them inside the kernel."""
        view = memoryview(data).cast("B")
        if origin is not None and len(view) >= KERNEL_COPY_MIN and self._copy_from(origin, view):
            return
        for start in range(0, len(view), CHUNK):
            chunk = view[start : start + CHUNK]
            pending = self._pool.submit(self._hash.update, chunk)  # hashlib releases the GIL
            _write_all(self._fd, chunk)
            pending.result()
            self.position += len(chunk)
            self._write_behind.advance(self.position)

    def _copy_from(self, origin: tuple[int, int], view: memoryview) -> bool:
        """copy_file_range from the source data file (as cp does) while the other core hashes the mapped bytes.

        False, with nothing written, when the kernel or filesystem cannot do it; the caller then writes.
        """
        source_fd, source_offset = origin
        before = self._hash.copy()
        # Hash from the source file through small windows, not ORT's mapping of the whole tensor: touching
        # that would make the largest tensor resident (peak RSS), while the kernel copy needs none of it.
        hashed = self._pool.submit(hash_file_range, self._hash, source_fd, source_offset, len(view))
        done = 0
        try:
            while done < len(view):
                step = min(len(view) - done, CHUNK)  # in steps, so the writeback can start behind the copy
                copied = os.copy_file_range(source_fd, self._fd, step, source_offset + done, self.position + done)
                if copied == 0:
                    raise OSError(errno.EIO, "source data file ended early")
                done += copied
                self._write_behind.advance(self.position + done)
        except OSError as exc:
            hashed.result()
            if done == 0 and exc.errno in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF):
                self._hash = before
                return False
            raise
        hashed.result()
        self.position += len(view)
        os.lseek(self._fd, self.position, os.SEEK_SET)  # copy_file_range with offsets leaves the file position
        return True

    def close(self) -> WrittenFile:
        close_synced(self._fd)
        return WrittenFile(self.path.name, self.position, self._hash.hexdigest())

    def abandon(self) -> None:
        os.close(self._fd)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        written = os.write(fd, data)
        data = data[written:]


class Target(Protocol):
    """One data file being written front to back: on disk (HashingFile) or in memory (MemoryTarget)."""

    name: str

    def pad_to(self, offset: int) -> None: ...

    def write(self, data: memoryview | bytes, origin: tuple[int, int] | None = None) -> None: ...

    def close(self) -> WrittenFile: ...

    def abandon(self) -> None: ...


class FileSink:
    """Data files in a (staging) directory, each hashed while written."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortcompile-hash")

    def open(self, name: str) -> Target:
        return HashingFile(self.directory / name, self._pool)

    def shutdown(self) -> None:
        self._pool.shutdown(cancel_futures=True)


class DataPass:
    """Receives ORT's per-initializer callbacks and lays the bytes out as the layout says."""

    def __init__(self, sink: FileSink | Any, model_file_name: str, layout: DataLayout, progress: Progress | None = None,
                 keep_inline: Callable[[str], bool] | None = None, source_files: dict[str, Path] | None = None):
        self.sink = sink
        self.keep_inline = keep_inline or (lambda name: False)
        self.source_files = source_files or {}  # location as written in the source -> checked path
        self._source_fds: dict[str, int] = {}
        self.seconds = 0.0  # time spent inside the callbacks: the data pass proper
        self.model_file_name = model_file_name
        self.layout = layout
        self.inline_count = 0
        self.external_count = 0
        self.bytes_written = 0
        self._progress = progress
        self._open: Target | None = None
        self._finished: list[WrittenFile] = []

    def location_func(self, name: str, value: Any, source_info: Any) -> Any:
        """The `get_initializer_location_func` given to onnxruntime.ModelCompiler."""
        import onnxruntime as ort

        nbytes = value.tensor_size_in_bytes()
        if value.data_type() == "tensor(string)" or self.layout.is_inline(nbytes) or self.keep_inline(name):
            self.inline_count += 1
            return None
        element_size = max(1, nbytes // max(1, element_count(value.shape())))
        placement = self.place_tensor(name, _tensor_bytes(value, nbytes), element_size, self._origin(source_info, nbytes))
        return ort.OrtExternalInitializerInfo(self.location_of(placement), placement.offset, nbytes)

    def place_tensor(self, name: str, data: memoryview, element_size: int, origin: tuple[int, int] | None = None) -> Placement:
        """Write one external tensor where the layout says (or where an identical one already is); count and time it."""
        start = time.perf_counter()
        placement = self.store(name, data, element_size, origin)
        self.external_count += 1
        self.seconds += time.perf_counter() - start
        return placement

    def location_of(self, placement: Placement) -> str:
        """The data file a placement is in, as the graph names it (relative to the model)."""
        return data_file_name(self.model_file_name, placement.file_index)

    def _origin(self, source_info: Any, nbytes: int) -> tuple[int, int] | None:
        """Where the same bytes sit in a source data file that read_source checked, if they do."""
        if source_info is None or source_info.byte_size != nbytes:
            return None
        path = self.source_files.get(source_info.filepath)
        if path is None:
            return None
        if source_info.filepath not in self._source_fds:
            self._source_fds[source_info.filepath] = os.open(path, os.O_RDONLY)
        return self._source_fds[source_info.filepath], source_info.file_offset

    def store(self, name: str, data: memoryview, element_size: int, origin: tuple[int, int] | None = None) -> Placement:
        """Place and write one tensor's bytes (subclasses may reuse an earlier placement instead)."""
        placement = self.layout.place(name, len(data), element_size)
        self._write(placement, data, origin)
        return placement

    def _write(self, placement: Placement, data: memoryview, origin: tuple[int, int] | None = None) -> None:
        target = self._target_for(placement.file_index)
        target.pad_to(placement.offset)
        target.write(data, origin)
        self.bytes_written += placement.nbytes
        if self._progress:
            self._progress(placement.nbytes)

    def _target_for(self, file_index: int) -> Target:
        name = data_file_name(self.model_file_name, file_index)
        if self._open is not None and self._open.name == name:
            return self._open
        if self._open is not None:
            self._finished.append(self._open.close())
        self._open = self.sink.open(name)
        return self._open

    def finish(self) -> list[WrittenFile]:
        """Close the last file; return every data file written with its size and sha256."""
        if self._open is not None:
            self._finished.append(self._open.close())
            self._open = None
        self._close_sources()
        self.sink.shutdown()
        return list(self._finished)

    def abandon(self) -> None:
        if self._open is not None:
            self._open.abandon()
            self._open = None
        self._close_sources()
        self.sink.shutdown()

    def use_sources(self, source_files: dict[str, Path]) -> None:
        """A batch's next model: its own source data files (locations may repeat across models)."""
        self._close_sources()
        self.source_files = source_files

    def _close_sources(self) -> None:
        for fd in self._source_fds.values():
            os.close(fd)
        self._source_fds.clear()


def _tensor_bytes(value: Any, nbytes: int) -> memoryview:
    """A zero-copy view of an OrtValue's CPU buffer, for every dtype (numpy lacks bfloat16, float8, int4)."""
    if nbytes == 0:
        return memoryview(b"")
    buffer = (ctypes.c_char * nbytes).from_address(value.data_ptr())
    return memoryview(buffer).cast("B")
