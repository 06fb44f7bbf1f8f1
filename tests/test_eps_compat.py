"""Does a compiled model fit the devices present? The real EPs answer (ONNX Runtime 1.31 compatibility API).

OpenVINO compiles on this machine's Intel CPU and judges its own output: optimal. The same model whose
recorded OpenVINO version is edited to an older release (as a model built elsewhere would carry) is not
supported. QNN's EP checks only on NPU devices, and on x86_64 its device is the HTP simulator on the CPU: the
verdict is unknown, with QNN's own reason and the decoded info (what SoC it was compiled for).
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from helpers import FIXTURES

from ortcompile import CompileOptions, compile_model
from ortcompile.eps import check_compatibility, decode_info


def test_qnn_output_gets_a_verdict_with_the_raw_and_decoded_info(tmp_path: Path) -> None:
    result = compile_model(FIXTURES / "mlp.onnx", tmp_path / "out", CompileOptions(ep="qnn", target="sm8650"))
    report = check_compatibility(result.model_path)
    (qnn,) = report.eps
    assert qnn.ep_name == "QNNExecutionProvider" and report.epcontext_nodes == 1
    assert qnn.verdict in ("optimal", "prefer-recompiling", "not-supported", "unknown")
    assert qnn.info.startswith("v2:") and qnn.decoded["soc_model"] == "57" and qnn.decoded["targets"] == ["sm8650"]
    # Measured with onnxruntime-qnn 2.7.0 on x86_64: the EP validates only against NPU devices.
    assert qnn.verdict == "unknown" and "NPU" in qnn.reason and qnn.devices
    json_report = report.to_json()
    assert json_report["verdict"] == "unknown" and json_report["usable"] is False
    assert json_report["eps"][0]["compatibility_info"] == qnn.info


@pytest.fixture
def openvino_model(tmp_path: Path) -> Path:
    pytest.importorskip("onnxruntime_ep_openvino")
    from ortcompile import eps

    try:
        eps.resolve("openvino")
    except Exception as exc:  # OpenVINO claims only Intel devices
        pytest.skip(f"OpenVINO has no device here: {exc}")
    # --check load: these tests are about the compatibility verdict (tests/test_bf16.py checks OpenVINO's outputs).
    return compile_model(FIXTURES / "mlp.onnx", tmp_path / "ov", CompileOptions(ep="openvino", check="load")).model_path


def test_openvino_output_is_optimal_on_the_machine_that_compiled_it(openvino_model: Path) -> None:
    report = check_compatibility(openvino_model)
    (ov,) = report.eps
    assert ov.verdict == "optimal" and report.usable
    assert ov.decoded["ovep_ver"].startswith("1.8.1") and "ov_compat_string" in ov.decoded


def test_openvino_output_from_another_openvino_release_is_not_supported(openvino_model: Path, tmp_path: Path) -> None:
    proto = onnx.load(str(openvino_model), load_external_data=False)
    for prop in proto.metadata_props:
        if prop.key == "ep_compatibility_info.OpenVINOExecutionProvider":
            decoded = decode_info("OpenVINOExecutionProvider", prop.value)
            current = decoded["ov_compat_string"].split("ov=")[1].split(";")[0]
            prop.value = prop.value.replace(f"ov={current}", "ov=2024.6.0")
    older = openvino_model.with_name("older_ctx.onnx")
    onnx.save(proto, str(older))
    report = check_compatibility(older)
    assert report.eps[0].verdict == "not-supported" and not report.usable
    assert "recompile" in report.eps[0].reason


def test_a_model_with_nothing_compiled_fits_anywhere(tmp_path: Path) -> None:
    result = compile_model(FIXTURES / "mlp.onnx", tmp_path / "cpu", CompileOptions(ep="cpu"))
    report = check_compatibility(result.model_path)
    assert report.eps == [] and report.verdict == "optimal" and report.epcontext_nodes == 0


def test_decode_qnn_info() -> None:
    decoded = decode_info("QNNExecutionProvider", "v2:6:2.51.0:5.51.0:73:60:0:0")
    assert decoded == {"format": "qnn-v2", "backend_id": "6", "qnn_sdk": "2.51.0", "backend_api": "5.51.0", "htp_arch": "73",
                       "soc_model": "60", "vtcm_mb": "0", "htp_user_driver": False, "targets": ["sc8380xp"]}
    assert decode_info("QNNExecutionProvider", "garbage") is None
