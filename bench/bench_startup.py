"""Startup time of the CLI: `ortcompile --help`, `--version`, `compile --help` against the 0.25 s target.

    python bench/bench_startup.py [--runs 21] [--json]

Each command runs N times as a fresh process (what a shell, make or CI does), interleaved round-robin so a
burst of load elsewhere on the machine hits every command alike; the median is reported. `python -c pass`
runs in the same rounds as the floor no Python CLI can beat, and `python -c "import onnxruntime"` shows what
an eager import would cost. A last check proves the help paths import neither onnx nor onnxruntime.
Exit status 1 if a help/version median misses the target (a benchmark, not a test: the suite does not run it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time

TARGET_S = 0.25
PY = sys.executable


def commands() -> dict[str, list[str]]:
    script = shutil.which("ortcompile")
    cli = [script] if script else [PY, "-m", "ortcompile"]
    return {
        "ortcompile --help": [*cli, "--help"],
        "ortcompile --version": [*cli, "--version"],
        "ortcompile compile --help": [*cli, "compile", "--help"],
        "python -c pass (floor)": [PY, "-c", "pass"],
        "python -c 'import onnxruntime' (eager cost)": [PY, "-c", "import onnxruntime"],
    }


def time_once(argv: list[str]) -> float:
    clock = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - clock


HEAVY_CHECK = """
import sys
from ortcompile.cli import main
for args in (["--help"], ["--version"], ["compile", "--help"], ["inspect", "--help"], ["verify", "--help"], ["eps", "--help"]):
    try:
        main(args, standalone_mode=False)
    except SystemExit:
        pass
heavy = sorted(m for m in ("onnx", "onnxruntime", "numpy") if m in sys.modules)
sys.stderr.write(",".join(heavy))
"""


def heavy_modules_loaded_by_help() -> list[str]:
    proc = subprocess.run([PY, "-c", HEAVY_CHECK], capture_output=True, text=True, check=True)
    return [m for m in proc.stderr.strip().split(",") if m]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="runs per command (median reported)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()

    cmds = commands()
    for argv in cmds.values():  # warm the page cache: the first run of anything reads .pyc files from disk
        time_once(argv)
    samples: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(args.runs):
        for name, argv in cmds.items():
            samples[name].append(time_once(argv))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    floor = medians["python -c pass (floor)"]
    heavy = heavy_modules_loaded_by_help()
    gated = [name for name in cmds if name.startswith("ortcompile")]
    ok = all(medians[name] <= TARGET_S for name in gated) and not heavy

    if args.json:
        print(json.dumps({"runs": args.runs, "target_s": TARGET_S,
                          "median_s": {k: round(v, 4) for k, v in medians.items()},
                          "min_s": {k: round(min(v), 4) for k, v in samples.items()},
                          "heavy_modules_loaded_by_help": heavy, "ok": ok}, indent=2))
    else:
        print(f"startup, median of {args.runs} runs each (interleaved), target {TARGET_S:.2f} s")
        for name in cmds:
            verdict = ("ok" if medians[name] <= TARGET_S else "MISSES TARGET") if name in gated else "reference"
            print(f"  {name:<45} {medians[name]:.3f} s  (min {min(samples[name]):.3f}, "
                  f"{medians[name] - floor:+.3f} s over python -c pass)  {verdict}")
        print(f"  help/version paths import onnx/onnxruntime/numpy: {', '.join(heavy) if heavy else 'no'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
