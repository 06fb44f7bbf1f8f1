"""Per-node placement (issue 21): when the nodes to keep off QNN are only some of their op type's nodes, the graph is
cut around them (compile/nodecut.py) instead of refusing the whole op type through op_affinity.

The model has two `Log(f(x) + c)` branches: a fragile one, `Log(x*x + 1e-10)` with a min-max normalization (on tones
over silence x*x and 1e-10 fall below fp16's range), and an ordinary one, `Log(sigmoid(100 x) + 1)`. Each op type of
the fragile pattern (Mul, Add, Log) also has a node in the ordinary branch, which must stay in an EPContext node.
Real QNN (HTP simulator) against the CPU EP; correct is judged as an app sees it: the published model in plain
onnxruntime on QNN, against the source on the CPU EP, on tones the compile never saw, by verify's fp16 SNR (20 dB).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from fp16models import BINS, FRAMES, log_frontend_nodes, save_model, save_npy, tones_over_silence
from helpers import cpu_session, qnn_session, run_cli
from onnx import TensorProto, helper, numpy_helper

FP16_SNR_DB = 20.0  # verify's fp16 criterion (readback/criteria.py)
FRAGILE = ["square", "add_eps", "log_tiny"]  # Mul, Add, Log: each op type has another node in the ordinary branch


def two_logs_model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    constants = [numpy_helper.from_array((rng.standard_normal((BINS, 16)) * 0.1).astype(np.float32), "proj_w"),
                 numpy_helper.from_array((rng.standard_normal((BINS, 8)) * 0.1).astype(np.float32), "plain_w"),
                 numpy_helper.from_array(np.array(1e-10, np.float32), "eps"),
                 numpy_helper.from_array(np.array(100.0, np.float32), "hundred"),
                 numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    nodes = [
        helper.make_node("Mul", ["x", "hundred"], ["gained"], name="gain"),
        helper.make_node("Sigmoid", ["gained"], ["squashed"], name="squash"),
        helper.make_node("Add", ["squashed", "one"], ["shifted"], name="add_one"),
        helper.make_node("Log", ["shifted"], ["log_shifted"], name="log_plain"),
        helper.make_node("MatMul", ["log_shifted", "plain_w"], ["z"], name="plain_proj"),
        *log_frontend_nodes("log_tiny"),
    ]
    return save_model(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, FRAMES, BINS])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, FRAMES, 16]),
                       helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, FRAMES, 8])], constants)


@pytest.fixture(scope="module")
def two_logs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("two_logs")
    return two_logs_model(directory / "two_logs.onnx"), save_npy(directory / "tones.npy", tones_over_silence(0))


def _snr_db(got: np.ndarray, want: np.ndarray) -> float:
    noise = float(np.sum((got.astype(np.float64) - want) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(want.astype(np.float64) ** 2)) / noise)


def _published_snr(model: Path, source: Path, inputs: list[np.ndarray]) -> float:
    """Worst SNR over every output of the published model (plain onnxruntime on QNN) against the source on the CPU EP."""
    compiled, reference = qnn_session(model), cpu_session(source)
    return min(_snr_db(g, w) for x in inputs for g, w in zip(compiled.run(None, {"x": x}), reference.run(None, {"x": x})))


def _graph_nodes(model: Path) -> tuple[list[str], int]:
    """The published graph's plain nodes (run on the CPU EP) and its EPContext node count."""
    graph = onnx.load_model(str(model), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type != "EPContext"], sum(n.op_type == "EPContext" for n in graph.node)


def _assert_only_the_fragile_nodes_on_the_cpu(out: Path, source: Path) -> dict:
    model = out / "two_logs_ctx.onnx"
    plain, contexts = _graph_nodes(model)
    assert plain == FRAGILE and contexts == 2  # log_plain, add_one and gain stay inside an EPContext node
    record = json.loads((out / "two_logs_ctx.manifest.json").read_text())["cpu_nodes"]
    assert record["cut"] == FRAGILE and record["op_types"] == [] and record["nodes"] == FRAGILE and record["partitions"] == 1
    realistic = [tones_over_silence(seed) for seed in (1, 2, 3)]
    assert _published_snr(model, source, realistic) >= FP16_SNR_DB
    noise = [np.random.default_rng(seed).standard_normal((1, FRAMES, BINS)).astype(np.float32) for seed in (4, 5)]
    assert _published_snr(model, source, noise) >= FP16_SNR_DB
    return record


def test_cpu_nodes_naming_some_nodes_of_their_op_types_cuts_the_graph(two_logs: tuple[Path, Path], tmp_path: Path) -> None:
    model, tones = two_logs
    out = tmp_path / "out"
    result = run_cli("compile", model, "-o", out, "--ep", "qnn", "--input", f"x={tones}", *(a for n in FRAGILE for a in ("--cpu-nodes", n)))
    assert result.returncode == 0, result.stderr
    assert ("moved to the CPU EP: nodes square (Mul), add_eps (Add), log_tiny (Log) alone, cut out of the graph "
            "(other Add, Log, Mul nodes stay on the EP) (--cpu-nodes); 3 nodes in 1 CPU partition") in result.stdout
    assert "fragment" not in result.stderr  # the cut nodes do not sit between the EP's partitions
    record = _assert_only_the_fragile_nodes_on_the_cpu(out, model)
    assert record["requested"] == FRAGILE and record["rounds"] == []
    manifest = json.loads((out / "two_logs_ctx.manifest.json").read_text())
    assert manifest["options"]["cpu_nodes"] == FRAGILE and "partition" not in manifest["options"]


def test_fallback_auto_moves_only_the_diverging_nodes(two_logs: tuple[Path, Path], tmp_path: Path) -> None:
    model, tones = two_logs
    out = tmp_path / "out"
    result = run_cli("compile", model, "-o", out, "--ep", "qnn", "--input", f"x={tones}", "--fallback", "auto", "--json")
    assert result.returncode == 0, result.stderr
    fallback = json.loads(result.stdout)["outputs"][0]["fallback"]
    assert fallback["summary"].startswith("moved to the CPU EP: nodes square (Mul), add_eps (Add), log_tiny (Log) alone, cut out")
    record = _assert_only_the_fragile_nodes_on_the_cpu(out, model)
    assert record["rounds"][0]["first"] == ["log_tiny"] and record["rounds"][0]["cut"] == []
    assert record["worst_snr_db_before"] < FP16_SNR_DB <= record["worst_snr_db_after"]


def test_a_whole_op_type_stays_with_op_affinity(two_logs: tuple[Path, Path], tmp_path: Path) -> None:
    """`op:Log` names every Log: one compile, no cut; both Logs run on the CPU EP."""
    model, _ = two_logs
    out = tmp_path / "out"
    result = run_cli("compile", model, "-o", out, "--ep", "qnn", "--cpu-nodes", "op:Log", "--check", "load")
    assert result.returncode == 0, result.stderr
    assert "moved to the CPU EP: Log (--cpu-nodes); 2 nodes in 1 CPU partition" in result.stdout
    record = json.loads((out / "two_logs_ctx.manifest.json").read_text())["cpu_nodes"]
    assert record["op_types"] == ["Log"] and record["cut"] == [] and sorted(record["nodes"]) == ["log_plain", "log_tiny"]
    assert sorted(_graph_nodes(out / "two_logs_ctx.onnx")[0]) == ["log_plain", "log_tiny"]


def test_cpu_nodes_with_partition_cuts_by_the_budget_and_around_the_nodes(two_logs: tuple[Path, Path], tmp_path: Path) -> None:
    """--partition with --cpu-nodes: the parts of the budget (cut before `proj`) and the pinned nodes' own part."""
    model, tones = two_logs
    out = tmp_path / "out"
    result = run_cli("compile", model, "-o", out, "--ep", "qnn", "--input", f"x={tones}", "--partition", "5000",
                     *(a for n in FRAGILE for a in ("--cpu-nodes", n)))
    assert result.returncode == 0, result.stderr
    assert "compiling part 4/4" in result.stderr
    manifest = json.loads((out / "two_logs_ctx.manifest.json").read_text())
    assert [p["nodes"] for p in manifest["parts"]] == [[0, 5], [5, 8], [8, 13], [13, 14]] and manifest["parts"][1]["epcontext"] == 0
    assert manifest["options"]["partition"]["budget"] == 5000 and manifest["options"]["cpu_nodes"] == FRAGILE
    assert _graph_nodes(out / "two_logs_ctx.onnx") == (FRAGILE, 3)
    assert manifest["cpu_nodes"]["cut"] == FRAGILE and manifest["cpu_nodes"]["nodes"] == FRAGILE
    assert _published_snr(out / "two_logs_ctx.onnx", model, [tones_over_silence(seed) for seed in (1, 2)]) >= FP16_SNR_DB


def test_fallback_auto_with_partition_is_refused_naming_why_and_what_instead(two_logs: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = two_logs
    result = run_cli("compile", model, "-o", tmp_path / "refused", "--ep", "qnn", "--fallback", "auto", "--partition", "auto")
    assert result.returncode == 2 and not (tmp_path / "refused").exists()
    assert "--fallback auto does not work with --partition yet: it finds the nodes to move by compiling the whole graph" in result.stderr
    assert "compile without --partition, or keep it and name the nodes with --cpu-nodes NODE" in result.stderr


def test_a_cut_too_narrow_is_widened_over_rounds(two_logs: tuple[Path, Path], tmp_path: Path) -> None:
    """`--cpu-nodes log_tiny` alone is worse (the EP flushes the epsilon before the CPU's Log: -inf); the rounds,
    localized with the cut nodes on the CPU EP, move what feeds it, node by node, and never the ordinary branch."""
    model, tones = two_logs
    out = tmp_path / "out"
    result = run_cli("compile", model, "-o", out, "--ep", "qnn", "--input", f"x={tones}", "--cpu-nodes", "log_tiny", "--fallback", "auto")
    assert result.returncode == 0, result.stderr
    assert "fallback: moving node add_eps (Add) alone" in result.stderr and "fallback: moving node square (Mul) alone" in result.stderr
    record = _assert_only_the_fragile_nodes_on_the_cpu(out, model)
    assert [r["cut"] for r in record["rounds"]] == [["log_tiny"], ["add_eps", "log_tiny"]] and record["requested"] == ["log_tiny"]


def test_plain_partition_refusal_offers_only_what_partition_takes(two_logs: tuple[Path, Path], tmp_path: Path) -> None:
    """A refused check names only next steps the same command accepts: --partition takes --cpu-nodes but refuses
    --fallback auto (a --share-weights batch takes neither; its check cannot run on the HTP simulator here)."""
    model, tones = two_logs
    parted = run_cli("compile", model, "-o", tmp_path / "parted", "--ep", "qnn", "--input", f"x={tones}", "--partition", "5000")
    assert parted.returncode == 1, parted.stderr
    error = next(line for line in parted.stderr.splitlines() if line.startswith("ortcompile: error:"))
    assert "not published: output 'y' differs" in error and "next: --cpu-nodes NODES to keep the diverging nodes on the CPU EP" in error
    assert "--fallback" not in error and not (tmp_path / "parted" / "two_logs_ctx.onnx").exists()


def test_split_refuses_cpu_nodes_naming_what_works(two_logs: tuple[Path, Path], tmp_path: Path) -> None:
    """The parts plan cannot carry pins: split says so rather than dropping them."""
    model, _ = two_logs
    result = run_cli("split", model, "-o", tmp_path / "split", "--ep", "qnn", "--cpu-nodes", "log_tiny")
    assert result.returncode == 2 and not (tmp_path / "split").exists()
    assert "compile the model with --partition --cpu-nodes NODE" in result.stderr


def test_partition_refusal_offers_cpu_nodes_not_fallback_auto(two_logs: tuple[Path, Path], tmp_path: Path) -> None:
    """`op:Log` alone is not enough (the EP flushes the epsilon before the CPU's Log): refused, and the next step is
    one that works with --partition; the parts' own fragmentation is not warned about, the stitched graph's is."""
    model, tones = two_logs
    result = run_cli("compile", model, "-o", tmp_path / "out", "--ep", "qnn", "--input", f"x={tones}", "--partition", "5000",
                     "--cpu-nodes", "op:Log")
    assert result.returncode == 1, result.stderr
    error = next(line for line in result.stderr.splitlines() if line.startswith("ortcompile: error:"))
    assert "not published: output 'y' differs" in error and "next: --cpu-nodes NODE for more nodes to keep on the CPU EP" in error
    assert "--fallback auto to move" not in error and not (tmp_path / "out" / "two_logs_ctx.onnx").exists()
    assert "two_logs.onnx: the qnn graph is fragmented" in result.stderr and "part00.onnx: the qnn graph is fragmented" not in result.stderr
