"""The pre-publish check's cost against the simulator's own single run (issue 22, goal 3).

    python bench/bench_check.py MODEL.onnx [compile options...]      e.g. --fix-dim seq_len=64

1. `ortcompile compile MODEL -o TMP --ep qnn --json OPTIONS` (the check as a user gets it): its `timings`, the
   check's `seconds`, `run_seconds` (one run of the compiled model per input set) and `cpu_seconds` (the worker's
   user + system CPU during the check, every thread);
2. the yardstick, in a fresh process: one plain session on the compiled EPContext model (`ortcompile.load_session`,
   as an application opens it) and one run on the check's seed-0 inputs, wall and process CPU of each;
3. the ratios: the check's CPU and wall over the yardstick's session + one run, in all and per input set.

`compile_tree` is the whole compile's wall and its process tree's user + system CPU (the command, its workers):
what `--verify` costs beside the check (`timings.verify`) is in it. PYTHONPATH chooses the ortcompile measured.

On a shared machine compare the CPU columns; the load average is printed beside each figure.
A benchmark, not a test: the suite does not run it.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

YARDSTICK = r"""
import json, os, resource, sys, time
from pathlib import Path
import ortcompile
from ortcompile.readback.feeds import specs_from_session
from ortcompile.readback.setfeeds import set_feeds

def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

compiled, source, dims = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
c0, t0 = cpu(), time.perf_counter()
session = ortcompile.load_session(compiled)
c1, t1 = cpu(), time.perf_counter()
feeds = set_feeds(source, specs_from_session(session), (0,), dims, {}, False).arrays[0]
c2, t2 = cpu(), time.perf_counter()
session.run(None, feeds)
c3, t3 = cpu(), time.perf_counter()
print(json.dumps({"session_wall": t1 - t0, "session_cpu": c1 - c0, "run_wall": t3 - t2, "run_cpu": c3 - c2,
                  "load": os.getloadavg()[0]}))
"""


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    source, options = Path(argv[0]).absolute(), argv[1:]
    with tempfile.TemporaryDirectory(prefix="bench-check-") as scratch:
        out = Path(scratch) / "out"
        load_before = os.getloadavg()[0]
        tree_cpu, clock = children_cpu(), time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "ortcompile", "compile", str(source), "-o", str(out), "--ep", "qnn", "--json",
                               *options], capture_output=True, text=True, check=False)
        tree = {"wall": round(time.perf_counter() - clock, 2), "cpu": round(children_cpu() - tree_cpu, 2)}
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return proc.returncode
        result = json.loads(proc.stdout)["outputs"][0]
        check = result["check"]
        yard_proc = subprocess.run([sys.executable, "-c", YARDSTICK, result["model"], str(source), json.dumps(check["dims"])],
                                   capture_output=True, text=True, check=True)
        yard = json.loads(yard_proc.stdout.strip().splitlines()[-1])
    sets = len(check["run_seconds"]) or 1
    single_cpu, single_wall = yard["session_cpu"] + yard["run_cpu"], yard["session_wall"] + yard["run_wall"]
    report = {
        "model": source.name, "input_sets": check["input_sets"], "load_during_compile": round(load_before, 1),
        "compile_tree": tree, "timings": result["timings"], "check_seconds": check["seconds"], "run_seconds": check["run_seconds"],
        "check_cpu": check["cpu_seconds"], "yardstick": {k: round(v, 3) for k, v in yard.items()},
        "check_over_single_run": {"cpu": round(check["cpu_seconds"] / single_cpu, 2), "wall": round(result["timings"]["check"] / single_wall, 2)},
        "per_input_set": {"cpu": round(check["cpu_seconds"] / sets / single_cpu, 2),
                          "wall": round(result["timings"]["check"] / sets / single_wall, 2)},
    }
    print(json.dumps(report, indent=1))
    return 0


def children_cpu() -> float:
    """User + system CPU of this process's finished children and theirs (the compile, its workers, their probes)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
