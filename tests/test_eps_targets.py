"""Compile targets with the real EPs: QNN SoCs on the HTP simulator, OpenVINO's virtual NPUs, TensorRT RTX SMs.

QNN targets compile here (the HTP simulator builds for any SoC); OpenVINO lists its virtual NPU platforms
and refuses to compile for them cleanly without Intel's NPU compiler; TensorRT RTX cannot load without the
NVIDIA driver. What each compile targeted is recorded in the manifest and, by ONNX Runtime, in the model's
`ep_compatibility_info` metadata, which these tests read back.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from helpers import FIXTURES, qnn_session, run_cli, seeded_inputs, snapshot

from ortcompile import CompileOptions, compile_model, eps
from ortcompile.eps.compat import decode_info, read_compatibility_info
from ortcompile.eps.targets import QNN_TARGETS
from ortcompile.errors import ComponentMissing, UsageError

# QNN_SOC_MODEL_* ids from QAIRT's QnnTypes.h; HTP architecture per SoC from Qualcomm's supported-devices table.
QNN_IDS = {"sm8350": (30, 68), "sm8450": (36, 69), "sc8280x": (37, 68), "sa8295": (39, 68), "sm8475": (42, 69), "sm8550": (43, 73),
           "sm8650": (57, 75), "sc8380xp": (60, 73), "qcs8550": (66, 73), "sm8750": (69, 79), "qcs9100": (77, 73), "sm8850": (87, 81)}


def test_qnn_target_table() -> None:
    names = [n for t in QNN_TARGETS for n in t.names()]
    assert len(names) == len(set(names))
    assert {t.name: (int(t.option_dict["soc_model"]), int(t.option_dict["htp_arch"])) for t in QNN_TARGETS} == QNN_IDS
    assert [t.name for t in QNN_TARGETS if t.default] == ["sc8380xp"]
    assert eps.default_target(eps.lookup("qnn")).name == "sc8380xp"


def _compile(tmp_path: Path, **options) -> tuple[Path, dict]:
    out = tmp_path / "out"
    result = compile_model(FIXTURES / "mlp.onnx", out, CompileOptions(ep="qnn", **options))
    manifest = json.loads((out / "mlp_ctx.manifest.json").read_text())
    return result.model_path, manifest


def _qnn_info(model: Path) -> dict:
    infos, _ = read_compatibility_info(model)
    return decode_info("QNNExecutionProvider", infos["QNNExecutionProvider"])


def test_default_qnn_target_is_recorded_and_compiled_for(tmp_path: Path) -> None:
    model, manifest = _compile(tmp_path)
    assert manifest["target"]["name"] == "sc8380xp" and manifest["target"]["default"] is True
    assert manifest["target"]["options"] == {"soc_model": "60", "htp_arch": "73"}
    assert "target" not in manifest["options"]  # the user asked for no target: --if-changed compares the same options
    info = _qnn_info(model)
    assert (info["soc_model"], info["htp_arch"], info["targets"]) == ("60", "73", ["sc8380xp"])
    session = qnn_session(model)  # plain onnxruntime, no soc_model given: the compiled model loads and runs
    assert session.run(None, seeded_inputs(session, 0))[0].shape == (1, 256)


@pytest.mark.parametrize("target", ["sm8650", "8-gen-3"])
def test_named_qnn_target_is_recorded(target: str, tmp_path: Path) -> None:
    model, manifest = _compile(tmp_path, target=target)
    assert manifest["target"]["name"] == "sm8650" and manifest["target"]["default"] is False
    assert manifest["target"]["options"] == {"soc_model": "57", "htp_arch": "75", "vtcm_mb": "8"}
    assert manifest["options"]["target"] == target
    info = _qnn_info(model)
    assert (info["soc_model"], info["htp_arch"], info["vtcm_mb"]) == ("57", "75", "8")


def test_explicit_soc_model_wins_over_the_target(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="soc_model=43 overrides --target sm8650"):
        model, manifest = _compile(tmp_path, target="sm8650", ep_options={"soc_model": "43"})
    assert manifest["target"]["overridden_by_ep_option"] == ["soc_model"]
    assert _qnn_info(model)["soc_model"] == "43"


def test_soc_model_option_without_target_replaces_the_default(tmp_path: Path) -> None:
    model, manifest = _compile(tmp_path, ep_options={"soc_model": "57"})
    assert "target" not in manifest  # the user's own target: no named target applies
    info = _qnn_info(model)
    assert (info["soc_model"], info["htp_arch"]) == ("57", "0")


def test_bad_target_is_a_usage_error_listing_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as caught:
        compile_model(FIXTURES / "mlp.onnx", tmp_path / "out", CompileOptions(ep="qnn", target="sm9999"))
    assert caught.value.exit_code == 2
    assert "unknown --target 'sm9999' for qnn" in caught.value.message and "sm8650" in caught.value.message
    assert not (tmp_path / "out").exists()


def test_eps_targets_lists_qnn_soc_models() -> None:
    listing = {entry.ep.short_name: entry for entry in eps.list_targets()}
    qnn = listing["qnn"]
    assert qnn.usable and qnn.ep.target_kind == "option"
    assert {t.name for t in qnn.targets} == set(QNN_IDS)
    assert qnn.to_json()["targets"][0]["options"]["soc_model"] == "60"


# ---------------------------------------------------------------- OpenVINO: virtual NPU devices

@pytest.fixture
def openvino() -> None:
    pytest.importorskip("onnxruntime_ep_openvino")


def test_openvino_lists_virtual_npu_targets(openvino: None) -> None:
    (listing,) = eps.list_targets("openvino")
    virtual = {t.name: t for t in listing.targets if t.virtual}
    assert {"npu4000", "npu5010", "npu5020", "npu6010"} <= set(virtual)
    assert "Lunar Lake" in virtual["npu4000"].description and "lunar-lake" in virtual["npu4000"].aliases
    assert dict(virtual["npu5010"].match)["ep:npu_platform"] == "5010"


@pytest.mark.parametrize("target", ["npu4000", "lunar-lake", "npu6010"])
def test_openvino_virtual_npu_is_selectable_and_fails_cleanly_without_the_npu_compiler(openvino: None, target: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(ComponentMissing) as caught:
        compile_model(FIXTURES / "mlp.onnx", out, CompileOptions(ep="openvino", target=target))
    message = caught.value.message
    assert caught.value.exit_code == 1 and "\n" not in message
    assert "libopenvino_intel_npu_compiler_loader.so" in message and "Intel NPU driver" in message
    assert "target npu" in message  # names the virtual NPU it was compiling for
    assert snapshot(out) is None  # nothing written, not even the output directory


def test_openvino_bad_target_lists_real_and_virtual_devices(openvino: None) -> None:
    with pytest.raises(UsageError) as caught:
        eps.resolve("openvino", target="npu9999")
    assert "npu4000" in caught.value.message and "valid targets" in caught.value.message


# ---------------------------------------------------------------- TensorRT RTX without the NVIDIA driver

def _no_nvidia_driver() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    return False


def test_tensorrt_rtx_targets_are_listed_even_when_it_cannot_load() -> None:
    pytest.importorskip("onnxruntime_ep_nv_tensorrt_rtx")
    (listing,) = eps.list_targets("nvtrtrtx")
    assert [t.name for t in listing.targets] == ["sm86", "sm89", "sm120", "sm121"]
    assert listing.targets[1].option_dict == {"nv_target_sm": "sm89"}
    if _no_nvidia_driver():
        assert not listing.usable and "libcuda.so.1" in listing.note


@pytest.mark.parametrize("extra", [(), ("--ep-option", "nv_target_sm=sm89")])
def test_tensorrt_rtx_without_the_driver_fails_in_one_line(extra: tuple[str, ...], tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime_ep_nv_tensorrt_rtx")
    if not _no_nvidia_driver():
        pytest.skip("an NVIDIA driver is installed here: this test is about a machine without one")
    out = tmp_path / "out"
    proc = run_cli("compile", FIXTURES / "mlp.onnx", "-o", out, "--ep", "nvtrtrtx", *extra)
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ortcompile: error: nvtensorrtrtx: cannot load the EP"), proc.stderr
    assert "libcuda.so.1" in lines[0] and "NVIDIA GPU driver" in lines[0]
    assert snapshot(out) is None


def test_a_mistyped_option_target_is_told_before_the_ep_fails_to_load() -> None:
    """resolve looks an option target up before it raises the EP's failure to load (the library API has no typo check
    before it): a usage error (exit 2) whatever the state of the EP, as when the target was looked up first."""
    pytest.importorskip("onnxruntime_ep_nv_tensorrt_rtx")
    if not _no_nvidia_driver():
        pytest.skip("an NVIDIA driver is installed here: this test is about a machine without one")
    with pytest.raises(ComponentMissing, match="libcuda.so.1"):
        eps.resolve("nvtrtrtx", target="sm89")
    with pytest.raises(UsageError, match="unknown --target 'sm99' for nvtensorrtrtx; valid targets: sm86, sm89, sm120, sm121"):
        eps.resolve("nvtrtrtx", target="sm99")


def test_tensorrt_rtx_listing_says_what_is_missing() -> None:
    pytest.importorskip("onnxruntime_ep_nv_tensorrt_rtx")
    if not _no_nvidia_driver():
        pytest.skip("an NVIDIA driver is installed here")
    entry = next(e for e in eps.list_eps() if e.short_name == "nvtensorrtrtx")
    assert entry.installed and not entry.devices and "libcuda.so.1" in entry.note
    assert entry.package.startswith("onnxruntime-ep-nv-tensorrt-rtx-cu")


def test_compiled_model_metadata_is_readable_without_onnxruntime(tmp_path: Path) -> None:
    model, _ = _compile(tmp_path)
    proto = onnx.load(str(model), load_external_data=False)
    keys = [p.key for p in proto.metadata_props]
    assert "ep_compatibility_info.QNNExecutionProvider" in keys


def test_cuda_major_mismatch_names_the_wheel_to_install() -> None:
    """The decision alone, on the version numbers a driver reports (12080 = CUDA 12.8): no driver is loaded here."""
    from ortcompile.eps.loading import cuda_mismatch

    info = eps.lookup("nvtrtrtx")
    message = cuda_mismatch(info, "onnxruntime-ep-nv-tensorrt-rtx-cu13", 12080)
    assert message == ("nvtensorrtrtx: onnxruntime-ep-nv-tensorrt-rtx-cu13 is built for CUDA 13, but this NVIDIA driver supports CUDA up "
                       "to 12.8: install onnxruntime-ep-nv-tensorrt-rtx-cu12 instead, or update the NVIDIA driver")
    assert cuda_mismatch(info, "onnxruntime-ep-nv-tensorrt-rtx-cu13", 13000) is None
    assert cuda_mismatch(info, "onnxruntime-ep-nv-tensorrt-rtx-cu12", 12080) is None
    assert cuda_mismatch(info, "onnxruntime-ep-nv-tensorrt-rtx-cu12", None) is None  # no driver: nothing to compare
