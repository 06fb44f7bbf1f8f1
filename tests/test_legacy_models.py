"""What older exporters write, compiled for QNN: initializers listed as graph inputs (compile/defaults.py), and opset 6.

Initializers listed as inputs, two ways real models have them, both built here with onnx.helper:
- IR >= 4, every weight an overridable default: what `torch.onnx.export(..., keep_initializers_as_inputs=True)` writes.
  Before compile/defaults.py QNN refused the compiled graph ("The count of graph inputs should be at least the count
  of tensor_wrapper"), with a hint about dynamic dims the model does not have; `--partition` cut the parts'
  interfaces through the weights and the check found the output wrong (SNR 0 dB).
- IR 3, every initializer listed as an input (ONNX's own "light" AlexNet: weights made by ConstantOfShape from shape
  tensors, two of them equal). ORT's optimizer merged the equal shape tensors and saved the merged one's input without
  its initializer: the compiled model asked for a shape tensor the source never took (`--check none` published it;
  the check refused it with "Invalid input name").
Each compile's output is run with plain onnxruntime on the QNN EP (HTP simulator, fp16) and compared with numpy.

Opset 6 (ONNX's pytorch-operator test models): ORT's layout transformer, which QNN needs, refuses it, so QNN takes no
node; the refusal says so and how to convert, and the conversion it names does compile.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import QNN_ATOL, QNN_RTOL, assert_one_line_error, qnn_session, run_cli, without_progress
from onnx import TensorProto, helper, numpy_helper

WARNING = ("ortcompile: warning: keep.onnx: 4 initializers are also listed as graph inputs (overridable defaults: W, B, "
           "Wfc and 1 more); compiled as constants: the compiled model does not take them as inputs")


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"W": (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "B": (rng.standard_normal(8) * 0.1).astype(np.float32),
            "Wfc": (rng.standard_normal((8 * 8 * 8, 10)) * 0.05).astype(np.float32), "bfc": (rng.standard_normal(10) * 0.1).astype(np.float32)}


def _reference(x: np.ndarray) -> np.ndarray:
    """Conv 3x3 (pad 1) + bias, Relu, flatten, MatMul + bias: numpy in float64."""
    w = {k: v.astype(np.float64) for k, v in _weights().items()}
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = np.zeros((1, 8, 8, 8))
    for i in range(8):
        for j in range(8):
            conv[0, :, i, j] = np.tensordot(w["W"], padded[0, :, i:i + 3, j:j + 3], axes=([1, 2, 3], [0, 1, 2]))
    hidden = np.maximum(conv + w["B"][None, :, None, None], 0).reshape(1, -1)
    return hidden @ w["Wfc"] + w["bfc"]


def _keep_initializers_as_inputs(path: Path) -> Path:
    """IR 8: every weight is an initializer and a graph input (an overridable default), as torch exports them."""
    weights = _weights()
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("MatMul", ["f", "Wfc"], ["m"]), helper.make_node("Add", ["m", "bfc"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])]
    inputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(a.shape)) for name, a in weights.items()]
    graph = helper.make_graph(nodes, "keep", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(a, name) for name, a in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def _ir3_equal_shapes(path: Path) -> Path:
    """IR 3, opset 9: y = (x + ConstantOfShape(s1, 0.5)) * ConstantOfShape(s2, 2.0), s1 == s2, both listed as inputs."""
    shape = np.array([1, 16], np.int64)
    nodes = [helper.make_node("ConstantOfShape", ["s1"], ["half"], value=numpy_helper.from_array(np.array([0.5], np.float32))),
             helper.make_node("ConstantOfShape", ["s2"], ["two"], value=numpy_helper.from_array(np.array([2.0], np.float32))),
             helper.make_node("Add", ["x", "half"], ["a"]), helper.make_node("Mul", ["a", "two"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])]
    inputs += [helper.make_tensor_value_info(name, TensorProto.INT64, [2]) for name in ("s1", "s2")]
    graph = helper.make_graph(nodes, "ir3", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
                              [numpy_helper.from_array(shape, "s1"), numpy_helper.from_array(shape, "s2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 3
    onnx.save(model, str(path))
    return path


def _inputs_of(model: Path) -> list[str]:
    return [i.name for i in onnx.load(str(model), load_external_data=False).graph.input]


def _assert_runs_right(model: Path) -> None:
    session = qnn_session(model, allow_cpu_nodes=False)
    for seed in (0, 1):
        x = np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)
        [y] = session.run(None, {"x": x})
        np.testing.assert_allclose(y, _reference(x), rtol=QNN_RTOL, atol=QNN_ATOL)


@pytest.mark.parametrize("partition", [None, "20KB"], ids=["whole", "partition"])
def test_overridable_weights_compile_as_constants_with_a_warning(tmp_path: Path, partition: str | None) -> None:
    source = _keep_initializers_as_inputs(tmp_path / "keep.onnx")
    out = tmp_path / "out"
    result = run_cli("compile", source, "-o", out, "--ep", "qnn", "--json", *(["--partition", partition] if partition else []))
    assert result.returncode == 0, result.stderr
    assert [line for line in without_progress(result.stderr) if "warning" in line] == [WARNING]
    report = json.loads(result.stdout)["outputs"][0]
    compiled = Path(report["model"])
    assert _inputs_of(compiled) == ["x"]  # the defaults are constants now: nothing else to feed
    if partition:
        assert report["epcontext_nodes"] >= 2  # parts cut between nodes, never through a weight
    else:
        manifest = json.loads(compiled.with_name("keep_ctx.manifest.json").read_text())
        assert manifest["prepare"]["constants"] == ["W", "B", "Wfc", "bfc"]
    _assert_runs_right(compiled)


def test_without_prepare_the_refusal_names_the_overridable_inputs(tmp_path: Path) -> None:
    source = _keep_initializers_as_inputs(tmp_path / "keep.onnx")
    result = run_cli("compile", source, "-o", tmp_path / "out", "--ep", "qnn", "--no-prepare")
    assert result.returncode == 1, result.stderr
    assert_one_line_error(result.stderr, "not published", "an initializer also listed as a graph input",
                          "keep the prepare step (it compiles such inputs as constants)")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("check", ["auto", "none"])
def test_ir3_initializers_listed_as_inputs_stay_constants(tmp_path: Path, check: str) -> None:
    source = _ir3_equal_shapes(tmp_path / "ir3.onnx")
    out = tmp_path / "out"
    result = run_cli("compile", source, "-o", out, "--ep", "qnn", "--check", check)
    assert result.returncode == 0, result.stderr
    assert not [line for line in without_progress(result.stderr) if "warning" in line]  # below IR 4 they were never overridable
    compiled = out / "ir3_ctx.onnx"
    assert _inputs_of(compiled) == ["x"]  # (was ["x", "s2"]: the merged shape tensor's input left without its initializer)
    manifest = json.loads((out / "ir3_ctx.manifest.json").read_text())
    assert "constants" not in manifest["prepare"]
    x = np.random.default_rng(3).standard_normal((1, 16)).astype(np.float32)
    [y] = qnn_session(compiled, allow_cpu_nodes=False).run(None, {"x": x})
    np.testing.assert_allclose(y, (x.astype(np.float64) + 0.5) * 2.0, rtol=QNN_RTOL, atol=QNN_ATOL)


def _opset6_exp(path: Path) -> Path:
    graph = helper.make_graph([helper.make_node("Exp", ["x"], ["y"])], "old", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    model.ir_version = 3
    onnx.save(model, str(path))
    return path


def test_opset_6_is_refused_naming_the_opset_and_the_conversion_that_compiles(tmp_path: Path) -> None:
    source = _opset6_exp(tmp_path / "old.onnx")
    result = run_cli("compile", source, "-o", tmp_path / "out", "--ep", "qnn")
    assert result.returncode == 1, result.stderr
    assert_one_line_error(result.stderr, "qnn: the EP took none of this model's nodes: the model is opset 6",
                          "supports opset 7 and above", "onnx.version_converter.convert_version(model, 17)", "--allow-partial")

    from onnx import version_converter

    converted = tmp_path / "new.onnx"
    onnx.save(version_converter.convert_version(onnx.load(str(source)), 17), str(converted))
    result = run_cli("compile", converted, "-o", tmp_path / "out", "--ep", "qnn", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["outputs"][0]["epcontext_nodes"] == 1
    x = np.random.default_rng(0).uniform(-3, 3, (2, 8)).astype(np.float32)
    [y] = qnn_session(tmp_path / "out" / "new_ctx.onnx", allow_cpu_nodes=False).run(None, {"x": x})
    np.testing.assert_allclose(y, np.exp(x.astype(np.float64)), rtol=QNN_RTOL, atol=QNN_ATOL)


def test_a_model_newer_than_onnxruntime_is_refused_with_the_reason_alone(tmp_path: Path) -> None:
    """ORT's text is "Load model from PATH failed:/onnxruntime_src/.../model.cc:256 onnxruntime::Model::Model(<the whole
    C++ signature>) Unsupported model IR version: ..."; the one line keeps the reason (the path is named once, first)."""
    source = _opset6_exp(tmp_path / "new.onnx")
    model = onnx.load(str(source))
    model.ir_version, model.opset_import[0].version = 14, 17
    onnx.save(model, str(source))
    result = run_cli("compile", source, "-o", tmp_path / "out", "--ep", "qnn")
    assert result.returncode == 3, result.stderr
    line = assert_one_line_error(result.stderr, "new.onnx: ONNX Runtime cannot load this model: Unsupported model IR version: 14, max supported IR version:")
    assert "onnxruntime_src" not in line and "Load model from" not in line and line.count("new.onnx") == 1


@pytest.mark.parametrize(("text", "reason"), [
    ("[ONNXRuntimeError] : 1 : FAIL : Load model from /m/x.onnx failed:/onnxruntime_src/onnxruntime/core/graph/model_load_utils.h:46 void "
     "onnxruntime::model_load_utils::ValidateOpsetForDomain(const std::unordered_map<std::__cxx11::basic_string<char>, int>&, const "
     "onnxruntime::logging::Logger&, bool, const std::string&, int) ONNX Runtime only *guarantees* support for models stamped with official "
     "released onnx opset versions. Opset 26 is under development.",
     "ONNX Runtime only *guarantees* support for models stamped with official released onnx opset versions. Opset 26 is under development."),
    ("Exception during initialization: /onnxruntime_src/onnxruntime/core/providers/cpu/text/string_normalizer.cc:235 "
     "onnxruntime::StringNormalizer::Locale::Locale(const std::string&)::<lambda()> Failed to construct locale with name:en_US.UTF-8",
     "Exception during initialization: Failed to construct locale with name:en_US.UTF-8"),
    ("Non-zero status code returned while running PRelu node. Name:'' Status Message: /onnxruntime_src/onnxruntime/core/providers/cpu/math/"
     "element_wise_ops.h:563 void onnxruntime::BroadcastIterator::Init(ptrdiff_t, ptrdiff_t) axis == 1 || axis == largest was false.",
     "Non-zero status code returned while running PRelu node. Name:'' Status Message: axis == 1 || axis == largest was false."),
    ("Load model from a b.onnx failed:This is an invalid model. In Node, (\"\", FooBar, \"\", -1) : (\"x\": tensor(float),) -> (\"y\",) , "
     "Error No Op registered for FooBar with domain_version of 17", "No Op registered for FooBar with domain_version of 17"),
])
def test_ort_reason_keeps_the_cause_without_sources_or_signatures(text: str, reason: str) -> None:
    """Texts of onnxruntime 1.31 (the ONNX backend-test models: opset 26 node tests, StringNormalizer without locales)."""
    from ortcompile.errors import ort_reason

    assert ort_reason(text) == reason


def test_an_ir3_model_whose_constants_are_folded_takes_no_new_inputs(tmp_path: Path) -> None:
    """IR 3 with two equal Constant nodes and no initializer (ONNX's pytorch-converted AvgPool1d, converted to opset 17):
    ORT's optimizer folds them into one initializer and, writing IR 3, lists the folded constants as graph inputs; the
    compiled model then asked for '_v_6' (the check refused it: "Invalid input name"). The prepared model is IR 4."""
    def axes(name: str) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(f"{name}_value", TensorProto.INT64, [1], [3]))

    nodes = [axes("_v_6"), helper.make_node("Unsqueeze", ["x", "_v_6"], ["u"]),
             helper.make_node("AveragePool", ["u"], ["p"], kernel_shape=[2, 1], strides=[2, 1]),
             axes("_v_7"), helper.make_node("Squeeze", ["p", "_v_7"], ["y"])]
    graph = helper.make_graph(nodes, "pool1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 3
    onnx.save(model, str(tmp_path / "pool1d.onnx"))
    result = run_cli("compile", tmp_path / "pool1d.onnx", "-o", tmp_path / "out", "--ep", "qnn")
    assert result.returncode == 0, result.stderr
    compiled = tmp_path / "out" / "pool1d_ctx.onnx"
    assert _inputs_of(compiled) == ["x"]
    x = np.random.default_rng(0).standard_normal((2, 3, 6)).astype(np.float32)
    [y] = qnn_session(compiled, allow_cpu_nodes=False).run(None, {"x": x})
    np.testing.assert_allclose(y, x.reshape(2, 3, 3, 2).mean(axis=3), rtol=QNN_RTOL, atol=QNN_ATOL)


def test_a_float64_model_is_refused_saying_the_ep_takes_no_float64(tmp_path: Path) -> None:
    """ONNX's pytorch-operator models compute in double: QNN takes none of their nodes, and the refusal says why."""
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "f64",
                              [helper.make_tensor_value_info(n, TensorProto.DOUBLE, [2, 3]) for n in ("a", "b")],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(tmp_path / "f64.onnx"))
    result = run_cli("compile", tmp_path / "f64.onnx", "-o", tmp_path / "out", "--ep", "qnn")
    assert result.returncode == 1
    assert_one_line_error(result.stderr, "qnn: the EP took none of this model's nodes: the model computes in float64 (inputs a, b), which qnn "
                          "does not take; export or convert it to float32, or pass --allow-partial")
