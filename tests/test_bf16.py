"""OpenVINO's CPU plugin computes float models in bf16 where the CPU has it natively (AMX, AVX512_BF16), so its
outputs are judged by the bf16 criterion, not the fp32 one that refused every default OpenVINO compile there
(the MLP fixture: max abs diff 4.6e-3, SNR 51.5 dB; all 7 corpus models; readback/criteria.py BF16_VERIFY).

The criterion is checked both ways on real CPU-EP outputs: bf16 rounding of a correct output passes, another
input's output (a wrong answer of the right shape and scale) fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import FIXTURES, cpu_session

from ortcompile import CompileOptions, compile_model, eps
from ortcompile.eps.request import computes_in_bf16, ep_precision
from ortcompile.readback.compare import compare_output, criterion_for

BF16 = criterion_for("bf16")


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 (8 mantissa bits, round to nearest even) and back."""
    bits = x.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def _mlp_output(seed: int) -> np.ndarray:
    session = cpu_session(FIXTURES / "mlp.onnx")
    spec = session.get_inputs()[0]
    x = np.random.default_rng(seed).standard_normal([d if isinstance(d, int) else 1 for d in spec.shape]).astype(np.float32)
    return session.run(None, {spec.name: x})[0]


def test_bf16_rounding_passes_and_a_wrong_answer_fails() -> None:
    want = _mlp_output(0)
    assert compare_output("y", _bf16(want), want, BF16).ok
    assert not compare_output("y", _mlp_output(1), want, BF16).ok
    assert not compare_output("y", _bf16(want), want, criterion_for("fp32")).ok  # why fp32 refused it


@pytest.fixture
def openvino() -> eps.ResolvedEp:
    pytest.importorskip("onnxruntime_ep_openvino")
    try:
        return eps.resolve("openvino")
    except Exception as exc:  # OpenVINO claims only Intel devices
        pytest.skip(f"OpenVINO has no device here: {exc}")


def test_openvino_cpu_precision_follows_the_device_and_load_config(openvino: eps.ResolvedEp, tmp_path: Path) -> None:
    native = "BF16" in dict(openvino.devices[0].ep_metadata).get("OPTIMIZATION_CAPABILITIES", "").split()
    assert ep_precision(openvino) == ("bf16" if native else "fp32")
    config = tmp_path / "ov.json"
    config.write_text(json.dumps({"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}))
    assert not computes_in_bf16(eps.resolve("openvino", {"load_config": str(config)}))


def test_a_default_openvino_compile_is_published_and_judged_by_its_precision(openvino: eps.ResolvedEp, tmp_path: Path) -> None:
    result = compile_model(FIXTURES / "mlp.onnx", tmp_path / "ov", CompileOptions(ep="openvino"))
    manifest = json.loads(result.model_path.with_name("mlp_ctx.manifest.json").read_text())
    assert manifest["check"]["criterion"] == f"{'parity' if ep_precision(openvino) == 'bf16' else 'tolerance'} ({ep_precision(openvino)} check)"
    assert manifest["check"]["passed"] is True
