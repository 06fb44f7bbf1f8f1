"""Prepare reads the weights it cannot change in place (issue 22): same graph, same bytes, fewer written.

Each test prepares one model twice with real ORT: the ordinary way (every weight re-written by ORT's optimizer)
and the in-place way, and compares the two graphs with every tensor's bytes resolved.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortcompile.compile.prepare import prepare_model
from ortcompile.plan.shapes import Pins
from ortcompile.plan.source import read_source

WEIGHT = (256, 256)  # 256 KiB of float32: over inplace.MIN_BYTES


def _patterns_model(path: Path, quantized: bool = False) -> Path:
    """Set-aside weights (MatMul, shared MatMul, Gemm, Gather, MatMul+Add -> Gemm, a Transpose pair before a MatMul)
    beside ones the optimizer changes or must read (a folded MatMul, a folded Transpose, an Add operand)."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.05).astype(np.float32), name)

    inits = [weight(n, *WEIGHT) for n in ("W1", "W2", "W3", "Wg", "Wf", "Wa", "Wt")]
    inits += [weight("E", 1000, 256), weight("C", 1, 256), weight("b", 256)]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"]),
        helper.make_node("Add", ["h1", "b"], ["h1b"]),
        helper.make_node("MatMul", ["h1b", "W1"], ["h2"]),
        helper.make_node("Transpose", ["h2"], ["h2t"], perm=[1, 0]),
        helper.make_node("Transpose", ["h2t"], ["h2tt"], perm=[1, 0]),
        helper.make_node("MatMul", ["h2tt", "W2"], ["h3"]),
        helper.make_node("Gemm", ["h3", "Wg"], ["h4"], transB=1),
        helper.make_node("Gather", ["E", "ids"], ["e"], axis=0),
        helper.make_node("MatMul", ["C", "Wf"], ["cf"]),
        helper.make_node("Add", ["h4", "cf"], ["h5"]),
        helper.make_node("Add", ["h5", "e"], ["h6"]),
        helper.make_node("Add", ["h6", "Wa"], ["h7"]),
        helper.make_node("Transpose", ["Wt"], ["Wtt"], perm=[1, 0]),
        helper.make_node("MatMul", ["h7", "Wtt"], ["h8"]),
        helper.make_node("MatMul", ["h8", "W3"], ["y"]),
    ]
    if quantized:  # a QDQ pair on the activation: WeightBiasQuantization may read weight values
        inits += [numpy_helper.from_array(np.array(0.1, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "z")]
        nodes[-1:] = [helper.make_node("QuantizeLinear", ["h8", "s", "z"], ["q"]),
                      helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"]),
                      helper.make_node("MatMul", ["dq", "W3"], ["y"])]
    graph = helper.make_graph(nodes, "patterns", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 256]),
                                                  helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 256])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True, location=f"{path.name}.data", size_threshold=1024)
    return path


def _prepare(source: Path, out_dir: Path, in_place: bool) -> tuple[Path, dict[str, Path]]:
    paths = read_source(source).external_paths if in_place else None
    prepared, _, files = prepare_model(source, Pins(named={"n": 256}), out_dir, 1024, source_paths=paths)
    return prepared, files


def _view(prepared: Path, files: dict[str, Path]) -> dict[str, Any]:
    """The prepared graph with each tensor's bytes (resolved through the data files it names) as a digest."""
    model = onnx.load_model(str(prepared), load_external_data=False)

    def digest(tensor: TensorProto) -> str:
        if tensor.data_location != TensorProto.EXTERNAL:
            return hashlib.sha256(numpy_helper.to_array(tensor).tobytes()).hexdigest()
        info = {e.key: e.value for e in tensor.external_data}
        with open(files[info["location"]], "rb") as data:
            data.seek(int(info.get("offset", 0)))
            return hashlib.sha256(data.read(int(info["length"]))).hexdigest()

    return {"nodes": [str(n) for n in model.graph.node], "inputs": [str(i) for i in model.graph.input],
            "outputs": [str(o) for o in model.graph.output], "value_info": [str(v) for v in model.graph.value_info],
            "opsets": [str(o) for o in model.opset_import],
            # the in-place graph lists the set-aside weights after the ones ORT wrote (inplace.py): the same set
            "initializers": sorted((t.name, list(t.dims), t.data_type, digest(t)) for t in model.graph.initializer)}


def test_in_place_prepare_is_the_ordinary_graph_with_fewer_bytes_written(tmp_path: Path) -> None:
    source = _patterns_model(tmp_path / "src" / "patterns.onnx")
    ordinary, ordinary_files = _prepare(source, tmp_path / "ordinary", in_place=False)
    in_place, in_place_files = _prepare(source, tmp_path / "inplace", in_place=True)
    assert _view(in_place, in_place_files) == _view(ordinary, ordinary_files)
    # W1, W2, W3, Wg and E stay in the source's file (a hard link of it); the folded and the Add-read ones are written
    links = [p for p in in_place_files.values() if p.name != f"{in_place.name}.data"]
    assert [p.stat().st_ino for p in links] == [(source.parent / f"{source.name}.data").stat().st_ino]
    written = (in_place.parent / f"{in_place.name}.data").stat().st_size
    assert written < (ordinary.parent / f"{ordinary.name}.data").stat().st_size - 5 * 256 * 1024 + 4096
    assert sorted(p.name for p in in_place.parent.iterdir()) == sorted([in_place.name, f"{in_place.name}.data", *(p.name for p in links)])


def test_a_model_whose_weights_the_optimizer_may_read_is_prepared_the_ordinary_way(tmp_path: Path) -> None:
    source = _patterns_model(tmp_path / "src" / "quantized.onnx", quantized=True)
    ordinary, ordinary_files = _prepare(source, tmp_path / "ordinary", in_place=False)
    in_place, in_place_files = _prepare(source, tmp_path / "inplace", in_place=True)
    assert list(in_place_files) == [f"{in_place.name}.data"]
    assert _view(in_place, in_place_files) == _view(ordinary, ordinary_files)


def test_prepare_for_qnn_keeps_the_matmul_add_pairs_qnn_compiles_faster(tmp_path: Path) -> None:
    """ORT's MatMulAddFusion is left out for QNN (epfixes.py: QNN compiles a Gemm slower than the MatMul + Add it
    replaces); folding is as before, and the in-place prepare is still the ordinary one with fewer bytes written."""
    source = _patterns_model(tmp_path / "src" / "patterns.onnx")
    paths = read_source(source).external_paths
    _, generic, _ = prepare_model(source, Pins(named={"n": 256}), tmp_path / "generic", 1024, source_paths=paths)
    qnn = {}
    for name, in_place in (("ordinary", None), ("inplace", paths)):
        prepared, summary, files = prepare_model(source, Pins(named={"n": 256}), tmp_path / name, 1024, ep_name="QNNExecutionProvider",
                                                 source_paths=in_place)
        qnn[name] = (_view(prepared, files), summary)
    assert qnn["inplace"][0] == qnn["ordinary"][0]
    summary = qnn["inplace"][1]
    assert generic.added_ops == {"Gemm": 1} and generic.removed_ops["Add"] >= 1  # MatMul(x, W1) + Add(b) fused
    assert "Gemm" not in summary.added_ops and summary.removed_ops.get("Add", 0) == generic.removed_ops["Add"] - 1
    assert summary.removed_ops.get("MatMul", 0) == generic.removed_ops["MatMul"] - 1  # the other folds happened alike
    assert summary.to_record()["disabled_optimizers"] == ["MatMulAddFusion"] and "disabled_optimizers" not in generic.to_record()
