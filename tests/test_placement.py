"""Placement: which EP runs which node, what the EP refused and why — `compile -v`, `compile --json`, `inspect --placement`.

Real onnxruntime and the real QNN EP (its HTP simulator): split.onnx has four nodes QNN takes (MatMul x3, Relu)
and two it refuses (Mod with fmod=1, Sinh), so its compiled form has 3 EPContext nodes and 2 nodes on the CPU EP.
The copy used here has named nodes, so the names in the reports can be checked against the graph.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import onnx
import pytest
from helpers import FIXTURES, assert_one_line_error, cpu_only_model, epcontext_nodes, run_cli

from ortcompile.readback.placement import refusal_reasons

QNN = "QNNExecutionProvider"
CPU = "CPUExecutionProvider"
NAMES = ["matmul_1", "relu", "mod", "matmul_2", "sinh", "matmul_3"]  # split.onnx's nodes, in graph order


@pytest.fixture(scope="module")
def named_split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = onnx.load(str(FIXTURES / "split.onnx"))
    for node, name in zip(model.graph.node, NAMES):
        node.name = name
    path = tmp_path_factory.mktemp("src") / "named.onnx"
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def compiled(named_split: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    """One `compile -v --json` of the named split model: (compiled model, its --json entry, stderr)."""
    out = tmp_path_factory.mktemp("out")
    proc = run_cli("compile", named_split, "-o", out, "-v", "--json")
    assert proc.returncode == 0, proc.stderr
    return out / "named_ctx.onnx", json.loads(proc.stdout)["outputs"][0], proc.stderr


def ok(*args: object) -> subprocess.CompletedProcess[str]:
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    return proc


def inspect_placement(model: Path, *extra: object) -> dict:
    return json.loads(ok("inspect", model, "--placement", "--json", *extra).stdout)["placement"]


def epcontext_names(model: Path) -> list[str]:
    return [n.name for n in epcontext_nodes(onnx.load(str(model), load_external_data=False))]


# ---------------------------------------------------------------- compile --json and -v


def test_compile_json_places_every_node_by_name(compiled: tuple[Path, dict, str]) -> None:
    model, result, _ = compiled
    check = result["check"]
    assert check["placement"] == {CPU: {"Mod": 1, "Sinh": 1}, QNN: {"EPContext": 3}}
    nodes = check["placement_nodes"]
    assert [(n["name"], n["op_type"]) for n in nodes[CPU]] == [("mod", "Mod"), ("sinh", "Sinh")]
    assert [n["name"] for n in nodes[QNN]] == epcontext_names(model) and {n["domain"] for n in nodes[QNN]} == {"com.microsoft"}
    manifest = json.loads(model.with_name("named_ctx.manifest.json").read_text())
    assert result["compiled_ops"] == manifest["nodes"]["compiled_ops"] == {"MatMul": 3, "Relu": 1}
    assert result["remaining_ops"] == {"Mod": 1, "Sinh": 1} and result["cpu_nodes"] == 2


def test_compile_json_carries_the_target_and_the_compatibility_verdict(compiled: tuple[Path, dict, str]) -> None:
    model, result, _ = compiled
    manifest = json.loads(model.with_name("named_ctx.manifest.json").read_text())
    assert result["target"] == manifest["target"] and result["target"]["name"] == "sc8380xp"
    compatibility = result["compatibility"]
    (qnn,) = compatibility["eps"]
    # onnxruntime-qnn 2.7.0 judges only against NPU devices; here its device is the HTP simulator on the CPU.
    assert compatibility["verdict"] == qnn["verdict"] == "unknown" and "NPU" in qnn["reason"]
    assert qnn["ep_name"] == QNN and qnn["decoded"]["soc_model"] == "60" and qnn["decoded"]["targets"] == ["sc8380xp"]
    assert compatibility["epcontext_nodes"] == 3 and result["timings"]["compatibility"] > 0


def test_compile_verbose_lists_what_each_ep_runs_and_what_qnn_refused(compiled: tuple[Path, dict, str], named_split: Path) -> None:
    stderr = compiled[2]
    assert "ortcompile: named.onnx: QNNExecutionProvider runs 3 nodes (EPContext 3, compiled from MatMul 3, Relu 1)" in stderr
    assert "ortcompile: named.onnx: CPUExecutionProvider runs 2 nodes (Mod 1, Sinh 1)" in stderr
    refused = next(line for line in stderr.splitlines() if "refused" in line)
    assert refused.startswith("ortcompile: named.onnx: QNNExecutionProvider refused Mod 1, Sinh 1; they run on the CPU EP")
    assert f"ortcompile inspect {named_split} --placement --ep qnn" in refused


def test_summary_line_says_how_many_nodes_run_on_the_cpu(tmp_path: Path) -> None:
    split = ok("compile", FIXTURES / "split.onnx", "-o", tmp_path / "split").stdout.strip()
    assert split.endswith(", 2 nodes on CPU (QNNExecutionProvider)") and "3 EPContext nodes, 2 files" in split
    mlp = ok("compile", FIXTURES / "mlp.onnx", "-o", tmp_path / "mlp").stdout.strip()
    assert "1 EPContext node, 1 file," in mlp and "on CPU" not in mlp  # QNN runs all of it
    sinh = cpu_only_model(tmp_path / "sinh.onnx")
    partial = ok("compile", sinh, "-o", tmp_path / "sinh", "--allow-partial").stdout.strip()
    assert "0 EPContext nodes, 1 file," in partial and partial.endswith(", 1 node on CPU (QNNExecutionProvider)")


def test_without_the_check_placement_comes_from_the_graph(tmp_path: Path) -> None:
    proc = ok("compile", FIXTURES / "split.onnx", "-o", tmp_path, "--check", "none", "-v")
    assert ("ortcompile: split.onnx: placement not checked (no pre-publish check ran): 3 EPContext nodes, compiled from MatMul 3, Relu 1; "
            "left outside them: Mod 1, Sinh 1") in proc.stderr
    assert proc.stdout.strip().endswith(", 2 nodes on CPU (QNNExecutionProvider)")


# ---------------------------------------------------------------- inspect --placement


def test_inspect_placement_of_a_compiled_model(compiled: tuple[Path, dict, str]) -> None:
    model = compiled[0]
    placement = inspect_placement(model)
    assert (placement["ep"], placement["target"], placement["compiled"]) == (QNN, "sc8380xp", True)
    assert placement["eps"][QNN]["ops"] == {"EPContext": 3} and [n["name"] for n in placement["eps"][QNN]["nodes"]] == epcontext_names(model)
    assert placement["eps"][CPU]["ops"] == {"Mod": 1, "Sinh": 1} and [n["name"] for n in placement["eps"][CPU]["nodes"]] == ["mod", "sinh"]
    assert placement["refused"] == {"Mod": 1, "Sinh": 1} and placement["cpu_nodes"] == 2
    assert placement["reasons"] == []  # a compiled model is not partitioned again: the EP says nothing about it
    text = ok("inspect", model, "--placement").stdout.splitlines()
    at = next(i for i, line in enumerate(text) if line.startswith("placement  opened on QNNExecutionProvider (target sc8380xp) in "))
    assert text[at + 1:at + 4] == [
        "  ep       QNNExecutionProvider: 3 nodes (EPContext 3)",
        "  ep       CPUExecutionProvider: 2 nodes (Mod 1, Sinh 1)",
        "refused    Mod 1, Sinh 1: QNNExecutionProvider left them out of its EPContext nodes when compiling; they run on the CPU EP",
    ]


def test_inspect_placement_of_a_source_model_says_why_the_ep_refused(named_split: Path) -> None:
    placement = inspect_placement(named_split, "--ep", "qnn")
    assert placement["compiled"] is False and placement["eps"][QNN]["ops"] == {"MatMul": 3, "Relu": 1}
    assert placement["refused"] == {"Mod": 1, "Sinh": 1}
    reasons = {(r["op_type"], r["name"]): r["reason"] for r in placement["reasons"]}
    assert set(reasons) == {("Mod", "mod"), ("Sinh", "sinh")}  # once each, though QNN partitions twice
    assert "fmod" in reasons[("Mod", "mod")] and "not supported" in reasons[("Sinh", "sinh")]  # QNN's own words (2.7.0)
    text = ok("inspect", named_split, "--placement", "--ep", "qnn").stdout
    assert "refused    Mod 1, Sinh 1: QNNExecutionProvider did not take them; they run on the CPU EP" in text
    assert f"  reason   Sinh 'sinh': {reasons[('Sinh', 'sinh')]}" in text


def test_inspect_placement_without_a_manifest_uses_the_epcontext_source(compiled: tuple[Path, dict, str], tmp_path: Path) -> None:
    model = compiled[0]
    for entry in json.loads(model.with_name("named_ctx.manifest.json").read_text())["files"]:
        shutil.copyfile(model.parent / entry["name"], tmp_path / entry["name"])
    placement = inspect_placement(tmp_path / model.name)
    assert placement["ep"] == QNN and placement["refused"] == {"Mod": 1, "Sinh": 1}


def test_inspect_placement_on_the_cpu_ep_refuses_nothing(tmp_path: Path) -> None:
    ok("compile", FIXTURES / "mlp.onnx", "-o", tmp_path, "--ep", "cpu", "-q")
    placement = inspect_placement(tmp_path / "mlp_ctx.onnx")
    assert placement["ep"] == CPU and list(placement["eps"]) == [CPU] and placement["refused"] is None
    assert placement["cpu_nodes"] == len(placement["eps"][CPU]["nodes"]) > 0


def test_inspect_ep_needs_placement_and_an_unknown_ep_is_a_usage_error(compiled: tuple[Path, dict, str]) -> None:
    proc = run_cli("inspect", compiled[0], "--ep", "qnn")
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, "--ep: only used by --placement")
    proc = run_cli("inspect", compiled[0], "--placement", "--ep", "nosuch")
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, "unknown execution provider 'nosuch'")


def test_refusal_reasons_reads_multi_node_units_once() -> None:
    """The log format of QNN 2.7.0's LogNodeSupport, with a QDQ unit of three nodes refused for one reason."""
    log = [
        "... LogNodeSupport] Validation FAILED for 3 nodes in OrtNodeUnit (Conv) :\n",
        "\tOperator type: DequantizeLinear Node name: dq Node index: 0\n",
        "\tOperator type: Conv Node name: conv Node index: 1\n",
        "\tOperator type: QuantizeLinear Node name: q Node index: 2\n",
        "\tREASON : unsupported zero point\n",
        "... LogNodeSupport] Validation PASSED for 1 nodes in OrtNodeUnit (Relu) :\n",
        "\tOperator type: Relu Node name: relu Node index: 3\n",
        "... LogNodeSupport] Validation FAILED for 3 nodes in OrtNodeUnit (Conv) :\n",
        "\tOperator type: DequantizeLinear Node name: dq Node index: 0\n",
        "\tOperator type: Conv Node name: conv Node index: 1\n",
        "\tOperator type: QuantizeLinear Node name: q Node index: 2\n",
        "\tREASON : unsupported zero point\n",
    ]
    assert refusal_reasons(log) == [{"op_type": op, "name": name, "reason": "unsupported zero point"}
                                    for op, name in (("DequantizeLinear", "dq"), ("Conv", "conv"), ("QuantizeLinear", "q"))]
