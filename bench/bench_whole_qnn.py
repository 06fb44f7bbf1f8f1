#!/usr/bin/env python3
"""Whole-model QNN compile against the raw Compile API, alternating runs (issue 22: prepare included).

    python bench/bench_whole_qnn.py --gb 1.6 --reps 3                       # raw vs this tree's ortcompile
    python bench/bench_whole_qnn.py --gb 1.6 --reps 2 --also /work/main     # and another tree's ortcompile
    python bench/bench_whole_qnn.py --gb 1.6 --reps 2 --raw-thp             # and raw with the worker's huge pages
    python bench/bench_whole_qnn.py --model common_det.onnx --reps 5       # a static real model instead
    python bench/bench_whole_qnn.py --model common_det.onnx --reps 5 --plain --check-default  # and without --json, and the default check

Model: tests/bigmodel.py's MatMul/Add chain (3 x 256 MiB fp32 weights per QNN partition, a damped Sinh on the
CPU between partitions). `raw` = bench_compile.RAW_SCRIPT (one ModelCompiler.compile_to_file, the default
target's options, no fsync); `ortcompile` = `compile --ep qnn --check none --json` (prepare and fsync of
every output included); `raw+thp` = raw with the environment ortcompile gives its compile worker (glibc's
malloc on transparent huge pages, child.HUGE_PAGES_TUNABLE), so the gain from it is shown apart. Each run is
a fresh process after `sync`; methods rotate every repetition. Prints each run (wall and the tree's user + system
CPU), then medians, ortcompile / raw, and ortcompile's own prepare time (`timings.prepare`).

Each tree's bytecode is compiled first (`compileall`, what `pip install` does): with PYTHONDONTWRITEBYTECODE set
and no __pycache__ (a source checkout here), every ortcompile interpreter compiled ~110 modules from source, ~0.3
CPU s per compile that an installed ortcompile never pays (`--source-only` times it that way). `--plain` also times
each tree without --json (no compatibility verdict: raw gives none); `--check-default` also with the default check.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))  # this tree's constants, whatever the installed package is

from bench_compile import RAW_SCRIPT  # noqa: E402
from bench_partition import RAW_TARGET_OPTIONS, GiB, measure  # noqa: E402
from bigmodel import write_qnn_model  # noqa: E402

from ortcompile.child import HUGE_PAGES_TUNABLE  # noqa: E402


def command(method: str, trees: dict[str, Path], model: Path, out: Path) -> tuple[list[str], dict[str, str]]:
    if method.startswith("raw"):
        env = {"GLIBC_TUNABLES": HUGE_PAGES_TUNABLE} if method == "raw+thp" else {}
        return [sys.executable, "-c", RAW_SCRIPT, str(model), str(out / "m_ctx.onnx"), "qnn", *RAW_TARGET_OPTIONS], env
    tree, _, variant = method.partition(" ")  # "ortcompile", "ortcompile plain", "ortcompile check-default"
    check = [] if variant == "check-default" else ["--check", "none"]
    argv = [sys.executable, "-m", "ortcompile", "compile", str(model), "-o", str(out), "--ep", "qnn", *check, *([] if variant == "plain" else ["--json"])]
    return argv, {"PYTHONPATH": str(trees[tree])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=1.6, help="model size (rounded to 768 MiB partitions)")
    parser.add_argument("--model", type=Path, default=None, help="compile this static model instead of generating one")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--also", type=Path, action="append", default=[], help="another source tree to time (e.g. main)")
    parser.add_argument("--raw-thp", action="store_true", help="also time raw with glibc's malloc on transparent huge pages")
    parser.add_argument("--plain", action="store_true", help="also time each tree without --json (no compatibility verdict)")
    parser.add_argument("--check-default", action="store_true", help="also time each tree with the default check")
    parser.add_argument("--source-only", action="store_true", help="do not compile the trees' bytecode first (as a checkout here runs)")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = (args.workdir or Path(os.environ.get("TMPDIR", "/tmp")) / "bench_whole_qnn").absolute()
    work.mkdir(parents=True, exist_ok=True)
    # `python -m ortcompile` puts the working directory first on sys.path: run from a source tree, every method
    # would import that tree's package whatever PYTHONPATH says (--also compared a tree with itself)
    os.chdir(work)
    groups = max(1, round(args.gb * 1e9 / (3 * 256 * 2**20)))
    given = args.model.absolute() if args.model else None
    model = SimpleNamespace(path=given, total_bytes=given.stat().st_size) if given else \
        write_qnn_model(work / "src", "m", partitions=groups, layers_per_partition=3, damping=0.25)
    trees = {"ortcompile": REPO, **{f"ortcompile@{t.name}": t.resolve() for t in args.also}}
    if not args.source_only:
        for tree in trees.values():
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "ortcompile")], check=True, stdout=subprocess.DEVNULL)
    variants = ["", *([" plain"] if args.plain else []), *([" check-default"] if args.check_default else [])]
    methods = ["raw", *(["raw+thp"] if args.raw_thp else []), *(tree + v for tree in trees for v in variants)]
    print(f"{model.path.name}: {model.total_bytes / 1e9:.2f} GB{'' if given else f', {groups} QNN partitions'}; "
          f"{'bytecode from source' if args.source_only else 'bytecode compiled'}; load {os.getloadavg()[0]:.2f}", flush=True)
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for rep in range(args.reps):
        for method in methods[rep % len(methods):] + methods[: rep % len(methods)]:
            out = work / "out"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            argv, env = command(method, trees, model.path, out)
            os.environ.update(env)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            result = measure(argv)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            # user + system CPU of the run's whole tree (every waited-for descendant): steadier than wall on a loaded machine
            result["cpu"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            for name in env:
                os.environ.pop(name, None)
            if result["rc"] == 0 and not method.startswith("raw") and " plain" not in method:
                result["prepare"] = json.loads(result["stdout"])["outputs"][0]["timings"].get("prepare")
            results[method].append(result)
            print(f"  {method:22s} rc={result['rc']} wall {result['wall']:6.1f}s cpu {result['cpu']:6.1f}s peak {result['peak_rss'] / GiB:5.2f} GiB"
                  f"{'  prepare {:.1f}s'.format(result['prepare']) if result.get('prepare') is not None else ''}"
                  f"  load {os.getloadavg()[0]:.2f}{'  ' + result['stderr'] if result['rc'] else ''}", flush=True)
    raw = statistics.median(r["wall"] for r in results["raw"])
    raw_cpu = statistics.median(r["cpu"] for r in results["raw"])
    for method in methods:
        walls = [r["wall"] for r in results[method]]
        cpus = [r["cpu"] for r in results[method]]
        prepares = [r["prepare"] for r in results[method] if r.get("prepare") is not None]
        print(f"{method:22s} median {statistics.median(walls):6.1f}s ({' '.join(f'{w:.1f}' for w in walls)})  / raw {statistics.median(walls) / raw:.2f}"
              f"  cpu median {statistics.median(cpus):.1f}s / raw {statistics.median(cpus) / raw_cpu:.2f}"
              f"  peak {max(r['peak_rss'] for r in results[method]) / GiB:.2f} GiB"
              f"{f'  prepare median {statistics.median(prepares):.1f}s' if prepares else ''}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
