"""The prepare step on graphs whose outputs are not all tensors (ONNX sequences).

Prepare copies the output shapes ONNX shape inference finds into the graph's declared outputs. Writing a tensor
shape into a sequence-typed output turned it into a tensor of no element type, and ONNX Runtime refused the prepared
graph ("Invalid tensor data type 0"), reported as pins that make the model unloadable although nothing was pinned
(found compiling ONNX's SplitToSequence node tests).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from helpers import QNN_ATOL, QNN_RTOL, qnn_session, run_cli
from onnx import TensorProto, helper


def _relu_and_a_sequence(path: Path) -> Path:
    """y = Relu(x) * 2 (QNN takes it) and seq = SplitToSequence(y) (a sequence output, left on the CPU EP)."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "two"], ["y"]),
             helper.make_node("SplitToSequence", ["y"], ["seq"], axis=1, keepdims=0)]
    sequence = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 6]), sequence], [two])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_a_sequence_output_stays_a_sequence_through_prepare(tmp_path: Path) -> None:
    source = _relu_and_a_sequence(tmp_path / "seq.onnx")
    result = run_cli("compile", source, "-o", tmp_path / "out", "--ep", "qnn", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["outputs"][0]
    assert report["epcontext_nodes"] == 1 and report["remaining_ops"] == {"SplitToSequence": 1}
    compiled = onnx.load(report["model"], load_external_data=False)
    assert compiled.graph.output[1].type.HasField("sequence_type")
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    y, seq = qnn_session(Path(report["model"])).run(None, {"x": x})
    want = np.maximum(x, 0) * 2
    np.testing.assert_allclose(y, want, rtol=QNN_RTOL, atol=QNN_ATOL)
    assert len(seq) == 6 and all(np.allclose(part, want[:, i], rtol=QNN_RTOL, atol=QNN_ATOL) for i, part in enumerate(seq))
