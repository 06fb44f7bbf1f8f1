#!/usr/bin/env python3
"""Issue 22's moonshot: a 16 GB fp16 Llama-8B-shaped decoder compiled for QNN partition-wise on a 24 GiB machine.

    python bench/bench_moonshot.py --workdir /work/heavy/moon                  # 32 layers: 16.06 GB
    python bench/bench_moonshot.py --workdir /work/heavy/moon --layers 4       # a prefix: time per part first
    python bench/bench_moonshot.py --workdir /work/heavy/moon --pass-through   # + the same model through --ep cpu

The model is bench/bigllama.py's (standard ops, random fp16 weights, static prefill graph: 128 new tokens over a
1024-slot KV cache). Rows, each a fresh process after `sync`, with the process tree's peak RSS (tests/treerss.py):
- `parts`: `ortcompile compile --ep qnn --partition auto --check none --jobs N` (the check is off: the HTP simulator
  cannot hold more than ~4 GB of contexts in one session, docs/performance.md, so no check could open the output);
  prints each part's weights, time and the worker's peak, and the goal: tree peak <= 4 x the largest part + 1 GiB;
- `pass-through` (`--pass-through`): `ortcompile compile --ep cpu` of the same model (default check: a lean load);
  goal: under 1 GiB.
Not a test and not run in CI: the 16 GB row takes tens of minutes and ~50 GB of disk (source, parts, output).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from bench_partition import GiB, measure, ortcompile  # noqa: E402
from bigllama import Shape, write_decoder  # noqa: E402


def model_for(workdir: Path, layers: int) -> Path:
    """The decoder with `layers` layers (written once into `workdir`)."""
    directory = workdir / f"llama-{layers}l"
    path = directory / "llama.onnx"
    if not path.is_file():
        clock = time.perf_counter()
        write_decoder(directory, "llama", Shape(layers=layers))
        print(f"wrote {path}: {_data_bytes(path) / 1e9:.2f} GB in {time.perf_counter() - clock:.0f}s", flush=True)
    return path


def _data_bytes(path: Path) -> int:
    return Path(f"{path}.data").stat().st_size


def _tree_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def parts_row(model: Path, out: Path, jobs: int) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    argv = ortcompile("compile", model, "-o", out, "--ep", "qnn", "--partition", "auto", "--check", "none", "--jobs", jobs, "--json")
    result: dict[str, Any] = {"method": f"parts-j{jobs}", "model_bytes": _data_bytes(model), "load_before": os.getloadavg(), **measure(argv, timeout=6 * 3600)}
    result["load_after"] = os.getloadavg()
    print(f"parts-j{jobs}: rc={result['rc']} wall {result['wall']:.1f}s cpu {result['cpu']:.1f}s peak {result['peak_rss'] / GiB:.2f} GiB "
          f"load {result['load_before'][0]:.1f}->{result['load_after'][0]:.1f} {result['stderr'] if result['rc'] else ''}", flush=True)
    if result["rc"] == 0:
        document = json.loads(result["stdout"])["outputs"][0]
        parts = document["parts"]["parts"]
        result["parts"] = [{k: part[k] for k in ("model", "weight_bytes", "seconds", "peak_rss_bytes", "epcontext_nodes")} for part in parts]
        result["timings"] = document["timings"]
        result["cpu_nodes"] = document["cpu_nodes"]
        result["epcontext_nodes"] = document["epcontext_nodes"]
        result["output_bytes"] = _tree_bytes(out)
        largest = max(part["weight_bytes"] for part in parts)
        result["goal"] = 4 * largest + GiB
        for part in parts:
            print(f"  {part['model']}: {part['weight_bytes'] / GiB:.2f} GiB of weights, {part['seconds']:.1f}s, "
                  f"worker peak {part['peak_rss_bytes'] / GiB:.2f} GiB, {part['epcontext_nodes']} EPContext", flush=True)
        print(f"  {len(parts)} parts, {result['epcontext_nodes']} EPContext + {result['cpu_nodes']} CPU nodes, output "
              f"{result['output_bytes'] / 1e9:.2f} GB; goal 4 x {largest / GiB:.2f} + 1 = {result['goal'] / GiB:.2f} GiB: "
              f"{'met' if result['peak_rss'] <= result['goal'] else 'NOT met'}; timings {document['timings']}", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    return {k: v for k, v in result.items() if k != "stdout"}


def pass_through_row(model: Path, out: Path, check: str) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    result = {"method": f"pass-through --check {check}", "model_bytes": _data_bytes(model), "load_before": os.getloadavg(),
              **measure(ortcompile("compile", model, "-o", out, "--ep", "cpu", "--check", check, "--json"))}
    print(f"{result['method']}: rc={result['rc']} wall {result['wall']:.1f}s cpu {result['cpu']:.1f}s peak {result['peak_rss'] / GiB:.3f} GiB "
          f"(goal < 1 GiB) load {result['load_before'][0]:.1f} {result['stderr'] if result['rc'] else ''}", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    return {k: v for k, v in result.items() if k != "stdout"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="~50 GB free for 32 layers; not /tmp")
    parser.add_argument("--layers", type=int, default=32, help="decoder layers (32: Llama-8B, 16.06 GB; each layer 0.44 GB)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--skip-qnn", action="store_true")
    parser.add_argument("--pass-through", action="store_true", help="also --ep cpu of the same model")
    parser.add_argument("--pass-through-check", default="auto", help="its --check (auto: a load check, at ORT's basic optimization level: the extended "
                        "levels copied fp16 weights to fp32 in memory, ~2 x the weights)")
    parser.add_argument("--keep", action="store_true", help="keep the generated model")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    model = model_for(args.workdir, args.layers)
    rows = []
    if not args.skip_qnn:
        rows.append(parts_row(model, args.workdir / "out-qnn", args.jobs))
    if args.pass_through:
        rows.append(pass_through_row(model, args.workdir / "out-cpu", args.pass_through_check))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    if not args.keep:
        shutil.rmtree(model.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
