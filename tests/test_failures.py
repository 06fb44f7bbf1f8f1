"""Failures publish nothing: the destination is byte-for-byte as before, with no staging directory and no
stray EP blob, even when an earlier output of the same model is there and --force was given.

Each failure is real: the QNN HTP backend rejecting a graph at finalize, the OS refusing a write in pass 1
(RLIMIT_FSIZE, a full tmpfs), a signal while gigabytes are being written.

Measured with raw onnxruntime (ModelCompiler.compile_to_file, embed=0) on the same inputs, for contrast
(the RLIMIT_FSIZE case is kept as test_raw_ort_leaves_junk_in_the_same_situation):
- HTP finalize failure: raw ORT leaves nothing (the EP writes its blob only after every graph finalized).
- RLIMIT_FSIZE in the data write: raw ORT leaves `<model>_qnn.bin` and a truncated `.data` file.
- an exception in get_initializer_location_func: raw ORT leaves `<model>_qnn.bin`.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    FIXTURES,
    STAGE_PREFIX,
    assert_no_junk,
    assert_one_line_error,
    check_output_dir,
    cpu_only_model,
    finalize_failing_model,
    published,
    run_cli,
    seeded_tensor,
    signal_while_staging,
    snapshot,
    sparse_weights_model,
    weights_model,
    without_progress,
)

from ortcompile import CompileOptions, compile_model
from ortcompile.errors import CompilationFailed


@pytest.fixture
def previous_output(tmp_path: Path) -> Callable[[str], tuple[Path, Path]]:
    """An output directory holding an unrelated file and a good earlier output of `<stem>.onnx`.

    Returns (source path, output dir); the test then overwrites the source with a model that fails."""

    def make(stem: str) -> tuple[Path, Path]:
        source = tmp_path / "src" / f"{stem}.onnx"
        source.parent.mkdir(exist_ok=True)
        shutil.copyfile(FIXTURES / "split.onnx", source)
        out = tmp_path / "out"
        out.mkdir()
        (out / "notes.txt").write_text("someone else's file\n")
        proc = run_cli("compile", source, "-o", out, "--ep", "qnn", "--embed", "never", "-q")
        assert proc.returncode == 0, proc.stderr
        check_output_dir(out, stem, unrelated={"notes.txt"})
        published(out, f"{stem}_ctx_qnn.bin")
        return source, out

    return make


# ---------------------------------------------------------------- (a) the EP fails mid-compile

@pytest.mark.parametrize("how", ["finalize", "vtcm"])
def test_ep_failure_keeps_previous_output(how: str, previous_output: Callable[[str], tuple[Path, Path]]) -> None:
    """finalize: the HTP backend rejects a graph of the model at finalize (QNN_COMMON_ERROR_MEM_ALLOC).
    vtcm: a VTCM size the backend refuses when it creates the first graph (split.onnx unchanged); the option
    check finds it on a one-node model before the compile starts (a usage error, exit 2)."""
    source, out = previous_output("net")
    if how == "finalize":
        finalize_failing_model(source)
        args, code, needles = [], 1, ("qnn: compilation failed", "Failed to finalize QNN graph")
    else:
        args, code, needles = ["--ep-option", "vtcm_mb=100000"], 2, ("refused --ep-option vtcm_mb=100000", "QNN_GRAPH_ERROR")
    before = snapshot(out)
    proc = run_cli("compile", source, "-o", out, "--ep", "qnn", "--embed", "never", "--force", *args)
    assert proc.returncode == code
    assert proc.stdout == ""
    assert_one_line_error(proc.stderr, *needles)
    assert snapshot(out) == before
    assert_no_junk(out)


def test_ep_failure_through_the_api(tmp_path: Path) -> None:
    finalize_failing_model(tmp_path / "net.onnx")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(CompilationFailed) as raised:
        compile_model(tmp_path / "net.onnx", out, CompileOptions(ep="qnn"))
    assert raised.value.exit_code == 1
    assert "finalize" in raised.value.message and "\n" not in raised.value.message
    assert snapshot(out) == {}


@pytest.mark.parametrize("model, code", [("finalize-failure", 1), ("nothing-to-compile", 1), ("dynamic", 2)])
def test_failed_compile_does_not_create_the_output_dir(model: str, code: int, tmp_path: Path) -> None:
    """-o new/out did not exist: after a failure neither does new/ (functional-4: it was left, empty)."""
    source = {"finalize-failure": lambda: finalize_failing_model(tmp_path / "net.onnx") or tmp_path / "net.onnx",
              "nothing-to-compile": lambda: cpu_only_model(tmp_path / "sinh.onnx"),
              "dynamic": lambda: FIXTURES / "dynamic.onnx"}[model]()  # dynamic: refused before anything is created
    proc = run_cli("compile", source, "-o", tmp_path / "new" / "out", "--ep", "qnn")
    assert proc.returncode == code, proc.stderr
    assert not (tmp_path / "new").exists()


# ---------------------------------------------------------------- (b) pass 1 cannot write

def _weights_with_big_cpu_tensor(path: Path) -> None:
    """QNN compiles x @ Wq (a ~64 KiB blob, written first); the 1,084,612-byte tensor behind Mod(fmod=1)
    stays CPU-side and is written by pass 1, after the EP's blob exists."""
    rng = np.random.default_rng(11)
    weights_model(path, {"big": seeded_tensor(rng, np.float32, (263, 1031)), "small": seeded_tensor(rng, np.float32, (300,))})


def _limit_file_size(limit: int) -> Callable[[], None]:
    def preexec() -> None:  # in the child, before exec: both survive exec
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


def test_write_failure_in_pass_1_keeps_previous_output(previous_output: Callable[[str], tuple[Path, Path]]) -> None:
    source, out = previous_output("net")
    _weights_with_big_cpu_tensor(source)
    before = snapshot(out)
    proc = subprocess.run(
        [sys.executable, "-m", "ortcompile", "compile", str(source), "-o", str(out), "--ep", "qnn", "--embed", "never", "--force"],
        capture_output=True, text=True, timeout=120, preexec_fn=_limit_file_size(200_000),
    )
    assert proc.returncode == 4, proc.stderr
    assert proc.stdout == ""
    assert_one_line_error(proc.stderr, "cannot write", "File too large")
    assert snapshot(out) == before
    assert_no_junk(out)


_RAW_ORT = """
import sys, onnxruntime as ort, onnxruntime_qnn
ort.set_default_logger_severity(4)
ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
options = ort.SessionOptions()
options.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"],
                                 {"backend_path": onnxruntime_qnn.get_qnn_htp_path()})
compiler = ort.ModelCompiler(options, sys.argv[1], embed_compiled_data_into_model=False,
                             external_initializers_file_path="net_ctx.onnx.data")
try:
    compiler.compile_to_file(sys.argv[2])
except Exception as exc:
    print("failed:", str(exc).splitlines()[0])
"""


def test_raw_ort_leaves_junk_in_the_same_situation(tmp_path: Path) -> None:
    """The hazard the test above guards against is real: raw ModelCompiler, same model, same limit, leaves
    the EP's blob and a truncated data file in the destination. (If ORT ever stops doing this, the test
    above still holds; this one documents why staging exists.)"""
    _weights_with_big_cpu_tensor(tmp_path / "net.onnx")
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-c", _RAW_ORT, str(tmp_path / "net.onnx"), str(out / "net_ctx.onnx")],
                          capture_output=True, text=True, timeout=120, preexec_fn=_limit_file_size(200_000))
    assert "failed:" in proc.stdout, (proc.stdout, proc.stderr)  # (after the QNN SDK banner, on raw stdout)
    assert (out / "net_ctx_qnn.bin").is_file()
    assert (out / "net_ctx.onnx.data").stat().st_size == 200_000  # cut at the limit


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """A 1 MiB tmpfs mounted for the test (we run as root here; skipped where mounting is not allowed)."""
    mountpoint = tmp_path / "tmpfs"
    mountpoint.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mountpoint)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)


def test_disk_full_in_pass_1(small_tmpfs: Path, tmp_path: Path) -> None:
    """ENOSPC: the 1 MiB filesystem cannot take the 1 MiB tensor; the message says what to do."""
    source = tmp_path / "net.onnx"
    _weights_with_big_cpu_tensor(source)
    out = small_tmpfs / "out"
    out.mkdir()
    (out / "notes.txt").write_text("someone else's file\n")
    before = snapshot(small_tmpfs)
    proc = run_cli("compile", source, "-o", out, "--ep", "cpu")
    assert proc.returncode == 4, proc.stderr
    assert_one_line_error(proc.stderr, "no space left", "-o")
    assert snapshot(small_tmpfs) == before
    assert_no_junk(out)
    # And the space is given back: a compile that fits still works on the same filesystem.
    small = tmp_path / "small.onnx"
    weights_model(small, {"w": seeded_tensor(np.random.default_rng(0), np.float32, (100, 100))})
    assert run_cli("compile", small, "-o", out, "--ep", "cpu", "-q").returncode == 0
    check_output_dir(out, "small", unrelated={"notes.txt"})


# ---------------------------------------------------------------- (c) signals

def _start_and_signal(source: Path, out: Path, signum: int) -> subprocess.CompletedProcess[str]:
    """Start a compile, wait until pass 1 is writing into the staging directory, send `signum`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ortcompile", "compile", str(source), "-o", str(out), "--ep", "cpu", "--force"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    stdout, stderr = signal_while_staging(proc, out, "*.data*", signum)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_mid_compile_publishes_nothing(signum: int, tmp_path: Path) -> None:
    """600 MB of (sparse) weights take ~2 s to lay out; a signal in the middle exits 128+N at once."""
    source = tmp_path / "src" / "big.onnx"
    source.parent.mkdir()
    weights_model(source, {"w": seeded_tensor(np.random.default_rng(0), np.float32, (64, 64))})
    out = tmp_path / "out"
    assert run_cli("compile", source, "-o", out, "--ep", "cpu", "-q").returncode == 0  # the previous output
    (out / "notes.txt").write_text("someone else's file\n")
    sparse_weights_model(source, tensor_count=6, tensor_mib=100)
    before = snapshot(out)
    started = time.monotonic()
    proc = _start_and_signal(source, out, signum)
    assert proc.returncode == 128 + signum, proc.stderr
    assert time.monotonic() - started < 30
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = without_progress(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("ortcompile: interrupted"), proc.stderr
    assert snapshot(out) == before
    assert_no_junk(out)


def test_killed_run_is_cleaned_up_by_the_next(tmp_path: Path) -> None:
    """SIGKILL cannot be handled: the staging directory stays, and the next compile into the directory
    removes it (its pid is gone) before publishing its own output."""
    source = tmp_path / "big.onnx"
    sparse_weights_model(source, tensor_count=6, tensor_mib=100)
    out = tmp_path / "out"
    proc = _start_and_signal(source, out, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    stale = list(out.glob(STAGE_PREFIX + "*"))
    assert stale, "SIGKILL should leave the staging directory"
    assert not (out / "big_ctx.onnx").exists()
    small = tmp_path / "small.onnx"
    weights_model(small, {"w": seeded_tensor(np.random.default_rng(0), np.float32, (64, 64))})
    assert run_cli("compile", small, "-o", out, "--ep", "cpu", "-q").returncode == 0
    assert not list(out.glob(STAGE_PREFIX + "*"))
    check_output_dir(out, "small")
    assert sorted(os.listdir(out)) == sorted(n for n in os.listdir(out) if n.startswith(("small_ctx", ".small_ctx")))
    assert json.loads((out / "small_ctx.manifest.json").read_text())["model"] == "small_ctx.onnx"
