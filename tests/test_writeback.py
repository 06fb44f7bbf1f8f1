"""The data pass starts writeback behind the copy (output/writeback.py), and the bytes and digest stay the same."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ortcompile.compile.datapass import HashingFile
from ortcompile.output import writeback
from ortcompile.output.writeback import WriteBehind

MiB = 1 << 20


def test_write_behind_hands_each_finished_window_to_the_disk(tmp_path: Path) -> None:
    """How much it saves is the bench's to say (bench_compile.py, docs/performance.md); here: that every full
    window's writeback was started, and a partial last window is left to the fsync."""
    assert writeback._sync_file_range is not None, "sync_file_range is in every Linux libc"
    block = os.urandom(MiB)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    behind = WriteBehind(fd, window=4 * MiB)
    for step in range(1, 11):
        os.write(fd, block)
        behind.advance(step * MiB)
    os.close(fd)
    assert behind._started == 8 * MiB


def test_hashing_file_bytes_and_digest_are_unchanged_by_the_write_behind(tmp_path: Path) -> None:
    data = os.urandom(70 * MiB + 123)  # more than one window, not a multiple of the chunk
    source = tmp_path / "source.bin"
    source.write_bytes(data)
    with ThreadPoolExecutor(max_workers=1) as pool:
        written = HashingFile(tmp_path / "out.bin", pool)
        written.write(memoryview(data)[: 5 * MiB])  # written by this process
        with open(source, "rb") as stream:  # the rest copied inside the kernel, in steps
            written.write(memoryview(data)[5 * MiB :], origin=(stream.fileno(), 5 * MiB))
        result = written.close()
    assert (tmp_path / "out.bin").read_bytes() == data
    assert result.size == len(data) and result.sha256 == hashlib.sha256(data).hexdigest()
    assert written._write_behind._started >= 64 * MiB
