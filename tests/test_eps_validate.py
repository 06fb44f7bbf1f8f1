"""Option values checked by the EP itself before compiling (issue 15, item 1), with the real QNN and OpenVINO EPs.

QNN accepts a bad `htp_performance_mode` with only a log warning and compiles anyway; ortcompile creates the
EP on a one-node model first, reads ONNX Runtime's log, and refuses the value in one line with the EP's words.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from helpers import FIXTURES, assert_one_line_error, run_cli, run_process, snapshot

from ortcompile import CompileOptions, compile_model, eps
from ortcompile.eps.validate import parse_log
from ortcompile.errors import OrtCompileError, OrtCompileWarning, UsageError


@pytest.mark.parametrize("option, value, words", [
    ("htp_performance_mode", "warp", "Htp performance mode not valid"),
    ("vtcm_mb", "x", "malformed VTCM size"),
    ("htp_arch", "99", "Invalid HTP architecture: 99"),
    ("soc_model", "abc", "Unrecognized soc_model 'abc'"),
    ("soc_model", "99999", "QNN_DEVICE_ERROR_INVALID_CONFIG"),
    ("device_id", "7", "Could not find device with ID = 7"),
    ("backend_path", "/nonexistent", "/nonexistent"),
])
def test_bad_qnn_value_is_refused_with_the_eps_reason(option: str, value: str, words: str) -> None:
    with pytest.raises(UsageError) as caught:
        eps.resolve("qnn", {option: value}, validate=True)
    message = caught.value.message
    assert caught.value.exit_code == 2 and "\n" not in message
    assert message.startswith(f"qnn: QNNExecutionProvider refused --ep-option {option}={value}: ")
    assert words in message


def test_bad_value_via_the_cli_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli("compile", FIXTURES / "mlp.onnx", "-o", out, "--ep", "qnn", "--ep-option", "htp_performance_mode=warp")
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, "htp_performance_mode=warp", "Htp performance mode not valid")
    assert snapshot(out) is None


def test_the_refused_option_is_named_among_several() -> None:
    with pytest.raises(UsageError) as caught:
        eps.resolve("qnn", {"htp_graph_finalization_optimization_mode": "2", "vtcm_mb": "x", "enable_htp_fp16_precision": "1"}, validate=True)
    assert "--ep-option vtcm_mb=x:" in caught.value.message and "finalization" not in caught.value.message


def test_backend_type_replaces_the_injected_backend_path(tmp_path: Path) -> None:
    resolved = eps.resolve("qnn", {"backend_type": "htp"}, validate=True)
    assert "backend_path" not in resolved.options and resolved.options["backend_type"] == "htp"
    result = compile_model(FIXTURES / "mlp.onnx", tmp_path / "out", CompileOptions(ep="qnn", ep_options={"backend_type": "htp"}))
    assert result.epcontext_nodes == 1


def test_backend_type_and_backend_path_together_are_refused_with_the_fix() -> None:
    with pytest.raises(UsageError, match="give only one"):
        eps.resolve("qnn", {"backend_type": "htp", "backend_path": "libQnnHtp.so"}, validate=True)


def test_a_backend_the_package_does_not_ship_says_so() -> None:
    with pytest.raises(UsageError) as caught:
        eps.resolve("qnn", {"backend_type": "cpu"}, validate=True)
    assert "libQnnCpu.so is not on this machine" in caught.value.message


def _compiled_files(out: Path, *args: str) -> tuple[dict[str, Any], str]:
    """mlp.onnx compiled for QNN with `args` into `out`: its files but the manifest (which records the options), and stderr."""
    proc = run_cli("compile", FIXTURES / "mlp.onnx", "-o", out, "--ep", "qnn", *args)
    assert proc.returncode == 0, proc.stderr
    return {name: data for name, data in snapshot(out).items() if not name.endswith(".manifest.json")}, proc.stderr


@pytest.fixture(scope="module")
def plain_qnn_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The files of mlp.onnx compiled for QNN without options: the reference of both cases below, compiled once."""
    files, _ = _compiled_files(tmp_path_factory.mktemp("validate") / "plain")
    return files


@pytest.mark.parametrize("option", ["htp_performance_mode=burst", "rpc_control_latency=100"])
def test_runtime_only_option_warns_and_changes_no_byte(option: str, plain_qnn_files: dict[str, Any], tmp_path: Path) -> None:
    """A power vote and an RPC latency for running sessions: the compiled files are the same bytes without them.

    Each compile runs the EP in its own worker process (the QNN backend's process-wide counters reach its context
    binary); the option check probes the EP in a child process, so it does not move those counters either."""
    files, stderr = _compiled_files(tmp_path / "option", "--ep-option", option)
    assert f"ortcompile: warning: qnn: --ep-option {option.split('=')[0]} has no effect on the compiled model" in stderr
    assert files == plain_qnn_files and any(name.endswith("_ctx.onnx") for name in files)


def test_an_ep_that_crashes_is_contained(tmp_path: Path) -> None:
    """onnxruntime-ep-webgpu 0.4.0 aborts a compile session on Mesa's software Vulkan (BufferManager assertion),
    with or without options: the probe's child dies, not ortcompile, and the options are not blamed. A fresh
    `python -m ortcompile`: if the crash ever reached ortcompile's process, it must end that one, not the test run."""
    pytest.importorskip("onnxruntime_ep_webgpu")
    import webgpu_env

    webgpu_env.require_webgpu()
    out = tmp_path / "out"
    proc = run_process("compile", FIXTURES / "mlp.onnx", "-o", out, "--ep", "webgpu", "--ep-option", "enableGraphCapture=1")
    assert proc.returncode == 1, proc.stderr
    assert_one_line_error(proc.stderr, "webgpu: WebGpuExecutionProvider crashed (SIGABRT)", "even without --ep-option")
    assert snapshot(out) is None


def test_options_for_the_cpu_ep_warn_that_they_do_nothing() -> None:
    with pytest.warns(OrtCompileWarning, match="has no effect: the CPU EP takes no provider options"):
        eps.resolve("cpu", {"htp_performance_mode": "burst"}, validate=True)


def _openvino_has_a_real_device() -> bool:
    """OpenVINO claims only Intel devices: on an AMD CPU it offers virtual NPUs alone, which cannot run the probe."""
    try:
        resolved = eps.resolve("openvino")
    except OrtCompileError:
        return False
    return resolved.target is not None and not resolved.target.virtual


def test_an_option_the_ep_ignores_is_passed_on_as_a_warning() -> None:
    pytest.importorskip("onnxruntime_ep_openvino")
    if not _openvino_has_a_real_device():
        pytest.skip("OpenVINO offers no real device on this CPU (it claims Intel CPUs only)")
    with pytest.warns(OrtCompileWarning, match="precision is ignored"):
        eps.resolve("openvino", {"precision": "FP16"}, validate=True)


def test_good_options_pass_quietly() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolved = eps.resolve("qnn", {"htp_graph_finalization_optimization_mode": "3", "enable_htp_fp16_precision": "1"}, validate=True)
    assert resolved.warnings == []


def test_log_parser_joins_continuation_lines() -> None:
    text = ("\x1b[1;31m2026-01-01 00:00:00.0 [E:onnxruntime:, ov_provider.cc:156 OpenVINOEpPlugin::Compile] Exception from a.cpp:1:\n"
            "Cannot load library \"x.so\": x.so: cannot open shared object file\x1b[m\n"
            "2026-01-01 00:00:00.1 [I:onnxruntime:, s.cc:1 F] info\n"
            "2026-01-01 00:00:00.2 [W:onnxruntime:, q.cc:198 ParseHtpPerformanceMode] Htp performance mode not valid.\n")
    lines = parse_log(text)
    assert [(line.severity, line.func) for line in lines] == [("E", "OpenVINOEpPlugin::Compile"), ("W", "ParseHtpPerformanceMode")]
    assert lines[0].message.endswith("cannot open shared object file") and lines[0].refuses and lines[1].refuses
