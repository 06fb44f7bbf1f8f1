"""The CPU of the pre-publish check and `--verify` alone, apart from the compile (issue 22, goal 3).

    python bench/bench_check_verify.py MODEL [compile options...]     e.g. --ep qnn --check load --verify

Runs `ortcompile compile MODEL -o TMP --json OPTIONS` in this process (click's CliRunner, as the tests do) with a spy
around `Worker.call` that calls the real one: the check and verify are the worker calls that load or compare
(`run_parity`, `open_for_run`, `localize_in_child`). Their cost is this process's CPU from the first such call to the
last (what the parent does between: the manifest, verify's plan, a re-hash) plus each worker's CPU during them, from
/proc (every thread); a worker first seen in them counts from its start (a fresh worker's imports are its cost).
PYTHONPATH chooses the ortcompile measured; compare trees alternating, and on a shared machine mind the load printed.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers import run_cli  # noqa: E402

from ortcompile.worker import Worker  # noqa: E402

CHECKING = ("run_parity", "open_for_run", "localize_in_child")
TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    seen: set[int] = set()
    calls: list[dict[str, Any]] = []
    window: dict[str, tuple[float, float]] = {}
    real = Worker.call

    def spy(self: Worker, func: Any, *args: Any, doing: str) -> Any:
        pid, checking = self._process.pid, func.__name__ in CHECKING
        if checking and "start" not in window:
            window["start"] = (own_cpu(), time.perf_counter())
        before = process_cpu(pid) if pid in seen or not checking else 0.0
        seen.add(pid)
        clock = time.perf_counter()
        result = real(self, func, *args, doing=doing)
        if checking:
            calls.append({"call": func.__name__, "cpu": round(process_cpu(pid) - before, 2), "wall": round(time.perf_counter() - clock, 2)})
            window["end"] = (own_cpu(), time.perf_counter())
        return result

    Worker.call = spy  # type: ignore[method-assign]
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-check-verify-") as scratch:
        result = run_cli("compile", Path(argv[0]).absolute(), "-o", Path(scratch) / "out", "--json", *argv[1:])
    if result.returncode != 0:
        print(result.stderr, file=sys.stderr)
        return result.returncode
    parent = window["end"][0] - window["start"][0]
    print(json.dumps({"model": Path(argv[0]).name, "options": argv[1:], "load": round(load, 1),
                      "check_and_verify_cpu": round(parent + sum(c["cpu"] for c in calls), 2), "parent_cpu": round(parent, 2),
                      "wall": round(window["end"][1] - window["start"][1], 2), "calls": calls}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
