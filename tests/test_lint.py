"""fp16 lint (ortcompile/readback/lint.py): the patterns an fp16 EP gets wrong, found by node name from the graph alone;
`ortcompile inspect --lint` (text and --json)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from fp16models import gem_model, log_frontend_model
from genmodels import run_cli
from onnx import TensorProto, helper, numpy_helper

from ortcompile.readback.lint import lint_model, lint_path


def _model(nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto], shape: list[int] | None = None) -> onnx.ModelProto:
    shape = shape or [1, 2048]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _const(name: str, value: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, np.float32), name)


def _found(model: onnx.ModelProto) -> dict[str, tuple[str, ...]]:
    return {f"{f.rule}:{f.node}": f.nodes for f in lint_model(model)}


def test_log_of_square_plus_tiny_epsilon_names_the_log_and_its_pattern(tmp_path: Path) -> None:
    findings = lint_path(str(log_frontend_model(tmp_path / "frontend.onnx")))
    assert [(f.rule, f.node, f.op_type) for f in findings] == [("tiny-epsilon", "log", "Log")]
    assert findings[0].nodes == ("log", "add_eps", "square")  # moved together by the fallback
    assert "1e-10" in findings[0].message and findings[0].severity == "warning"


def test_gem_pooling_is_one_finding_naming_its_three_nodes(tmp_path: Path) -> None:
    findings = lint_path(str(gem_model(tmp_path / "gem.onnx")))
    assert [(f.rule, f.node) for f in findings] == [("gem-pooling", "gem_pow")]
    assert findings[0].nodes == ("gem_pow", "gem_mean", "gem_root")
    # the Max(x, 1e-6) before a cube guards nothing: not a tiny-epsilon finding


def test_epsilon_fp16_can_hold_and_divisor_only_rules() -> None:
    safe = _model([helper.make_node("Add", ["x", "eps"], ["s"], name="add"), helper.make_node("Sqrt", ["s"], ["y"], name="sqrt")],
                  [_const("eps", 1e-3)])
    assert _found(safe) == {}
    numerator = _model([helper.make_node("Add", ["x", "eps"], ["s"], name="add"), helper.make_node("Div", ["s", "x"], ["y"], name="div")],
                       [_const("eps", 1e-8)])
    assert _found(numerator) == {}  # an epsilon in the numerator protects nothing
    divisor = _model([helper.make_node("Add", ["x", "eps"], ["s"], name="add"), helper.make_node("Div", ["x", "s"], ["y"], name="div")],
                     [_const("eps", 1e-8)])
    assert list(_found(divisor)) == ["tiny-epsilon:div"]
    variance = _model([helper.make_node("Mul", ["x", "x"], ["sq"], name="sq"),
                       helper.make_node("ReduceMean", ["sq"], ["var"], name="var", keepdims=1),
                       helper.make_node("Add", ["var", "eps"], ["s"], name="add"), helper.make_node("Sqrt", ["s"], ["y"], name="std")],
                      [_const("eps", 1e-5)], shape=[1, 64])
    # a LayerNorm's var + 1e-5: a note, not a warning (PP-OCRv4's are right on the HTP)
    assert [(f.rule, f.node, f.severity) for f in lint_model(variance)] == [("tiny-epsilon", "std", "note")]


def test_unguarded_exp_large_exponent_sum_of_squares_and_overflowing_constant() -> None:
    model = _model([
        helper.make_node("Exp", ["x"], ["e"], name="exp"),
        helper.make_node("Pow", ["e", "four"], ["p4"], name="pow4"),
        helper.make_node("Mul", ["x", "x"], ["sq"], name="sq"),
        helper.make_node("ReduceMean", ["sq"], ["ms"], name="rms_mean", keepdims=1),
        helper.make_node("Add", ["ms", "mask"], ["y"], name="masked"),
    ], [_const("four", 4.0), _const("mask", -1e9)])
    found = _found(model)
    assert set(found) == {"unguarded-exp:exp", "large-exponent:pow4", "sum-of-squares:rms_mean", "fp16-overflow-constant:masked"}
    assert found["sum-of-squares:rms_mean"] == ("rms_mean", "sq")


def test_guarded_exp_and_small_reductions_are_not_reported() -> None:
    model = _model([
        helper.make_node("ReduceMax", ["x"], ["m"], name="max", keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["d"], name="shift"),
        helper.make_node("Exp", ["d"], ["e"], name="exp"),
        helper.make_node("Mul", ["e", "e"], ["sq"], name="sq"),
        helper.make_node("ReduceSum", ["sq"], ["y"], name="sum", keepdims=1),
    ], [], shape=[1, 64])
    assert _found(model) == {}


def test_inspect_lint_text_and_json(tmp_path: Path) -> None:
    model = log_frontend_model(tmp_path / "frontend.onnx")
    text = run_cli("inspect", model, "--lint")
    assert text.returncode == 0, text.stderr
    assert "fp16 lint: 1 finding" in text.stdout and "warning: log (Log)" in text.stdout and "[tiny-epsilon]" in text.stdout
    document = json.loads(run_cli("inspect", model, "--lint", "--json").stdout)
    assert document["lint"] == [{"rule": "tiny-epsilon", "node": "log", "op_type": "Log", "severity": "warning",
                                 "nodes": ["log", "add_eps", "square"], "message": document["lint"][0]["message"]}]


def test_isnan_is_a_note_because_qnn_answers_true_for_inf(tmp_path: Path) -> None:
    """The note's claim, measured on the HTP simulator: IsNaN(±inf) is true there, false on the CPU EP."""
    graph = helper.make_graph([helper.make_node("IsNaN", ["x"], ["y"], name="isnan")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])], [helper.make_tensor_value_info("y", TensorProto.BOOL, [6])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert [(f.rule, f.node, f.severity) for f in lint_model(model)] == [("isnan-inf", "isnan", "note")]

    from helpers import cpu_session, qnn_session

    onnx.save(model, str(tmp_path / "isnan.onnx"))
    result = run_cli("compile", tmp_path / "isnan.onnx", "-o", tmp_path / "out", "--ep", "qnn", "-v")
    assert result.returncode == 0, result.stderr  # the check's inputs hold no NaN or inf: nothing tells them apart
    assert "fp16 lint: isnan (IsNaN): IsNaN on QNN's HTP is true for ±inf too" in result.stderr
    x = np.array([-1.5, np.nan, np.inf, 2.5, -np.inf, 0.0], np.float32)
    assert cpu_session(tmp_path / "isnan.onnx").run(None, {"x": x})[0].tolist() == [False, True, False, False, False, False]
    assert qnn_session(tmp_path / "out" / "isnan_ctx.onnx").run(None, {"x": x})[0].tolist() == [False, True, True, False, True, False]
