"""Peak resident memory of a whole process tree, from the OS's accounting (/proc), sampled.

`getrusage(RUSAGE_CHILDREN)` gives the largest single descendant; a partitioned compile runs a parent, worker
children for the parts (several at once with --jobs) and a check child, so what matters is their sum at any
moment. Summing RSS counts shared library pages once per process: an upper bound, the safe side for a limit.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def tree_rss(pid: int) -> int:
    """Summed RSS of `pid` and every descendant now, in bytes."""
    children, total, todo = _children_map(), 0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += int(Path(f"/proc/{current}/statm").read_text().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            pass
        todo += children.get(current, [])
    return total


class TreePeak:
    """Samples tree_rss(pid) every `interval` seconds on a thread until stop(); `peak` is the highest seen."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid, self.interval, self.peak = pid, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self.pid))
            time.sleep(self.interval)
