"""Startup time of the CLI: `ortcompile --help`, `--version`, `compile --help` against the 0.25 s target.

    python bench/bench_startup.py [--runs 21] [--json] [--if-changed] [--before TREE]

`--if-changed` adds `compile --if-changed` on an output that is up to date (a tiny model compiled on the CPU EP
once, first), the fast path that must answer from the manifest and a stat cache alone. `--before TREE` runs
every ortcompile command a second time with TREE (a checkout of the package, e.g. `git archive main | tar -x -C
/tmp/base`) first on PYTHONPATH, in the same rounds, so a change is measured against its base under the same load.

Each command runs N times as a fresh process (what a shell, make or CI does), interleaved round-robin so a
burst of load elsewhere on the machine hits every command alike; the median is reported. `python -c pass`
runs in the same rounds as the floor no Python CLI can beat, and `python -c "import onnxruntime"` shows what
an eager import would cost. A last check proves the help paths import neither onnx nor onnxruntime.
Exit status 1 if a help/version median misses the target (a benchmark, not a test: the suite does not run it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 0.25
PY = sys.executable


def cli() -> list[str]:
    script = shutil.which("ortcompile")
    return [script] if script else [PY, "-m", "ortcompile"]


def commands(up_to_date: list[str] | None = None) -> dict[str, list[str]]:
    found = {
        "ortcompile --help": [*cli(), "--help"],
        "ortcompile --version": [*cli(), "--version"],
        "ortcompile compile --help": [*cli(), "compile", "--help"],
        "python -c pass (floor)": [PY, "-c", "pass"],
        "python -c 'import onnxruntime' (eager cost)": [PY, "-c", "import onnxruntime"],
    }
    if up_to_date is not None:
        found["ortcompile compile --if-changed (up to date)"] = [*cli(), "compile", *up_to_date, "--if-changed"]
    return found


def compiled_output(workdir: Path) -> list[str]:
    """A tiny model compiled on the CPU EP into `workdir`: the arguments whose --if-changed run finds it up to date."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = workdir / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(model))
    args = [str(model), "-o", str(workdir / "out"), "--ep", "cpu"]
    subprocess.run([*cli(), "compile", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return args


def time_once(argv: list[str], env: dict[str, str] | None = None) -> float:
    clock = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env)
    return time.perf_counter() - clock


def with_tree(tree: str) -> dict[str, str]:
    """The environment that makes `tree`'s ortcompile package win over the installed one."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([tree, *filter(None, [os.environ.get("PYTHONPATH")])])}


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
    parser.add_argument("--if-changed", action="store_true", help="add compile --if-changed on an up-to-date output")
    parser.add_argument("--before", metavar="TREE", help="also run each ortcompile command with TREE's package (the base)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ortcompile-bench-startup-") as workdir:
        cmds = commands(compiled_output(Path(workdir)) if args.if_changed else None)
        runs = {name: (argv, None) for name, argv in cmds.items()}
        if args.before:
            runs.update({f"{name} [before]": (argv, with_tree(args.before)) for name, argv in cmds.items() if name.startswith("ortcompile")})
        for argv, env in runs.values():  # warm the page cache: the first run of anything reads .pyc files from disk
            time_once(argv, env)
        samples: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.runs):
            for name, (argv, env) in runs.items():
                samples[name].append(time_once(argv, env))
    cmds = {name: argv for name, (argv, _) in runs.items()}
    medians = {name: statistics.median(values) for name, values in samples.items()}
    floor = medians["python -c pass (floor)"]
    heavy = heavy_modules_loaded_by_help()
    gated = [name for name in cmds if name.startswith("ortcompile") and not name.endswith("[before]")]
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
            print(f"  {name:<56} {medians[name]:.3f} s  (min {min(samples[name]):.3f}, "
                  f"{medians[name] - floor:+.3f} s over python -c pass)  {verdict}")
        print(f"  help/version paths import onnx/onnxruntime/numpy: {', '.join(heavy) if heavy else 'no'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
