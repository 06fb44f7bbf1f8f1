"""Graph capture, for real: the WebGPU plugin EP on Mesa's software Vulkan (lavapipe).

Three different models, all of whose nodes WebGPU takes (graph capture refuses anything else):
- ``mlp``  fixtures/mlp.onnx, x[1,256] -> y[1,256], 3 captured commands;
- ``mlp3`` another MLP with the SAME signature (3 layers, tanh): a session replaying ``mlp``'s commands would
  return a plausible [1,256] tensor, so only the values can tell, and they do (checked below);
- ``conv`` a small conv net, x[1,3,32,32] -> y[1,10], 7 captured commands.
Every output is compared with the same source model on the CPU EP, at every step, with new inputs at every
step (so a replay that ignored the updated input buffer fails too).

ORT's verbose log proves what happens on the device: "CaptureBegin" when a session records its graph,
"ReleaseGraphResources: Releasing N captured command resources" when a captured graph is freed. The plugin
fixes its log level when it is registered, so the log tests run in a child process that asks for level 0
before registering (the CLI's --ort-log-level 0 does the same).

Skips (or fails with ORTCOMPILE_REQUIRE_WEBGPU=1) only when the EP cannot claim an adapter here: see webgpu_env.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import webgpu_env  # noqa: F401  (sets the WebGPU environment at import, before any test registers the EP)
from helpers import FIXTURES, assert_one_line_error
from onnx import TensorProto, helper, numpy_helper
from test_residency import MiB, PoolAudit, Step, run_plan, trim_heap, warm_up

from ortcompile.bench.residency import SessionPool

WEBGPU = "WebGpuExecutionProvider"
# RSS margin on WebGPU (lavapipe: "device" memory is host memory, so it is in RSS): with a warm EP, the worst
# "RSS - baseline - resident footprints" measured at any step was 9 MiB (shader pipelines and Dawn caches
# that outlive a session). 32 MiB leaves room; the pool's own footprints here are 0.1-12 MiB per model.
MARGIN = 32 * MiB
COMMANDS = {"mlp": 3, "mlp3": 6, "conv": 7}  # captured command resources per model (ORT's release log line)
CAPTURE_LINE = re.compile(r"CaptureBegin")
RELEASE_LINE = re.compile(r"ReleaseGraphResources: Releasing (\d+) captured command resources")


@pytest.fixture(autouse=True)
def webgpu(request: pytest.FixtureRequest) -> None:
    if getattr(request.function, "needs_webgpu", True):
        webgpu_env.require_webgpu()


# ---------------------------------------------------------------- models

def _mlp3(path: Path) -> None:
    rng = np.random.default_rng(21)
    inits, nodes, current = [], [], "x"
    for i in range(3):
        inits += [numpy_helper.from_array((rng.standard_normal((256, 256)) / 16).astype(np.float32), f"W{i}"),
                  numpy_helper.from_array((rng.standard_normal(256) * 0.1).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [current, f"W{i}"], [f"m{i}"]), helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Tanh", [f"a{i}"], [f"t{i}" if i < 2 else "y"])]
        current = f"t{i}"
    _save(path, "mlp3", nodes, inits, [1, 256], [1, 256])


def _conv(path: Path) -> None:
    rng = np.random.default_rng(11)

    def t(shape: tuple[int, ...], scale: float, name: str) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [t((8, 3, 3, 3), 0.3, "k1"), t((8,), 0.1, "c1"), t((16, 8, 3, 3), 0.2, "k2"), t((16,), 0.1, "c2"), t((16, 10), 0.3, "wf"), t((10,), 0.1, "bf")]
    nodes = [
        helper.make_node("Conv", ["x", "k1", "c1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("MaxPool", ["b"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "k2", "c2"], ["d"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["d"], ["e"]),
        helper.make_node("GlobalAveragePool", ["e"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"]),
    ]
    _save(path, "conv", nodes, inits, [1, 3, 32, 32], [1, 10])


def _save(path: Path, name: str, nodes: list[Any], inits: list[Any], x: list[int], y: list[int]) -> None:
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ortcompile-tests")
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("webgpu")
    shutil.copyfile(FIXTURES / "mlp.onnx", root / "mlp.onnx")
    _mlp3(root / "mlp3.onnx")
    _conv(root / "conv.onnx")
    return {name: root / f"{name}.onnx" for name in COMMANDS}


def cpu_plan(models: dict[str, Path], sequence: list[str]) -> list[Step]:
    """Inputs and CPU-EP references for every step (new inputs each step), computed before the pool runs."""
    import onnxruntime as ort

    sessions = {n: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for n, p in models.items()}
    steps = []
    for index, name in enumerate(sequence):
        arg = sessions[name].get_inputs()[0]
        feeds = {arg.name: np.random.default_rng(1000 + index).standard_normal(arg.shape).astype(np.float32)}
        steps.append(Step(name, feeds, sessions[name].run(None, feeds)[0].astype(np.float64)))
    del sessions
    trim_heap()
    return steps


def webgpu_pool(models: dict[str, Path], budget: int) -> SessionPool:
    warm_up("webgpu", graph_capture=True)
    pool = SessionPool(budget, "webgpu", graph_capture=True)
    for name, path in models.items():
        pool.add(name, path)
    return pool


def assert_on_webgpu(pool: SessionPool) -> None:
    for name, entry in pool.resident.items():
        assert entry.session.get_providers()[0] == WEBGPU, (name, entry.session.get_providers())


# ---------------------------------------------------------------- in process: outputs and events

def test_models_with_one_signature_give_different_outputs(models: dict[str, Path]) -> None:
    """The premise of the next tests: mlp and mlp3 take and give [1,256], but not the same values."""
    steps = cpu_plan({"mlp": models["mlp"], "mlp3": models["mlp3"]}, ["mlp"])
    import onnxruntime as ort

    other = ort.InferenceSession(str(models["mlp3"]), providers=["CPUExecutionProvider"]).run(None, steps[0].feeds)[0]
    assert other.shape == steps[0].expected.shape
    assert np.max(np.abs(other - steps[0].expected)) > 0.1


def test_pipeline_with_graph_capture_is_correct_every_cycle(models: dict[str, Path]) -> None:
    """Three different models in one process, each captured once, then replayed for 4 cycles with new inputs:
    every output matches the CPU EP, so no session replays another's commands or stale inputs."""
    steps = cpu_plan(models, ["mlp", "mlp3", "conv"] * 4)
    pool = webgpu_pool(models, 1 << 62)
    audit = PoolAudit(pool, MARGIN)
    for step in steps:
        run_plan(audit, [step])
        assert_on_webgpu(pool)
    assert audit.log == [("load", "mlp"), ("capture", "mlp"), ("load", "mlp3"), ("capture", "mlp3"), ("load", "conv"), ("capture", "conv")] + \
        [("hit", "mlp"), ("hit", "mlp3"), ("hit", "conv")] * 3
    assert all(entry.runs == 4 for entry in pool.resident.values())
    pool.close()


@pytest.mark.parametrize("tight", ["one-at-a-time", "between-largest-and-sum"])
def test_tight_budget_evicts_releases_and_recaptures(tight: str, models: dict[str, Path]) -> None:
    """Under a tight budget every reload is followed by a new capture (events checked step by step against the
    LRU model), outputs stay right on every cycle, and memory stays within budget + one model + margin.

    "between": 1.1 x the largest footprint measured in this process (they vary between runs on lavapipe,
    0.1-12 MiB for the conv net), which must be below the sum."""
    steps = cpu_plan(models, ["mlp", "mlp3", "conv"] * 3)
    budget = 1
    if tight == "between-largest-and-sum":
        calibration = webgpu_pool(models, 1)
        for step in steps[:3]:
            calibration.run(step.name, step.feeds)
        footprints = dict(calibration.footprints)
        calibration.close()
        budget = int(1.1 * max(footprints.values()))
        assert max(footprints.values()) < budget < sum(footprints.values()), footprints
    pool = webgpu_pool(models, budget)
    audit = PoolAudit(pool, MARGIN)
    for step in steps:
        run_plan(audit, [step])
        assert_on_webgpu(pool)
    kinds = audit.kinds()
    assert kinds.count("evict") >= 2 and kinds.count("reload") >= 2, audit.log
    # Every load or reload is immediately followed by its capture.
    for (kind, model), (next_kind, next_model) in zip(audit.log, audit.log[1:]):
        if kind in ("load", "reload"):
            assert (next_kind, next_model) == ("capture", model)
    if budget == 1:
        assert kinds.count("evict") == 8 and kinds.count("capture") == 9
    else:
        assert len(pool.resident) < 3
    print(f"budget {budget}: {audit.memory()}; footprints {({k: round(v / MiB, 2) for k, v in pool.footprints.items()})}")
    pool.close()


def test_rebinding_a_captured_session_needs_release(models: dict[str, Path]) -> None:
    """Why release matters, shown with plain onnxruntime: a captured graph replays the buffers it was recorded
    with. Binding new buffers to a captured session is refused by the EP (0.4.0 says so; older builds replayed
    the old buffers silently); after release_captured_graph() the same binding captures again and is right."""
    import onnxruntime as ort

    from ortcompile import eps

    ep = eps.resolve("webgpu", {"enableGraphCapture": "1"})
    options = ort.SessionOptions()
    options.log_severity_level = 3
    ep.configure(options)
    session = ort.InferenceSession(str(models["mlp"]), options)
    cpu = ort.InferenceSession(str(models["mlp"]), providers=["CPUExecutionProvider"])
    x1, x2 = (np.random.default_rng(s).standard_normal((1, 256)).astype(np.float32) for s in (1, 2))

    def bound(x: np.ndarray) -> tuple[Any, Any, Any]:
        binding = session.io_binding()
        x_value = ort.OrtValue.ortvalue_from_numpy(x, "webgpu", 0)
        y_value = ort.OrtValue.ortvalue_from_shape_and_type([1, 256], np.float32, "webgpu", 0)
        binding.bind_ortvalue_input("x", x_value)
        binding.bind_ortvalue_output("y", y_value)
        return binding, x_value, y_value

    first = bound(x1)
    session.run_with_iobinding(first[0])  # captures against x1's and y1's buffers
    np.testing.assert_allclose(first[2].numpy(), cpu.run(None, {"x": x1})[0], rtol=1e-4, atol=1e-4)
    second = bound(x2)
    with pytest.raises(Exception, match="captured with a different IOBinding"):
        session.run_with_iobinding(second[0])
    session.release_captured_graph()
    session.run_with_iobinding(second[0])
    np.testing.assert_allclose(second[2].numpy(), cpu.run(None, {"x": x2})[0], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- ORT's own log: captures and releases

_DRIVER = r"""
import gc, json, os, sys
import numpy as np
import onnxruntime as ort
from ortcompile.native import set_ort_log_level
from ortcompile.bench.residency import SessionPool
set_ort_log_level(False, 0)  # what `bench --ort-log-level 0` does; before the EP is registered: the plugin keeps that level

spec = json.loads(sys.argv[1])
mark = lambda text: os.write(2, f"@@ {text}\n".encode())
cpu = {n: ort.InferenceSession(p, providers=["CPUExecutionProvider"]) for n, p in spec["models"].items()}
pool = SessionPool(spec["budget"], "webgpu", graph_capture=True)
for name, path in spec["models"].items():
    pool.add(name, path)
held, diffs, providers = [], [], set()
for step, name in enumerate(spec["sequence"]):
    arg = cpu[name].get_inputs()[0]
    feeds = {arg.name: np.random.default_rng(step).standard_normal(arg.shape).astype(np.float32)}
    want = cpu[name].run(None, feeds)[0]
    mark(f"step {step} {name} {len(pool.events)}")
    got = pool.run(name, feeds)["y"]
    diffs.append(float(np.max(np.abs(got - want))))
    providers.add(pool.resident[name].session.get_providers()[0])
    if spec["hold"]:
        held.append(pool.resident[name].session)  # keep every session alive: at eviction only an explicit release frees its graph
mark(f"close {len(pool.events)}")
pool.close()
mark(f"drop {len(pool.events)}")
del held
gc.collect()
mark("end")
print(json.dumps({"events": [e.to_json() for e in pool.events], "diffs": diffs, "providers": sorted(providers)}), flush=True)
os._exit(0)
"""


def run_driver(models: dict[str, Path], budget: int, sequence: list[str], hold: bool) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Run the pool in a child with ORT at log level 0; returns its report and the ORT log lines between markers."""
    spec = {"models": {n: str(p) for n, p in models.items()}, "budget": budget, "sequence": sequence, "hold": hold}
    child = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(spec)], capture_output=True, text=True, timeout=300, env=webgpu_env.env())
    assert child.returncode == 0, child.stderr[-3000:]
    segments: dict[str, list[str]] = {"start": []}
    current = "start"
    for line in child.stderr.splitlines():
        if line.startswith("@@ "):
            current = line[3:]
            segments[current] = []
        elif CAPTURE_LINE.search(line) or RELEASE_LINE.search(line):
            segments[current].append(line)
    return json.loads(child.stdout.strip().splitlines()[-1]), segments


def releases(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for line in lines if (m := RELEASE_LINE.search(line))]


def captures(lines: list[str]) -> int:
    return sum(1 for line in lines if CAPTURE_LINE.search(line))


@pytest.mark.parametrize("hold", [True, False], ids=["sessions-held-elsewhere", "pool-owns-sessions"])
def test_every_eviction_releases_its_captured_graph_in_the_ort_log(hold: bool, models: dict[str, Path]) -> None:
    """Budget of one byte: every step evicts the previous model. Between two step markers, ORT must log one
    CaptureBegin per capture event and one "Releasing N captured command resources" per eviction, with N the
    evicted model's command count. With the sessions also held by the caller (so destroying the pool's
    reference frees nothing), only the pool's explicit release_captured_graph() can produce those lines, and
    dropping the held sessions afterwards must release nothing more (already released)."""
    sequence = ["mlp", "mlp3", "conv"] * 2 + ["mlp"]
    report, segments = run_driver(models, 1, sequence, hold)
    assert report["providers"] == [WEBGPU]
    assert max(report["diffs"]) < 1e-4, report["diffs"]
    events = report["events"]
    assert not releases(segments["start"]) and not captures(segments["start"])
    for step, name in enumerate(sequence):
        key = next(k for k in segments if k.startswith(f"step {step} {name} "))
        first = int(key.split()[-1])
        nxt = next(k for k in segments if k.startswith(f"step {step + 1} ") or (step + 1 == len(sequence) and k.startswith("close ")))
        step_events = events[first:int(nxt.split()[-1])]
        evicted = [e["model"] for e in step_events if e["kind"] == "evict"]
        assert evicted == ([] if step == 0 else [sequence[step - 1]])
        assert [e["kind"] for e in step_events][-2:] == ["reload" if step >= 3 else "load", "capture"]
        assert releases(segments[key]) == [COMMANDS[m] for m in evicted], (key, segments[key])
        assert captures(segments[key]) == 1, (key, segments[key])
        assert RELEASE_LINE.search(segments[key][0]) if evicted else True  # the old graph goes before the new one is captured
    close = next(k for k in segments if k.startswith("close "))
    assert releases(segments[close]) == [COMMANDS[sequence[-1]]]  # close() releases the last resident one
    drop = next(k for k in segments if k.startswith("drop "))
    assert releases(segments[drop]) == []  # nothing left to release: every graph was released exactly once
    total = sum(len(releases(lines)) for lines in segments.values())
    assert total == sum(1 for e in events if e["kind"] == "evict") == len(sequence)


# ---------------------------------------------------------------- the CLI

def bench(*args: Any, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ortcompile", "bench", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=webgpu_env.env(**(extra_env or {})))


def test_cli_bench_graph_capture_releases_on_every_eviction(models: dict[str, Path]) -> None:
    """`ortcompile bench ... --graph-capture --memory-budget 1K --ort-log-level 0 --json`: every output right on
    every cycle; the Releasing lines, in order, are the JSON's evictions (N = that model's command count),
    plus one for the session still resident when the run ends; one CaptureBegin per capture."""
    names = ["mlp", "mlp3", "conv"]
    proc = bench(*(models[n] for n in names), "--ep", "webgpu", "--graph-capture", "--cycles", 3, "--memory-budget", "1K",
                 "--ort-log-level", 0, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] and report["graph_capture"] and report["ep"] == WEBGPU and report["memory_budget_bytes"] == 1024
    for stats in report["models"]:
        assert stats["mismatches"] == [] and stats["loads"] == 3 and stats["captures"] == 3 and stats["hits"] == 0
    evictions = [e["model"] for e in report["events"] if e["kind"] == "evict"]
    assert evictions == (names * 3)[:-1]
    assert [e["kind"] for e in report["events"]].count("capture") == 9
    lines = proc.stderr.splitlines()
    assert sum(1 for line in lines if CAPTURE_LINE.search(line)) == 9
    assert releases(lines) == [COMMANDS[m] for m in evictions] + [COMMANDS["conv"]]
    # The device's start-up (~93 MiB on lavapipe) is measured apart, before the baseline, and charged to no
    # model (residency-4: it used to be the first model's footprint, ~100 MiB for a 0.5 MB MLP).
    assert report["ep_startup_rss_bytes"] > 40 * MiB
    evicted_bytes = [e["bytes"] for e in report["events"] if e["kind"] == "evict"]
    largest = max(evicted_bytes + [m["footprint_bytes"] for m in report["models"]])
    assert largest < 40 * MiB, evicted_bytes
    peak = report["pool_peak_rss_bytes"] - report["baseline_rss_bytes"]
    assert peak <= report["memory_budget_bytes"] + largest + MARGIN, (peak, largest)


def test_cli_bench_graph_capture_unlimited_budget_captures_once(models: dict[str, Path]) -> None:
    proc = bench(models["mlp"], models["mlp3"], "--ep", "webgpu", "--graph-capture", "--cycles", 4, "--ort-log-level", 0)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("ep         WebGpuExecutionProvider (graph capture), 4 cycles, budget unlimited")
    assert re.match(r"model      mlp: loads [\d.]+s; run [\d.]+ ms; 3 hits, 0 evictions, 1 capture; footprint .*; ok$", lines[1]), lines[1]
    assert re.match(r"model      mlp3: loads [\d.]+s; run [\d.]+ ms; 3 hits, 0 evictions, 1 capture; footprint .*; ok$", lines[2]), lines[2]
    assert lines[-1] == "result     ok"
    log = proc.stderr.splitlines()
    assert sum(1 for line in log if CAPTURE_LINE.search(line)) == 2
    assert sorted(releases(log)) == sorted([COMMANDS["mlp"], COMMANDS["mlp3"]])  # only at the end of the run


def test_cli_graph_capture_refuses_a_model_with_cpu_nodes() -> None:
    """split.onnx has Mod(fmod) and Sinh, which WebGPU does not take: graph capture cannot work, say so (exit 1)."""
    proc = bench(FIXTURES / "split.onnx", "--ep", "webgpu", "--graph-capture", "--cycles", 1)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("ortcompile:")]
    assert len(error) == 1 and "split: cannot load on WebGpuExecutionProvider" in error[0] and "graph capture" in error[0], proc.stderr


def test_cli_graph_capture_needs_static_output_shapes() -> None:
    proc = bench(FIXTURES / "dynamic.onnx", "--ep", "webgpu", "--graph-capture", "--cycles", 1)
    assert proc.returncode == 2
    error = [line for line in proc.stderr.splitlines() if line.startswith("ortcompile:")]
    assert len(error) == 1 and "symbolic shape" in error[0] and "--fix-dim" in error[0], proc.stderr
    pinned = bench(FIXTURES / "dynamic.onnx", "--ep", "webgpu", "--graph-capture", "--cycles", 2, "--fix-dim", "batch=2", "--json")
    assert pinned.returncode == 0, pinned.stderr
    stats = json.loads(pinned.stdout)["models"][0]
    assert stats["captures"] == 1 and stats["hits"] == 1 and stats["mismatches"] == []


def test_cli_webgpu_quiet_is_silent_and_errors_are_one_line() -> None:
    """Dawn prints two device warnings on stderr; they must not reach a -q run or an error (residency-8)."""
    quiet = bench(FIXTURES / "mlp.onnx", "--ep", "webgpu", "-q", "--cycles", 1)
    assert quiet.returncode == 0
    failing = bench(FIXTURES / "split.onnx", "--ep", "webgpu", "--graph-capture", "--cycles", 1)
    assert failing.returncode == 1
    assert (quiet.stdout, quiet.stderr) == ("", "")
    assert_one_line_error(failing.stderr, "graph capture")


@pytest.mark.parametrize("capture", [False, True], ids=["plain", "graph-capture"])
def test_no_adapter_is_a_one_line_error_not_a_silent_cpu_run(capture: bool) -> None:
    """Mesa's Vulkan hidden (VK_ICD_FILENAMES points at nothing): the EP still lists a device, Dawn finds no
    adapter and ORT's Python layer silently retries on the CPU EP. Before residency-6 bench then ran on the
    CPU and reported WebGPU (exit 0), or aborted in C++ with --graph-capture (SIGABRT)."""
    proc = bench(FIXTURES / "mlp.onnx", "--ep", "webgpu", *(["--graph-capture"] if capture else []), "--cycles", 1,
                 extra_env={"VK_ICD_FILENAMES": "/nonexistent/icd.json"})
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert proc.stdout == ""
    assert_one_line_error(proc.stderr, "webgpu: WebGpuExecutionProvider could not create a session on this machine", "Mesa")


# ---------------------------------------------------------------- the skip / fail contract of webgpu_env

@pytest.mark.parametrize("require", [False, True], ids=["skips", "fails-when-required"])
def test_missing_vulkan_skips_or_fails_when_required(require: bool) -> None:
    """With Mesa's Vulkan hidden, a WebGPU test skips with the reason; with ORTCOMPILE_REQUIRE_WEBGPU=1 it fails."""
    extra = {"VK_ICD_FILENAMES": "/nonexistent/icd.json", webgpu_env.REQUIRE_ENV: "1" if require else "0"}
    target = f"{Path(__file__).resolve()}::test_models_with_one_signature_give_different_outputs"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", target], capture_output=True, text=True,
                          timeout=300, env=webgpu_env.env(**extra), cwd=Path(__file__).resolve().parent.parent)
    # Without the webgpu extra (the README's install), the reason is the missing package; with it, the adapter.
    reason = "no adapter" if importlib.util.find_spec("onnxruntime_ep_webgpu") else "onnxruntime-ep-webgpu is not installed"
    if require:
        assert proc.returncode == 1, proc.stdout
        assert "1 error" in proc.stdout and "ORTCOMPILE_REQUIRE_WEBGPU=1 but the WebGPU EP cannot run here" in proc.stdout, proc.stdout
    else:
        assert proc.returncode == 0, proc.stdout
        assert "1 skipped" in proc.stdout and "WebGPU EP unavailable" in proc.stdout and reason in proc.stdout, proc.stdout


test_missing_vulkan_skips_or_fails_when_required.needs_webgpu = False  # type: ignore[attr-defined]  # it hides Vulkan itself
