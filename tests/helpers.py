"""Shared helpers for the small suite: run the CLI, check an output directory, build models, run sessions.

Everything here uses the real onnxruntime and the real QNN EP (its HTP simulator compiles on this CPU).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
STAGE_PREFIX = ".ortcompile-stage-"

# QNN (HTP simulator) vs CPU EP on the compiled fixtures. ortcompile compiles for a named SoC by default
# (eps/targets.py: X Elite, soc_model 60), and for any named SoC the simulator computes as the HTP does: float32
# models run in float16. Measured with 100 seeded standard-normal inputs each: max |QNN - CPU| = 1.55e-3 (mlp,
# dynamic; outputs up to 2.9) and 7e-4 (split, seeds 0-15; seeds 16, 48 and 64 land an fp16-rounded input of its
# CPU-side Mod on a step of the modulus: 0.07-0.16). The worst mlp element uses 31% of the bound below
# (atol + rtol*|ref|): ~3x headroom, while a wrong weight or a dropped partition gives errors of order 1.
# (Without soc_model the simulator computes in float32, 1e-6 noise, but fails most real models.)
QNN_ATOL = 5e-3
QNN_RTOL = 5e-3


# ---------------------------------------------------------------- the CLI
#
# Two ways to run it, one module (tests/genmodels.py re-exports them):
#
# * `run_cli` runs the click group in this process (click's CliRunner): exit code, stdout and stderr as a
#   shell script would get them, without starting Python and importing ONNX Runtime again (~0.4 s a call).
#   The capture is at the file-descriptor level (CliRunner's capture="fd") and the isolated streams report
#   fds 1 and 2 as theirs, so ortcompile's guard that points native output (QNN's printf banners) away from
#   stdout acts on the captured descriptors exactly as in a process, and what native code or a worker child
#   writes to fd 1/2 is in `stdout`/`stderr` too. Fd-level bytes come after the Python-level text of the same
#   stream (the order between the two is not kept).
# * `run_process` / `popen_process` start `python -m ortcompile` (through `run()`, the console entry). Tests use
#   them where the process itself is the subject: signals (SIGINT/SIGTERM handlers exist only in `run()`),
#   kills, crashes of native code, a process's memory or read counters, start-up imports, concurrency
#   between processes, and a process's pid (stage ownership). Each such call says why.
# * `bench` always runs in a fresh process, also through `run_cli`: its report is the memory of the process it runs
#   in (baseline, EP start-up, pool and process peak RSS), which in this process would be pytest's.

# ortcompile's output is what a plain `python -m ortcompile` shows: the interpreter's default warning filters,
# not pytest's (which turn DeprecationWarnings from other libraries on).
_DEFAULT_WARNING_FILTERS = [("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, None),
                            ("ignore", PendingDeprecationWarning, None), ("ignore", ImportWarning, None), ("ignore", ResourceWarning, None)]


@dataclass
class CliResult:
    """What `run_cli` returns: the fields of subprocess.CompletedProcess that tests read."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without ORTCOMPILE_DEBUG, plus `extra`: what a CLI run sees."""
    env = dict(os.environ)
    env.pop("ORTCOMPILE_DEBUG", None)
    env.update(extra or {})
    return env


def run_cli(*args: object, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float | None = None) -> CliResult:
    """`ortcompile ARGS` in this process: see above. `env` replaces the whole environment and `cwd` the working
    directory for the call (both restored after). `timeout` applies to `bench` (a process) only."""
    import warnings

    from click.testing import CliRunner

    from ortcompile.cli import main

    argv = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args]
    if next((a for a in argv if not a.startswith("-")), None) == "bench":  # measures its own process: see above
        proc = run_process(*argv, cwd=cwd, env=env, timeout=timeout or 300)
        return CliResult(argv, proc.returncode, proc.stdout, proc.stderr)
    changes = None if env is None else {**{k: None for k in os.environ if k not in env}, **env}
    saved_cwd = os.getcwd()

    class AsProcess:  # what CliRunner.invoke calls: the group's main, with the isolated streams on fds 1 and 2
        @staticmethod
        def main(**kwargs: Any) -> Any:
            sys.stdout.fileno = lambda: 1  # type: ignore[method-assign]
            sys.stderr.fileno = lambda: 2  # type: ignore[method-assign]
            return main.main(**kwargs)

    try:
        if cwd is not None:
            os.chdir(cwd)
        with warnings.catch_warnings():
            warnings.resetwarnings()
            for action, category, module in reversed(_DEFAULT_WARNING_FILTERS):
                warnings.filterwarnings(action, category=category, module=module or "")
            result = CliRunner(capture="fd").invoke(AsProcess, argv, env=changes, catch_exceptions=False, prog_name="ortcompile")  # type: ignore[arg-type]
    finally:
        os.chdir(saved_cwd)
    return CliResult(argv, result.exit_code, result.stdout, result.stderr)


def run_process(*args: object, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m ortcompile ARGS` in a fresh process, as a shell script runs it (see above for when)."""
    return subprocess.run([sys.executable, "-m", "ortcompile", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False, env=env or cli_env())


def popen_process(*args: object, env: dict[str, str] | None = None, **kwargs: Any) -> subprocess.Popen[str]:
    """`python -m ortcompile ARGS` started in the background, stdout and stderr piped."""
    return subprocess.Popen([sys.executable, "-m", "ortcompile", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env or cli_env(), **kwargs)


_NOT_PROGRESS = ("ortcompile: error:", "ortcompile: warning:", "ortcompile: interrupted")


def signal_while_staging(proc: subprocess.Popen[str], out: Path, staged_glob: str, signum: int, what: str = "the compile") -> tuple[str, str]:
    """Send `signum` to `proc` once pass 1 is writing into a staging directory under `out` (a data file matching
    `staged_glob` past 20 MiB); return its (stdout, stderr). Kills it if it outlives the test."""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            staged = [f for d in out.glob(STAGE_PREFIX + "*") for f in d.glob(staged_glob)]
            if any(f.stat().st_size > 20 << 20 for f in staged if f.exists()):
                break
            time.sleep(0.005)
        assert proc.poll() is None, f"{what} ended before it could be interrupted"
        proc.send_signal(signum)
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def without_progress(stderr: str) -> list[str]:
    """stderr's lines but the progress ones: a stderr that is not a terminal (a pipe, CliRunner's) gets one plain
    `ortcompile: STAGE` line per stage before any error (issue 23: 5)."""
    return [line for line in stderr.splitlines() if line.strip() and (not line.startswith("ortcompile: ") or line.startswith(_NOT_PROGRESS))]


def assert_one_line_error(stderr: str, *needles: str) -> str:
    """A user error: exactly one stderr line, `ortcompile: error: ...`, no traceback (progress lines before it aside); returns the line."""
    assert "Traceback" not in stderr, stderr
    lines = without_progress(stderr)
    assert len(lines) == 1, f"expected one stderr line, got:\n{stderr}"
    assert lines[0].startswith("ortcompile: error:"), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


# ---------------------------------------------------------------- output directories

def snapshot(directory: Path) -> dict[str, bytes] | None:
    """Every entry under `directory` (hidden ones too) with its bytes; None when it does not exist."""
    if not directory.exists():
        return None
    return {
        p.relative_to(directory).as_posix(): (p.read_bytes() if p.is_file() else b"<dir>")
        for p in sorted(directory.rglob("*"))
    }


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_no_junk(directory: Path) -> None:
    """No staging directory and no stray EP blob (`*_qnn*.bin` not listed by a manifest) left behind."""
    names = os.listdir(directory)
    assert not [n for n in names if n.startswith(STAGE_PREFIX)], names
    listed: set[str] = set()
    for manifest in directory.glob("*.manifest.json"):
        listed |= {f["name"] for f in json.loads(manifest.read_text())["files"]}
    assert not [n for n in names if "_qnn" in n and n.endswith(".bin") and n not in listed], names


# ---------------------------------------------------------------- published (content-addressed) names
#
# Every file a compiled graph references is published with the first 12 hex digits of its own sha256 in its name
# (docs/output-layout.md): `split_ctx.onnx.data` as written -> `split_ctx.<digest>.data`, shard `.onnx.data.1` ->
# `.<digest>.data.1`, `m_shared.data` -> `m_shared.<digest>.data`, `split_ctx_qnn.bin` -> `split_ctx_qnn.<digest>.bin`.

DIGEST = re.compile(r"[0-9a-f]{12}")


def addressed_pattern(written: str) -> re.Pattern[str]:
    """The names a file written as `written` may be published under; group 1 is the digest."""
    if data := re.fullmatch(r"(.+?)(?:\.onnx)?\.data(\.[0-9]+)?", written):
        return re.compile(re.escape(data[1]) + r"\.([0-9a-f]{12})\.data" + re.escape(data[2] or ""))
    stem, _, extension = written.rpartition(".")
    return re.compile(re.escape(stem) + r"\.([0-9a-f]{12})\." + re.escape(extension))


def addressed(written: str, sha: str) -> str:
    """The published name of a file written as `written` whose sha256 is `sha`."""
    if data := re.fullmatch(r"(.+?)(?:\.onnx)?\.data(\.[0-9]+)?", written):
        return f"{data[1]}.{sha[:12]}.data{data[2] or ''}"
    stem, _, extension = written.rpartition(".")
    return f"{stem}.{sha[:12]}.{extension}"


def published(out: Path, written: str, own_digest: bool = True) -> str:
    """The one file in `out` published for `written`, checked to carry its own digest (`own_digest=False`: a file
    the test has changed since)."""
    pattern = addressed_pattern(written)
    found = [n for n in os.listdir(out) if pattern.fullmatch(n)]
    assert len(found) == 1, (written, sorted(os.listdir(out)))
    if own_digest:
        assert pattern.fullmatch(found[0])[1] == sha256(out / found[0])[:12], found[0]  # type: ignore[index]
    return found[0]


def without_digest(published_name: str) -> str:
    """`split_ctx.<digest>.data` -> `split_ctx.data`, `split_ctx_qnn.<digest>.bin` -> `split_ctx_qnn.bin`: a name
    that stays the same when the bytes change."""
    return re.sub(r"\.[0-9a-f]{12}(?=\.|$)", "", published_name)


def check_output_dir(out: Path, stem: str, unrelated: Iterable[str] = ()) -> dict[str, Any]:
    """The output directory holds exactly the manifest's files (+ the manifest and the --if-changed stamp,
    other models' outputs and the `unrelated` files the test put there), and each file's size and sha256
    match the manifest. Returns the manifest."""
    manifest_path = out / f"{stem}_ctx.manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["model"] == f"{stem}_ctx.onnx"
    listed = [f["name"] for f in manifest["files"]]
    assert len(listed) == len(set(listed)), listed
    # The stamp is a cache of input fingerprints for --if-changed, documented as "not an output".
    allowed_extra = {manifest_path.name, f".{stem}_ctx.stamp.json"}
    on_disk = set(os.listdir(out)) - set(unrelated)
    for other in out.glob("*_ctx.manifest.json"):  # other models compiled into the same directory
        if other != manifest_path:
            other_stem = other.name[: -len("_ctx.manifest.json")]
            on_disk -= {f["name"] for f in json.loads(other.read_text())["files"]} | {other.name, f".{other_stem}_ctx.stamp.json"}
    assert set(listed) <= on_disk, (listed, on_disk)
    assert on_disk - set(listed) <= allowed_extra, on_disk - set(listed)
    assert manifest_path.name in on_disk
    for entry in manifest["files"]:
        path = out / entry["name"]
        assert path.stat().st_size == entry["size"], entry["name"]
        assert sha256(path) == entry["sha256"], entry["name"]
    assert {f["role"] for f in manifest["files"]} <= {"model", "data", "ep_context"}
    assert [f["name"] for f in manifest["files"] if f["role"] == "model"] == [f"{stem}_ctx.onnx"]
    return manifest


def _inside(out: Path, name: str) -> bool:
    p = Path(name)
    return bool(name) and not p.is_absolute() and ".." not in p.parts and (out / p).resolve().is_relative_to(out.resolve())


def attribute(node: onnx.NodeProto, name: str) -> Any:
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return None


def epcontext_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "EPContext"]


def assert_paths_inside(model_path: Path) -> onnx.ModelProto:
    """Every external-data location and every EPContext file reference is relative, inside the output
    directory, and names an existing file. Returns the graph proto (weights not loaded)."""
    out = model_path.parent
    model = onnx.load(str(model_path), load_external_data=False)
    for tensor in model.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            location = {e.key: e.value for e in tensor.external_data}["location"]
            assert _inside(out, location), (tensor.name, location)
            assert (out / location).is_file(), location
    for node in epcontext_nodes(model):
        cache = attribute(node, "ep_cache_context")
        if cache is not None and attribute(node, "embed_mode") == 0:
            name = cache.decode()
            assert _inside(out, name), (node.name, name)
            assert (out / name).is_file(), name
    return model


@dataclass(frozen=True)
class External:
    name: str
    location: str
    offset: int
    length: int
    itemsize: int


def external_tensors(model_path: Path) -> list[External]:
    model = onnx.load(str(model_path), load_external_data=False)
    found = []
    for tensor in model.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        fields = {e.key: e.value for e in tensor.external_data}
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        found.append(External(tensor.name, fields["location"], int(fields.get("offset", "0")), int(fields["length"]), itemsize))
    return found


def inline_tensors(model_path: Path) -> dict[str, int]:
    """Inline initializer name -> byte size."""
    model = onnx.load(str(model_path), load_external_data=False)
    return {t.name: numpy_helper.to_array(t).nbytes for t in model.graph.initializer if t.data_location != TensorProto.EXTERNAL}


# ---------------------------------------------------------------- sessions

def register_qnn() -> None:
    """Register the QNN plugin once per process, as DESIGN.md shows."""
    import onnxruntime as ort
    import onnxruntime_qnn

    if not any(d.ep_name == "QNNExecutionProvider" for d in ort.get_ep_devices()):
        ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())


def qnn_session(model_path: Path, allow_cpu_nodes: bool = True) -> Any:
    """Plain onnxruntime on the QNN EP: what an app does with the compiled model (no ortcompile involved).

    Never a silent CPU rerun (`disable_fallback`); with `allow_cpu_nodes=False`, a model with any node left on the
    CPU EP (or an EPContext node QNN would not take) is refused at load.
    """
    import onnxruntime as ort
    import onnxruntime_qnn

    register_qnn()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not allow_cpu_nodes:
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    assert devices, "QNN EP claims no device"
    options.add_provider_for_devices(devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path()})
    session = ort.InferenceSession(str(model_path), options)
    session.disable_fallback()
    return session


def cpu_session(model_path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])


def seeded_inputs(session: Any, seed: int, dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Standard-normal float32 inputs; symbolic dimensions take `dims` (default 1)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in session.get_inputs():
        assert arg.type == "tensor(float)", arg.type
        shape = [d if isinstance(d, int) else (dims or {}).get(str(d), 1) for d in arg.shape]
        feeds[arg.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def max_abs_diff_vs_cpu(compiled: Any, source: Path, seeds: Iterable[int], dims: dict[str, int] | None = None) -> float:
    """Run `compiled` and the source on the CPU EP with the same seeded inputs; assert closeness; return
    the worst absolute difference seen."""
    reference = cpu_session(source)
    worst = 0.0
    for seed in seeds:
        feeds = seeded_inputs(reference, seed, dims)
        expected = reference.run(None, feeds)
        actual = compiled.run(None, feeds)
        assert [o.name for o in compiled.get_outputs()] == [o.name for o in reference.get_outputs()]
        for got, want in zip(actual, expected):
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=QNN_RTOL, atol=QNN_ATOL)
            worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want))))
    return worst


# ---------------------------------------------------------------- generated models

# Divisors for Mod(fmod=1): |w| < divisor, so fmod(w, divisor) == w bit for bit and the output IS the weight.
_DIVISOR = {np.dtype(np.float32): 1e30, np.dtype(np.float16): 60000.0, np.dtype(np.float64): 1e300,
            np.dtype(np.int8): 127, np.dtype(np.int32): 2**30}


def seeded_tensor(rng: np.random.Generator, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 10).astype(dtype)
    return rng.integers(-100, 101, size=shape).astype(dtype)


def weights_model(path: Path, tensors: dict[str, np.ndarray], *, external_data: bool = False) -> None:
    """A model whose outputs are its weights: each tensor T feeds `Mod(T, divisor, fmod=1)` -> `out_T`.

    QNN does not take Mod with fmod=1, so these initializers stay CPU-side (in the output graph, laid out
    by pass 1) even with `--ep qnn`; a small MatMul `x @ Wq` gives QNN something to compile. Because the
    Mod returns its input exactly, comparing outputs bit for bit checks every byte of every weight.
    """
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(seeded_tensor(rng, np.float32, (64, 64)) / 10, "Wq")]
    nodes = [helper.make_node("MatMul", ["x", "Wq"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])]
    for dtype in sorted({a.dtype for a in tensors.values()}, key=str):
        inits.append(numpy_helper.from_array(np.array([_DIVISOR[dtype]], dtype=dtype), f"div_{dtype}"))
    for name, array in tensors.items():
        inits.append(numpy_helper.from_array(array, name))
        nodes.append(helper.make_node("Mod", [name, f"div_{array.dtype}"], [f"out_{name}"], fmod=1))
        outputs.append(helper.make_tensor_value_info(f"out_{name}", helper.np_dtype_to_tensor_dtype(array.dtype), list(array.shape)))
    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ortcompile-tests")
    model.ir_version = 9
    onnx.checker.check_model(model)
    if external_data:
        onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".weights", size_threshold=1024)
    else:
        onnx.save(model, str(path))


def sparse_weights_model(path: Path, tensor_count: int, tensor_mib: int) -> int:
    """A big model written instantly: external data in a sparse file (zeros), one ReduceMax per tensor.
    Returns the byte size of the data. Used where only the time a compile takes matters (signals)."""
    rows = tensor_mib * (1 << 20) // 4 // 1024
    nbytes = rows * 1024 * 4
    data = path.name + ".weights"
    with open(path.parent / data, "wb") as stream:
        stream.truncate(tensor_count * nbytes)
    inits, nodes, outputs = [], [], []
    for i in range(tensor_count):
        tensor = TensorProto(name=f"W{i}", data_type=TensorProto.FLOAT, dims=[rows, 1024], data_location=TensorProto.EXTERNAL)
        for key, value in (("location", data), ("offset", str(i * nbytes)), ("length", str(nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        inits.append(tensor)
        nodes.append(helper.make_node("ReduceMax", [f"W{i}"], [f"y{i}"], keepdims=0))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, []))
    graph = helper.make_graph(nodes, path.stem, [], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ortcompile-tests")
    model.ir_version = 9
    onnx.save(model, str(path))
    return tensor_count * nbytes


def finalize_failing_model(path: Path) -> None:
    """A tiny model QNN accepts at partitioning but whose HTP graph fails to finalize.

    x @ W -> Relu (QNN partition 1) -> Sinh (CPU) -> Reshape -> ConvTranspose(strides 7, output_padding 6)
    (QNN partition 2). Measured with onnxruntime-qnn 2.7.0: the compile fails with "Failed to finalize QNN
    graph. Error: QNN_COMMON_ERROR_MEM_ALLOC" every time, while the first partition on its own compiles.
    """
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Sinh", ["b"], ["c"]),
        helper.make_node("Reshape", ["c", "shape"], ["d"]),
        helper.make_node("ConvTranspose", ["d", "k"], ["y"], strides=[7, 7], output_padding=[6, 6]),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W"),
        numpy_helper.from_array(np.array([1, 1, 4, 4], np.int64), "shape"),
        numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), "k"),
    ]
    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 30, 30])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ortcompile-tests")
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def cpu_only_model(path: Path) -> Path:
    """Static and valid, made only of an op QNN does not take (Sinh): QNN has nothing to compile."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])
    graph = helper.make_graph([helper.make_node("Sinh", ["x"], ["y"])], path.stem, [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ortcompile-tests")
    model.ir_version = 9
    onnx.save(model, str(path))
    return path
