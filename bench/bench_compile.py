#!/usr/bin/env python3
"""Benchmark ortcompile against `cp` and the raw onnxruntime.ModelCompiler on one model over 2 GB.

Every measurement is a fresh child process run under /usr/bin/time: wall time is taken around it, peak
RSS and user/system CPU are the child's own. Methods run round-robin (rotated every repetition) so drift
on a shared machine spreads evenly, and medians are reported. Before each measurement the previous output
is deleted, dirty pages are flushed (`sync`), and the bench waits (up to --wait-idle s) for a second in
which the machine is >= 90% idle; with --cold the page cache is then dropped (root), otherwise the source
files are read once so every method starts warm. The "other" column is CPU not charged to the child
during its run (other processes, and kernel writeback of the child's own dirty pages), in cores.

    python bench/bench_compile.py                        # generate a 2.4 GB model, 5 reps, warm cache
    python bench/bench_compile.py model.onnx --reps 3 --cold --json results.json
    python bench/bench_compile.py --qnn                  # also QNN (~45 s and ~10 GiB per run)
    python bench/bench_compile.py --breakdown            # where ortcompile's extra time goes

Python children find their bytecode in <workdir>/pycache (PYTHONPYCACHEPREFIX), as an installed package has it:
with PYTHONDONTWRITEBYTECODE set (as on the project's machines), each run compiled ortcompile's sources again
(~0.2-0.3 CPU s of start-up, measured). --no-bytecode-cache measures that way. Every Python method (raw*, ortcompile*,
with --qnn theirs too) runs once unmeasured before the first repetition: its bytecode, and the repeated compile's cache.

Methods:
  cp              cp <model> <model>.data <fresh dir>/   (GNU cp: in-kernel copy_file_range; the floor)
  cp+sync         the same, then fsync of every copy     (cp with ortcompile's durability)
  raw             ModelCompiler(external_initializers_file_path=...).compile_to_file on the CPU EP
  raw+sync        the same, then fsync of every output       (raw with ortcompile's durability)
  ortcompile      python -m ortcompile compile --ep cpu --json; its data pass time is timings.data_pass
                  (time inside ORT's initializer callbacks; timings.compile with older versions). A repeated
                  compile: the inputs' sha256 cache (XDG_CACHE_HOME) is the bench's own, filled by one unmeasured
                  compile before the first run, so the source is not hashed again (output/hashcache.py)
  ortcompile-first  the same as a first compile of the source: an empty XDG_CACHE_HOME for every run, so the
                  source's sha256 is computed (a second full pass over its bytes beside the output's)
  raw-qnn, ortcompile-qnn     the same with the QNN EP (--qnn)
  --breakdown adds ortcompile with parts switched off by monkeypatching in the child (measurement only):
  ortcompile-nodigest (no input sha256), -nohash (no output sha256), -nofsync, -floor (none of the three),
  and with --qnn: ortcompile-qnn-nodigest, ortcompile-qnn-nocallback (never try the EP-context write
  callback, which ORT 1.31 refuses for every EP available here).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20

# argv: SOURCE OUTPUT cpu|qnn [KEY=VALUE ...] (QNN provider options)
RAW_SCRIPT = r"""
import os, sys, time
import onnxruntime as ort
src, out, ep = sys.argv[1:4]
extra = dict(kv.split("=", 1) for kv in sys.argv[4:])  # more QNN provider options, KEY=VALUE
ort.set_default_logger_severity(3)
options = ort.SessionOptions()
if ep == "qnn":
    import onnxruntime_qnn
    ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    options.add_provider_for_devices(devices[:1], {"backend_path": onnxruntime_qnn.get_qnn_htp_path(), **extra})
compiler = ort.ModelCompiler(options, src, embed_compiled_data_into_model=False,
                             external_initializers_file_path=os.path.basename(out) + ".data")
clock = time.perf_counter()
compiler.compile_to_file(out)
print(f"{time.perf_counter() - clock:.3f}")
"""

# ortcompile's CLI with parts of its work switched off, to see what each costs. It patches library
# internals (names as of this writing); a missing name stops the bench with a clear message.
PATCHED_CLI = r"""
import os, sys
from pathlib import Path
off = set(sys.argv[1].split("+"))
sys.argv = ["ortcompile", *sys.argv[2:]]
import ortcompile.compile.compilejob as compiler, ortcompile.compile.datapass as datapass, ortcompile.output.digest as manifest
if "nodigest" in off:  # the input's sha256 (a thread that reads the whole source during the compile)
    def fake_digest(model, files):
        paths = [Path(model), *files]
        return manifest.InputDigest(tuple((p.name, 0, "0" * 64) for p in paths),
                                    tuple({"size": 0, "mtime_ns": 0, "ctime_ns": 0, "ino": 0, "dev": 0} for _ in paths), 0)
    names = [n for n in ("digest_inputs", "digest_inputs_in_background") if hasattr(compiler, n)]
    assert names, "ortcompile.compile.compilejob has no digest_inputs*: update the bench"
    for name in names:
        setattr(compiler, name, fake_digest)
if "nohash" in off:  # sha256 of the files ortcompile writes (data pass and graph pass)
    class NoHash:
        def update(self, data): pass
        def hexdigest(self): return "0" * 64
        def copy(self): return self
    class FakeHashlib:
        @staticmethod
        def sha256(*args): return NoHash()
    assert hasattr(datapass, "hashlib"), "ortcompile.compile.datapass does not use hashlib: update the bench"
    datapass.hashlib = FakeHashlib
if "nofsync" in off:
    os.fsync = lambda fd: None
if "nocallback" in off:  # never try the EP-context write callback (ORT 1.31 refuses it for every EP here)
    import ortcompile.compile.ortstep as ortstep
    if hasattr(ortstep, "_CALLBACK_SUPPORT"):  # since 41ff2b6: asked once with a one-node probe
        ortstep._CALLBACK_SUPPORT["QNNExecutionProvider"] = False
    else:  # before: a first attempt with the whole model
        assert hasattr(ortstep, "_CALLBACK_UNSUPPORTED_EPS"), "ortcompile.compile.ortstep changed: update the bench"
        ortstep._CALLBACK_UNSUPPORTED_EPS.add("QNNExecutionProvider")
from ortcompile.cli import main
main()
"""

# A run is "quiet" when CPU not charged to it stayed under this many cores (the kernel's writeback of the
# run's own dirty pages counts too, so 0 is not expected).
QUIET_OTHER = 0.35

BREAKDOWN = ["ortcompile-nodigest", "ortcompile-nohash", "ortcompile-nofsync", "ortcompile-floor"]
BREAKDOWN_QNN = ["ortcompile-qnn-nodigest", "ortcompile-qnn-nocallback"]
VARIANT_ALIASES = {"floor": "nodigest+nohash+nofsync"}


@dataclass
class Sample:
    method: str
    rep: int
    wall: float
    peak_rss: int  # bytes
    user: float
    sys: float
    other: float  # CPU not charged to the child during its run, in cores
    idle_before: float  # idle fraction of the second before it started
    detail: dict[str, Any] = field(default_factory=dict)  # e.g. ortcompile's own timings


def _cpu_jiffies() -> tuple[int, int]:
    """(total, idle) jiffies over all CPUs since boot."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    return sum(values), values[3] + values[4]


def idle_fraction(seconds: float = 1.0) -> float:
    total0, idle0 = _cpu_jiffies()
    time.sleep(seconds)
    total1, idle1 = _cpu_jiffies()
    return (idle1 - idle0) / max(1, total1 - total0)


def wait_until_idle(limit: float, threshold: float = 0.9) -> float:
    """Wait up to `limit` s for a second in which the machine is >= `threshold` idle; return the last fraction."""
    deadline = time.monotonic() + limit
    fraction = idle_fraction()
    while fraction < threshold and time.monotonic() < deadline:
        fraction = idle_fraction()
    return fraction


def run_child(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int, float, float, float, str, str, int]:
    """Run one child under /usr/bin/time: (wall, peak RSS bytes, user, sys, other cores, stdout, stderr, exit code).

    Peak RSS comes from /usr/bin/time (a small C parent): the ru_maxrss of a child forked straight from this
    Python process starts at this process's own high-water mark (exec keeps it), which would hide the real
    peak of small children such as cp.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile("r") as timing:
        total0, idle0 = _cpu_jiffies()
        clock = time.perf_counter()
        code = subprocess.call(["/usr/bin/time", "-q", "-o", timing.name, "-f", "%M %U %S", *argv], stdout=out, stderr=err, env=env)
        wall = time.perf_counter() - clock
        total1, idle1 = _cpu_jiffies()
        fields = timing.read().split()
        rss_kib, user, system = int(fields[-3]), float(fields[-2]), float(fields[-1])
        busy = ((total1 - total0) - (idle1 - idle0)) / ticks
        other = max(0.0, busy - user - system) / wall
        out.seek(0)
        err.seek(0)
        return wall, rss_kib * 1024, user, system, other, out.read().decode(errors="replace"), err.read().decode(errors="replace"), code


def prepare(cold: bool, warm_files: list[Path], wait_idle: float) -> tuple[str, float]:
    """Flush dirty pages, wait for a quiet machine, then drop (--cold) or warm the page cache."""
    subprocess.run(["sync"], check=True)
    idle = wait_until_idle(wait_idle) if wait_idle > 0 else float("nan")
    if cold:
        try:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            return "cold", idle
        except OSError as exc:
            print(f"bench: cannot drop the page cache ({exc}); measuring warm", file=sys.stderr)
    for path in warm_files:
        with open(path, "rb", buffering=0) as stream:
            while stream.read(64 * MiB):
                pass
    return "warm", idle


def command(method: str, model: Path, data_files: list[Path], target: Path) -> list[str]:
    if method == "cp":
        return ["cp", str(model), *map(str, data_files), str(target) + "/"]
    if method == "cp+sync":  # fsync every copy, as ortcompile fsyncs what it writes
        return ["sh", "-c", 'd="$1"; shift; cp "$@" "$d"/ && cd "$d" && sync ./* .', "sh", str(target), str(model), *map(str, data_files)]
    ep = "qnn" if method.endswith("-qnn") else "cpu"
    if method.startswith("raw"):
        raw = [sys.executable, "-c", RAW_SCRIPT, str(model), str(target / (model.stem + "_ctx.onnx")), ep]
        if method.startswith("raw+sync"):  # raw never syncs: charge it the writeback ortcompile pays with its fsyncs
            return ["sh", "-c", 'd="$1"; shift; "$@" && cd "$d" && sync ./* .', "sh", str(target), *raw]
        return raw
    variant = method.removesuffix("-first").removeprefix("ortcompile").removeprefix("-").removeprefix("qnn").removeprefix("-")
    ep = "qnn" if method.startswith("ortcompile-qnn") else ep
    cli = ["compile", str(model), "-o", str(target), "--ep", ep, "--json"]
    if variant:  # e.g. ortcompile-nodigest, ortcompile-qnn-nocallback+nodigest
        return [sys.executable, "-c", PATCHED_CLI, VARIANT_ALIASES.get(variant, variant), *cli]
    return [sys.executable, "-m", "ortcompile", *cli]


def child_env(method: str, work: Path, bytecode: bool) -> dict[str, str]:
    """The child's environment: bytecode from the bench's own cache (as installed), and the inputs' hash cache:
    the bench's own, kept across runs (a repeated compile), or empty for every run (ortcompile-first)."""
    env = dict(os.environ)
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    cache = work / "hashcache"
    if method.endswith("-first"):
        shutil.rmtree(work / "hashcache-first", ignore_errors=True)
        cache = work / "hashcache-first"
    cache.mkdir(parents=True, exist_ok=True)
    env["XDG_CACHE_HOME"] = str(cache)
    return env


def measure(method: str, rep: int, model: Path, data_files: list[Path], work: Path, idle: float, bytecode: bool = True) -> Sample:
    target = work / "out"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    wall, rss, user, system, other, stdout, stderr, code = run_child(command(method, model, data_files, target), child_env(method, work, bytecode))
    if code != 0:
        raise SystemExit(f"bench: {method} failed with exit {code}:\n{stderr[-3000:]}")
    detail: dict[str, Any] = {}
    if method.startswith("raw"):
        detail["compile_to_file"] = float(stdout.strip().splitlines()[-1])
    elif method.startswith("ortcompile"):
        result = json.loads(stdout)["outputs"][0]
        detail.update(result["timings"])
        detail["reported_peak_rss"] = result["peak_rss_bytes"]
        detail["files"] = {f["name"]: f["size"] for f in result["files"]}
    detail["output_bytes"] = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    shutil.rmtree(target, ignore_errors=True)
    return Sample(method, rep, wall, rss, user, system, other, idle, detail)


def source_files(model: Path) -> list[Path]:
    import onnx

    proto = onnx.load_model(str(model), load_external_data=False)
    locations = {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}
    return sorted(model.parent / loc for loc in locations)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(samples: list[Sample]) -> dict[str, dict[str, Any]]:
    methods: dict[str, list[Sample]] = {}
    for sample in samples:
        methods.setdefault(sample.method, []).append(sample)
    table = {}
    for method, group in methods.items():
        quiet = [s for s in group if s.other <= QUIET_OTHER] or group
        row: dict[str, Any] = {
            "n": len(group),
            "wall": median([s.wall for s in group]),
            "n_quiet": len(quiet) if quiet is not group else 0,
            "wall_quiet": median([s.wall for s in quiet]),
            "wall_min": min(s.wall for s in group),
            "wall_max": max(s.wall for s in group),
            "peak_rss_mib": median([s.peak_rss / MiB for s in group]),
            "user": median([s.user for s in group]),
            "sys": median([s.sys for s in group]),
            "other": median([s.other for s in group]),
        }
        for key in ("compile_to_file", "read", "compile", "data_pass", "graph_pass", "publish"):
            values = [s.detail[key] for s in group if key in s.detail]
            if values:
                row[key] = median(values)
                row[key + "_min"] = min(values)
                row[key + "_quiet"] = median([s.detail[key] for s in quiet])
        table[method] = row
    return table


def ratios(table: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The issue's targets, on medians of all runs, medians of quiet runs, and minima (noise only adds time)."""
    out: dict[str, float] = {}
    for stat, suffix_key in (("median", ""), ("quiet median", "_quiet"), ("min", "_min")):
        wall = "wall" + suffix_key
        for ep in ("", "-qnn"):
            ours, raw = table.get("ortcompile" + ep), table.get("raw" + ep)
            if ours and raw:
                out[f"ortcompile{ep} / raw{ep} wall, {stat} (target <= 1.05)"] = ours[wall] / raw[wall]
        for name in ("ortcompile", "ortcompile-first"):
            for base, goal in (("raw+sync", "1.0"), ("cp+sync", "1.5")):
                if name in table and base in table:
                    out[f"{name} / {base} wall, {stat} (target <= {goal})"] = table[name][wall] / table[base][wall]
        ours = table.get("ortcompile")
        key = "data_pass" if ours and "data_pass" in ours else "compile"  # timings.data_pass: newer ortcompile
        for base in ("cp", "cp+sync"):
            if ours and base in table and key + suffix_key in ours:
                target = " (target <= 1.0)" if base == "cp" else ""
                out[f"data pass (timings.{key}) / {base} wall, {stat}{target}"] = ours[key + suffix_key] / table[base][wall]
    for ep in ("", "-qnn"):
        ours, raw = table.get("ortcompile" + ep), table.get("raw" + ep)
        if ours and raw:
            out[f"ortcompile{ep} - raw{ep} peak RSS, MiB, median (target <= +64)"] = ours["peak_rss_mib"] - raw["peak_rss_mib"]
    return out


def print_table(table: dict[str, dict[str, Any]], extra: dict[str, float], header: str) -> None:
    print(header)
    print(f"{'method':<20} {'n':>2} {'wall s':>7} {'quiet (n)':>10} {'min-max':>13} {'peak RSS MiB':>12} {'user s':>7} {'sys s':>6} "
          f"{'other':>5}  inner timings (median s)")
    for method, row in table.items():
        inner = ", ".join(f"{k} {row[k]:.2f}" for k in ("compile_to_file", "read", "compile", "data_pass", "graph_pass", "publish") if k in row)
        print(f"{method:<20} {row['n']:>2} {row['wall']:>7.2f} {row['wall_quiet']:>6.2f} ({row['n_quiet']}) "
              f"{row['wall_min']:>6.2f}-{row['wall_max']:<6.2f} {row['peak_rss_mib']:>12.0f} {row['user']:>7.2f} {row['sys']:>6.2f} "
              f"{row['other']:>5.2f}  {inner}")
    for name, value in extra.items():
        print(f"  {name}: {value:.3f}")


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
        with open("/proc/meminfo") as meminfo:
            info["mem_gib"] = round(int(next(line.split()[1] for line in meminfo if line.startswith("MemTotal"))) / (1 << 20), 1)
    except (OSError, StopIteration):
        pass
    try:
        head = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10)
        info["ortcompile_commit"] = head.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import onnxruntime

        info["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    return info


def markdown_table(table: dict[str, dict[str, Any]]) -> str:
    lines = ["| method | n | wall s, median | quiet median (n) | min–max | peak RSS MiB | user s | sys s | other cores | inner timings, median s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for method, row in table.items():
        inner = ", ".join(f"{k} {row[k]:.2f}" for k in ("compile_to_file", "compile", "data_pass", "graph_pass", "publish") if k in row)
        lines.append(f"| {method} | {row['n']} | {row['wall']:.2f} | {row['wall_quiet']:.2f} ({row['n_quiet']}) | "
                     f"{row['wall_min']:.2f}–{row['wall_max']:.2f} | {row['peak_rss_mib']:.0f} | {row['user']:.2f} | {row['sys']:.2f} | "
                     f"{row['other']:.2f} | {inner} |")
    return "\n".join(lines)


def resummarize(path: str, markdown: bool = False) -> None:
    """Print the table again from a --json file (e.g. after changing the summary), or as Markdown."""
    saved = json.loads(Path(path).read_text())
    samples = [Sample(**s) for s in saved["samples"]]
    table = summarize(samples)
    if markdown:
        print(markdown_table(table))
        for name, value in ratios(table).items():
            print(f"- {name}: **{value:.2f}**")
        return
    print_table(table, ratios(table), f"{saved['model']}: {saved['model_bytes'] / 1e9:.2f} GB, page cache {saved['cache']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="an ONNX model with external data; default: generate a 2.4 GB one")
    parser.add_argument("--kind", choices=["qnn", "cpu"], default="qnn",
                        help="generated model: 3 QNN-sized partitions of 768 MiB (default; also runs --qnn) or the odd-sized CPU chain")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each measurement (needs root)")
    parser.add_argument("--qnn", action="store_true", help="also raw-qnn and ortcompile-qnn (~45 s and ~10 GiB each)")
    parser.add_argument("--qnn-reps", type=int, default=2)
    parser.add_argument("--methods", default="cp,cp+sync,raw,ortcompile", help="comma-separated methods (see above)")
    parser.add_argument("--breakdown", action="store_true", help="add the ortcompile variants with parts switched off")
    parser.add_argument("--wait-idle", type=float, default=60.0, help="wait up to this many s for an idle machine before each run (0: don't)")
    parser.add_argument("--no-bytecode-cache", dest="bytecode", action="store_false",
                        help="leave PYTHONDONTWRITEBYTECODE as it is: Python children compile ortcompile's sources at every start")
    parser.add_argument("--workdir", help="outputs (and a generated model) go here; default: a temp dir, removed after")
    parser.add_argument("--keep-model", action="store_true", help="keep (and reuse) the generated model in --workdir")
    parser.add_argument("--json", dest="json_path", help="write every sample and the summary here")
    parser.add_argument("--summarize", metavar="JSON", help="only print the summary of an earlier --json file")
    parser.add_argument("--markdown", action="store_true", help="with --summarize: as a Markdown table")
    args = parser.parse_args()
    if args.summarize:
        resummarize(args.summarize, args.markdown)
        return

    work = Path(args.workdir or tempfile.mkdtemp(prefix="ortcompile-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    generated = None
    try:
        if args.model:
            model = Path(args.model).resolve()
        else:
            sys.path.insert(0, str(REPO / "tests"))
            from bigmodel import write_cpu_model, write_qnn_model

            name = f"big{args.kind}"
            model = work / "src" / f"{name}.onnx"
            if not (args.keep_model and model.exists()):
                generated = (write_qnn_model if args.kind == "qnn" else write_cpu_model)(work / "src", name=name)
                print(f"generated {model} ({generated.total_bytes / 1e9:.2f} GB) in {generated.seconds:.1f}s", flush=True)
        commit_at_start = machine().get("ortcompile_commit")
        data_files = source_files(model)
        model_bytes = model.stat().st_size + sum(p.stat().st_size for p in data_files)
        methods = [m for m in args.methods.split(",") if m] + (BREAKDOWN if args.breakdown else [])
        plan = []
        for rep in range(args.reps):
            plan += [(rep, m) for m in methods[rep % len(methods):] + methods[: rep % len(methods)]]
        if args.qnn:
            for rep in range(args.qnn_reps):
                qnn_methods = ["raw-qnn", "ortcompile-qnn", *(BREAKDOWN_QNN if args.breakdown else [])]
                plan += [(rep, m) for m in qnn_methods[rep % len(qnn_methods):] + qnn_methods[: rep % len(qnn_methods)]]
        samples: list[Sample] = []
        state = "warm"
        for method in dict.fromkeys(m for _, m in plan if m.startswith(("ortcompile", "raw"))):
            measure(method, -1, model, data_files, work, float("nan"), args.bytecode)  # unmeasured: bytecode, hash cache
        for rep, method in plan:
            state, idle = prepare(args.cold, [model, *data_files], args.wait_idle)
            sample = measure(method, rep, model, data_files, work, idle, args.bytecode)
            samples.append(sample)
            inner = {k: round(v, 2) for k, v in sample.detail.items() if isinstance(v, float)}
            print(f"rep {rep} {method:<20} {sample.wall:7.2f}s {sample.peak_rss / MiB:7.0f} MiB  user {sample.user:5.2f} sys {sample.sys:5.2f} "
                  f"other {sample.other:4.2f}  idle-before {idle:4.2f}  {state}  {inner}", flush=True)
        table = summarize(samples)
        extra = ratios(table)
        print()
        print_table(table, extra, f"{model.name}: {model_bytes / 1e9:.2f} GB, {len(data_files)} data file(s), page cache {state}, "
                                  f"medians of {args.reps} (QNN: {args.qnn_reps if args.qnn else 0})")
        info = machine()
        if info.get("ortcompile_commit") != commit_at_start:
            print(f"bench: WARNING: the repository moved from {commit_at_start} to {info.get('ortcompile_commit')} during the run")
        if args.json_path:
            Path(args.json_path).write_text(json.dumps({
                "model": str(model), "model_bytes": model_bytes, "cache": state, "machine": info, "commit_at_start": commit_at_start,
                "argv": sys.argv[1:], "samples": [asdict(s) for s in samples], "summary": table, "ratios": extra,
            }, indent=2) + "\n")
    finally:
        if generated is not None and not args.keep_model:
            generated.remove()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
