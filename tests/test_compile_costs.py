"""What the whole-model compile spends beyond the raw Compile API (issue 22): the worker's malloc on huge pages, the
sha256 of a file read through mmap windows. Outcomes only (environments, digests): the timings are the bench's
(bench/bench_whole_qnn.py, docs/performance.md)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from ortcompile import zygote
from ortcompile.child import HUGE_PAGES_TUNABLE, huge_page_env
from ortcompile.output.digest import HASH_WINDOW, hash_file
from ortcompile.worker import Worker


def _tunables_and_huge_pages(reporter: object = None) -> tuple[str, int]:
    """In the worker child: its GLIBC_TUNABLES, and the kB of huge pages 256 MiB of fresh malloc memory got."""
    buffer = bytearray(256 << 20)
    buffer[:: 4096] = b"\1" * len(range(0, len(buffer), 4096))  # touch every page
    rollup = Path("/proc/self/smaps_rollup").read_text()
    return os.environ.get("GLIBC_TUNABLES", ""), int(re.search(r"AnonHugePages:\s+(\d+)", rollup).group(1))


THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(), reason="transparent huge pages are off on this machine")
@pytest.mark.parametrize("forked", [False, True], ids=["fresh", "forked"])
def test_the_compile_worker_gets_huge_pages_keeping_the_users_tunables(forked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh, or forked from the zygote (launched with the tunable: glibc reads it at exec, never at a fork)."""
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    with Worker(forked=forked) as worker:
        tunables, huge_kb = worker.call(_tunables_and_huge_pages, doing="allocating")
    assert isinstance(worker._process, zygote.Forked) == forked
    assert tunables == f"glibc.malloc.arena_max=2:{HUGE_PAGES_TUNABLE}"
    assert huge_kb >= 128 << 10  # most of the 256 MiB (4 KiB pages everywhere without the tunable: 0 kB)
    assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"  # the parent's own environment is untouched


def test_a_users_own_huge_page_setting_wins() -> None:
    assert huge_page_env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"
    assert huge_page_env({"PATH": "/bin"}) == {"PATH": "/bin", "GLIBC_TUNABLES": HUGE_PAGES_TUNABLE}


@pytest.mark.parametrize("size", [0, 1, 4096, HASH_WINDOW - 1, HASH_WINDOW, 2 * HASH_WINDOW + 12345])
def test_hash_file_through_mmap_windows_is_the_files_sha256(tmp_path: Path, size: int) -> None:
    path = tmp_path / "f.bin"
    content = (bytes(range(256)) * (size // 256 + 1))[:size]
    path.write_bytes(content)
    written = hash_file(path)
    assert (written.name, written.size, written.sha256) == ("f.bin", size, hashlib.sha256(content).hexdigest())
