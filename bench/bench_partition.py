#!/usr/bin/env python3
"""Benchmark partition-wise compilation (issue 13): peak RSS of the whole process tree and wall time against
model size, the raw onnxruntime.ModelCompiler and a whole-model ortcompile compile measured in the same run.

Models are MatMul/Add chains of [8192 x 8192] fp32 weights (256 MiB each), 3 per QNN partition with a Sinh
(CPU) between partitions (tests/bigmodel.py). Each measurement is a fresh process; its tree's summed RSS is
sampled from /proc every 50 ms (tests/treerss.py), so parts compiled in parallel and check children count.

    python bench/bench_partition.py --sizes 2,4,8 --workdir /tmp/bp           # the table of docs/performance.md
    python bench/bench_partition.py --sizes 4 --jobs-compare                   # --jobs 2 against --jobs 1
    python bench/bench_partition.py --pass-through-gb 12                       # --ep cpu on 12 GB: peak RSS

Methods per size:
  raw           ModelCompiler(...).compile_to_file with the QNN EP and the default target's options, whole model
                (skipped where ~2.6x the model would not fit in memory: it would be killed)
  whole         ortcompile compile --ep qnn --check none (one graph per QNN partition, one worker child)
  parts-j1      ortcompile compile --ep qnn --partition auto --jobs 1 --check none
  parts-j2      the same with --jobs 2 (--jobs-compare)
  load          a fresh process opening the partitioned output in one QNN session (does it load here, at what RSS:
                what the pre-publish check costs)
All compile for ortcompile's default QNN target (sc8380xp, HTP v73: fp16 weights). The models damp their values
before each Sinh so any size stays finite.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from bench_compile import RAW_SCRIPT  # noqa: E402
from bigmodel import write_cpu_model, write_qnn_model  # noqa: E402
from treerss import TreePeak  # noqa: E402

GiB = 1 << 30
QNN_FACTOR = 2.6  # peak RSS of a QNN compile over the model size, default target (fp16 weights); fp32: 3.9
# The raw Compile API (bench_compile.RAW_SCRIPT) with the provider options of ortcompile's default QNN target
# (sc8380xp: HTP v73), so both compile the same thing.
RAW_TARGET_OPTIONS = ["soc_model=60", "htp_arch=73"]
LOAD_SCRIPT = r"""
import sys, time
import onnxruntime as ort, onnxruntime_qnn
ort.set_default_logger_severity(3)
ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
options = ort.SessionOptions()
devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
options.add_provider_for_devices(devices[:1], {"backend_path": onnxruntime_qnn.get_qnn_htp_path()})
clock = time.perf_counter()
session = ort.InferenceSession(sys.argv[1], options)
print(f"{time.perf_counter() - clock:.3f}")
"""


def measure(argv: list[str], timeout: float = 3600) -> dict[str, Any]:
    """One fresh process: wall seconds, CPU seconds of its tree (user + sys of every reaped descendant: comparable
    under load, where wall is not), peak summed RSS of its tree, exit code, its stdout/stderr tails."""
    subprocess.run(["sync"], check=False)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    clock = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with TreePeak(proc.pid) as peak:
        stdout, stderr = proc.communicate(timeout=timeout)
    wall, after = time.perf_counter() - clock, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"wall": wall, "cpu": cpu, "peak_rss": peak.peak, "rc": proc.returncode, "stdout": stdout,
            "stderr": stderr.strip().splitlines()[-1][:300] if stderr.strip() else ""}


def ortcompile(*args: Any) -> list[str]:
    return [sys.executable, "-m", "ortcompile", *map(str, args)]


def qnn_rows(size_gb: int, workdir: Path, jobs_compare: bool, skip_whole_over: float) -> list[dict[str, Any]]:
    groups = max(1, round(size_gb * 1e9 / (3 * 256 * 2**20)))
    directory = workdir / f"qnn{size_gb}"
    clock = time.perf_counter()
    model = write_qnn_model(directory, f"m{size_gb}", partitions=groups, layers_per_partition=3, damping=0.25)
    print(f"{model.path.name}: {model.total_bytes / 1e9:.2f} GB in {groups} QNN partitions, written in {time.perf_counter() - clock:.0f}s",
          flush=True)
    available = _available()
    rows = []

    def run(method: str, argv: list[str], out: Path | None) -> dict[str, Any]:
        result = {"size_gb": round(model.total_bytes / 1e9, 2), "method": method, **measure(argv)}
        if out is not None and result["rc"] == 0 and method.startswith("parts"):
            document = json.loads(result["stdout"])["outputs"][0]
            result["parts"] = len(document["parts"]["parts"])
            result["check"] = document["check"]["mode"] if document["check"] else "none"
            result["timings"] = {k: round(v, 1) for k, v in document["timings"].items()}
        print(f"  {method:9s} rc={result['rc']} wall {result['wall']:7.1f}s peak {result['peak_rss'] / GiB:6.2f} GiB"
              f"{'  ' + result['stderr'] if result['rc'] else ''}{'  parts=' + str(result.get('parts')) if 'parts' in result else ''}",
              flush=True)
        rows.append(result)
        if out is not None:
            shutil.rmtree(out, ignore_errors=True)
        return result

    needs = QNN_FACTOR * model.total_bytes
    if needs < 0.9 * available and model.total_bytes / 1e9 <= skip_whole_over:
        out = directory / "raw"
        out.mkdir()
        run("raw", [sys.executable, "-c", RAW_SCRIPT, str(model.path), str(out / "m_ctx.onnx"), "qnn", *RAW_TARGET_OPTIONS], out)
        run("whole", ortcompile("compile", model.path, "-o", directory / "whole", "--ep", "qnn", "--check", "none", "--json"), directory / "whole")
    else:
        for method in ("raw", "whole"):
            rows.append({"size_gb": round(model.total_bytes / 1e9, 2), "method": method, "rc": None,
                         "skipped": f"needs ~{needs / GiB:.0f} GiB ({QNN_FACTOR}x), {available / GiB:.0f} GiB available"})
            print(f"  {method:9s} skipped: {rows[-1]['skipped']}", flush=True)
    keep = directory / "parts-j1"
    parts = ("--ep", "qnn", "--partition", "auto", "--check", "none", "--json")  # the check is timed on its own: "load"
    run("parts-j1", ortcompile("compile", model.path, "-o", keep, *parts, "--jobs", "1"), None)
    if jobs_compare:
        run("parts-j2", ortcompile("compile", model.path, "-o", directory / "parts-j2", *parts, "--jobs", "2"), directory / "parts-j2")
    if (keep / f"m{size_gb}_ctx.onnx").is_file():
        run("load", [sys.executable, "-c", LOAD_SCRIPT, str(keep / f"m{size_gb}_ctx.onnx")], None)
    shutil.rmtree(directory, ignore_errors=True)
    return rows


def pass_through_row(size_gb: float, workdir: Path) -> dict[str, Any]:
    directory = workdir / f"cpu{size_gb:g}"
    model = write_cpu_model(directory, "big", min_bytes=int(size_gb * 1e9))
    out = directory / "out"
    result = {"size_gb": round(model.total_bytes / 1e9, 2), "method": "pass-through", **measure(ortcompile("compile", model.path, "-o", out,
                                                                                                          "--ep", "cpu", "--json"))}
    print(f"  pass-through {result['size_gb']} GB: rc={result['rc']} wall {result['wall']:.1f}s peak {result['peak_rss'] / GiB:.3f} GiB "
          f"{result['stderr']}", flush=True)
    shutil.rmtree(directory, ignore_errors=True)
    return result


def _available() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,4,8", help="model sizes in GB (comma-separated); empty for none")
    parser.add_argument("--jobs-compare", action="store_true", help="also --jobs 2")
    parser.add_argument("--skip-whole-over", type=float, default=6.0, help="no raw/whole compile above this many GB")
    parser.add_argument("--pass-through-gb", type=float, default=0, help="also a pass-through compile of this many GB")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-partition-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    print(f"{os.cpu_count()} CPUs, {_available() / GiB:.1f} GiB available; work in {workdir}", flush=True)
    for size in [int(s) for s in args.sizes.split(",") if s]:
        rows += qnn_rows(size, workdir, args.jobs_compare, args.skip_whole_over)
    if args.pass_through_gb:
        rows.append(pass_through_row(args.pass_through_gb, workdir))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
