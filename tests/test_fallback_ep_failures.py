"""`--fallback auto` when the EP fails on the graph it compiled: it crashes running it, or cannot load it (fallback.Probe).

The crash is QNN's own, measured here: an AveragePool 7x7 with asymmetric pads (0, 0, 1, 1) on a 256-channel 7x7 map
kills the HTP simulator with SIGSEGV on the first run (as in ONNX's "light" Inception-v1, 1024 channels; with 64
channels it computes wrong values instead, which the check's comparison refuses). Nothing is mocked: each round is a
real compile and a real check on the simulator.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from helpers import assert_one_line_error, cpu_session, qnn_session, run_cli, without_progress
from onnx import TensorProto, helper

from ortcompile.compile.cpunodes import CpuPins
from ortcompile.compile.fallback import MAX_PROBES, probe_candidates


def _save(path: Path, nodes: list[onnx.NodeProto], inputs: dict[str, list[int]], outputs: dict[str, list[int]], opset: int = 17) -> Path:
    """A float model of `nodes` (inputs and outputs by name and shape), at an IR version onnxruntime 1.31 reads."""
    def values(shapes: dict[str, list[int]]) -> list[onnx.ValueInfoProto]:
        return [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in shapes.items()]

    graph = helper.make_graph(nodes, path.stem, values(inputs), values(outputs))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10), str(path))
    return path


def _crashing_pool(path: Path) -> Path:
    """Abs -> Relu -> AveragePool (the crash) -> Relu: the search tries Abs first (fewest nodes, then by name)."""
    nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("AveragePool", ["r"], ["p"], kernel_shape=[7, 7], strides=[1, 1], pads=[0, 0, 1, 1]),
             helper.make_node("Relu", ["p"], ["y"])]
    return _save(path, nodes, {"x": [1, 256, 7, 7]}, {"y": [1, 256, 2, 2]})


def _refused(source: Path, out: Path, *needles: str) -> None:
    """A default QNN compile of `source`: exit 1, one line naming `needles`, nothing published."""
    result = run_cli("compile", source, "-o", out, "--ep", "qnn")
    assert result.returncode == 1
    assert_one_line_error(result.stderr, *needles)
    assert not out.exists() or not any(out.iterdir())


def test_a_crash_on_the_compiled_graph_is_refused_with_the_way_to_find_its_op(tmp_path: Path) -> None:
    _refused(_crashing_pool(tmp_path / "pool.onnx"), tmp_path / "out", "the qnn EP crashed (SIGSEGV) while running the compiled pool_ctx.onnx",
             "next: --fallback auto to find the op type the EP fails on and keep it on the CPU EP, or --cpu-nodes op:TYPE")


def test_fallback_auto_finds_the_op_type_the_ep_crashes_on_and_keeps_it_on_the_cpu(tmp_path: Path) -> None:
    source = _crashing_pool(tmp_path / "pool.onnx")
    out = tmp_path / "out"
    result = run_cli("compile", source, "-o", out, "--ep", "qnn", "--fallback", "auto", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["outputs"][0]
    assert report["remaining_ops"] == {"AveragePool": 1} and report["epcontext_nodes"] == 2
    assert report["fallback"]["summary"] == ("moved to the CPU EP: AveragePool (--fallback auto, 2 rounds); 1 node in 1 CPU partition; "
                                             f"the EP failed on the graph as first compiled; check worst SNR {report['fallback']['worst_snr_db_after']:.1f} dB")
    manifest = json.loads((out / "pool_ctx.manifest.json").read_text())["cpu_nodes"]
    assert manifest["op_types"] == ["AveragePool"] and manifest["nodes"] == ["p"]
    crash = "the qnn EP crashed (SIGSEGV) while running the compiled pool_ctx.onnx"
    assert [(r["op_types"], r["ep_failure"]) for r in manifest["rounds"]] == [([], crash), (["Abs"], crash)]

    compiled = qnn_session(Path(report["model"]))  # plain onnxruntime: loads, runs, and computes what the source does
    reference = cpu_session(source)
    for seed in (0, 1):
        x = np.random.default_rng(seed).standard_normal((1, 256, 7, 7)).astype(np.float32)
        np.testing.assert_allclose(compiled.run(None, {"x": x})[0], reference.run(None, {"x": x})[0], rtol=5e-3, atol=5e-3)


def test_fallback_auto_refuses_when_no_single_op_type_helps(tmp_path: Path) -> None:
    """Overridable weights compiled with --no-prepare: QNN cannot load any graph with them (compile/defaults.py);
    each op type it took is tried alone, then the refusal says what was tried and keeps the EP's reason."""
    from test_legacy_models import _keep_initializers_as_inputs

    source = _keep_initializers_as_inputs(tmp_path / "keep.onnx")
    result = run_cli("compile", source, "-o", tmp_path / "out", "--ep", "qnn", "--no-prepare", "--fallback", "auto")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    [line] = [x for x in without_progress(result.stderr) if x.startswith("ortcompile: error:")]  # (and the rounds' fragmentation warnings)
    assert "The count of graph inputs should be at least the count of tensor_wrapper" in line and "keep the prepare step" in line
    assert line.endswith("; --fallback auto moved each of Add, Conv, Flatten, MatMul, Relu to the CPU EP alone, and the EP still failed "
                         "(-v shows its log)"), line
    tried = [x for x in result.stderr.splitlines() if x.startswith("ortcompile: fallback:")]
    ops = ("Add", "Conv", "Flatten", "MatMul", "Relu")  # one node each: by name
    assert tried == [f"ortcompile: fallback: the EP failed on the compiled graph; trying {op} on the CPU EP" for op in ops]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_probe_candidates_are_the_ops_the_ep_took_fewest_nodes_first() -> None:
    nodes = [helper.make_node(op, ["x"], ["x"]) for op in ["Relu", "Relu", "Conv", "Abs", "Constant", "Gather", "Relu"]]
    model = helper.make_model(helper.make_graph(nodes, "g", [], []))
    assert probe_candidates(model, CpuPins(), {}) == ["Abs", "Conv", "Gather", "Relu"]  # Constant: folded away by prepare
    assert probe_candidates(model, CpuPins(op_types=("Conv",)), {"Gather": 1}) == ["Abs", "Relu"]  # pinned, or left on the CPU
    many = helper.make_model(helper.make_graph([helper.make_node(f"Op{i:02d}", [], []) for i in range(20)], "g", [], []))
    assert len(probe_candidates(many, CpuPins(), {})) == MAX_PROBES


def test_a_pool_the_ep_crashes_on_or_computes_garbage_with_is_always_a_one_line_refusal(tmp_path: Path) -> None:
    """ONNX's averagepool_2d_same_upper node test: QNN's AveragePool with SAME_UPPER pads either crashes the simulator
    or returns garbage (SNR -81 dB), run to run. Whichever it does, in the check or in the localization's diagnostic
    run after it (which crashed into an internal error, exit 70, before: seen in 1 of 3 runs), the refusal is one line,
    exit 1."""
    _save(tmp_path / "same.onnx", [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], auto_pad="SAME_UPPER")],
          {"x": [1, 3, 32, 32]}, {"y": [1, 3, 32, 32]})
    for attempt in range(4):
        result = run_cli("compile", tmp_path / "same.onnx", "-o", tmp_path / f"out{attempt}", "--ep", "qnn")
        assert result.returncode == 1, result.stderr
        line = assert_one_line_error(result.stderr)
        assert "crashed (SIGSEGV)" in line or "differs from the source" in line, line


def _grid_sample_3d(path: Path) -> Path:
    """Relu -> 3-D GridSample -> Sigmoid: ONNX Runtime's layout transform rewrites the GridSample into NHWC for QNN,
    which then does not take it (ONNX's gridsample_volumetric node tests): a graph no EP can run."""
    nodes = [helper.make_node("Relu", ["X"], ["r"]), helper.make_node("GridSample", ["r", "Grid"], ["g"], mode="linear", align_corners=0),
             helper.make_node("Sigmoid", ["g"], ["Y"])]
    return _save(path, nodes, {"X": [1, 1, 3, 2, 2], "Grid": [1, 2, 4, 2, 3]}, {"Y": [1, 1, 2, 4, 2]}, opset=22)


def test_an_op_whose_nhwc_form_the_ep_refuses_is_named_and_moved_by_fallback_auto(tmp_path: Path) -> None:
    source = _grid_sample_3d(tmp_path / "grid.onnx")
    _refused(source, tmp_path / "refused", "qnn: compilation failed: qnn refused the NHWC GridSample ONNX Runtime's layout transform made for it",
             "keep GridSample on the CPU EP: --cpu-nodes op:GridSample, or --fallback auto")

    result = run_cli("compile", source, "-o", tmp_path / "out", "--ep", "qnn", "--fallback", "auto", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["outputs"][0]
    assert report["remaining_ops"] == {"GridSample": 1} and report["epcontext_nodes"] == 2
    [round_] = report["fallback"]["rounds"]
    assert round_["op_types"] == [] and "refused the NHWC GridSample" in round_["ep_failure"]
    rng = np.random.default_rng(0)
    feeds = {"X": rng.standard_normal((1, 1, 3, 2, 2)).astype(np.float32), "Grid": rng.uniform(-1, 1, (1, 2, 4, 2, 3)).astype(np.float32)}
    np.testing.assert_allclose(qnn_session(Path(report["model"])).run(None, feeds)[0], cpu_session(source).run(None, feeds)[0], rtol=5e-3, atol=5e-3)
