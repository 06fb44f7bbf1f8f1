"""EP-aware graph fixes of the prepare step (compile/epfixes.py) and the fragmentation warning, on the real QNN EP.

Each model has ops QNN 2.7.0 refuses (SkipSimplifiedLayerNormalization, SkipLayerNormalization, some Einsum forms)
or filters off by default (GroupQueryAttention). Before (--no-prepare: no fixes) the compiled graph is fragmented,
CPU nodes between EPContext nodes; after (the default) it is one EPContext node and no CPU node, and its outputs
agree with the source on the CPU EP by the fp16 release criterion (readback/criteria.py FP16_VERIFY).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from epfixmodels import REFUSED_EINSUMS, einsums, gqa, gqa_feeds, skip_norms
from helpers import FIXTURES, cpu_session, epcontext_nodes, qnn_session, run_cli

from ortcompile.compile.epfixes import einsum_plan
from ortcompile.readback.compare import compare_output
from ortcompile.readback.criteria import criterion_for

FP16 = criterion_for("fp16")


def compile_qnn(source: Path, out: Path, *extra: object) -> tuple[int, str, Path]:
    proc = run_cli("compile", source, "-o", f"{out}/", "--ep", "qnn", *extra)
    return proc.returncode, proc.stderr, out / f"{source.stem}_ctx.onnx"


def placement(model: Path) -> tuple[int, int]:
    """(EPContext nodes, other nodes) of a compiled model's graph."""
    graph = onnx.load(str(model), load_external_data=False)
    contexts = len(epcontext_nodes(graph))
    return contexts, len(graph.graph.node) - contexts


def assert_agrees(compiled: Path, source: Path, feeds: dict[str, np.ndarray]) -> None:
    want = cpu_session(source).run(None, feeds)
    session = qnn_session(compiled, allow_cpu_nodes=False)
    got = session.run(None, feeds)
    for output, g, w in zip(session.get_outputs(), got, want):
        comparison = compare_output(output.name, g, w, FP16)
        assert comparison.ok, comparison.reason


def manifest(model: Path) -> dict:
    return json.loads(model.with_name(model.name.replace(".onnx", ".manifest.json")).read_text())


def test_skip_norms_decomposed_into_one_epcontext(tmp_path: Path) -> None:
    source = skip_norms(tmp_path / "skip.onnx")
    code, stderr, before = compile_qnn(source, tmp_path / "before", "--no-prepare")
    assert code == 0, stderr
    assert placement(before) == (3, 2)
    assert "fragmented: 3 EPContext nodes with 2 CPU nodes between them (SkipLayerNormalization x1, SkipSimplifiedLayerNormalization x1)" in stderr
    assert "drop --no-prepare" in stderr and "--require-full" in stderr

    code, stderr, after = compile_qnn(source, tmp_path / "after", "-v")
    assert code == 0, stderr
    assert placement(after) == (1, 0)
    assert "fragmented" not in stderr
    assert "EP fixes: SkipLayerNormalization x1 -> standard ops; SkipSimplifiedLayerNormalization x1 -> standard ops" in stderr
    assert manifest(after)["prepare"]["ep_fixes"] == [
        {"fix": "decompose", "op_type": "SkipLayerNormalization", "nodes": 1},
        {"fix": "decompose", "op_type": "SkipSimplifiedLayerNormalization", "nodes": 1}]
    x = np.random.default_rng(0).standard_normal([1, 8, 64]).astype(np.float32)
    assert_agrees(after, source, {"x": x})  # both outputs: the normalized one and the kept skip sum


def test_require_full_refuses_a_fragmented_graph(tmp_path: Path) -> None:
    source = skip_norms(tmp_path / "skip.onnx")
    code, stderr, model = compile_qnn(source, tmp_path / "out", "--no-prepare", "--require-full")
    assert code == 1
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("ortcompile: error: not published: skip.onnx: the qnn graph is fragmented: 3 EPContext nodes")
    assert lines[-1].endswith("(--require-full)")
    assert not model.exists()


def test_einsums_become_matmuls(tmp_path: Path) -> None:
    source = einsums(tmp_path / "attn.onnx")
    code, stderr, before = compile_qnn(source, tmp_path / "before", "--no-prepare")
    assert code == 0, stderr
    contexts, cpu = placement(before)
    assert contexts >= 2 and cpu == len(REFUSED_EINSUMS), stderr
    assert "fragmented" in stderr and "Einsum x" in stderr

    code, stderr, after = compile_qnn(source, tmp_path / "after")
    assert code == 0, stderr
    assert placement(after) == (1, 0)
    assert manifest(after)["prepare"]["ep_fixes"] == [{"fix": "decompose", "op_type": "Einsum", "nodes": 4}]
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal([1, 8, 32]), "k": rng.standard_normal([1, 8, 2, 16]), "v": rng.standard_normal([1, 8, 2, 16])}
    assert_agrees(after, source, {k: v.astype(np.float32) for k, v in feeds.items()})


def test_group_query_attention_enabled_by_op_affinity(tmp_path: Path) -> None:
    source = gqa(tmp_path / "gqa.onnx")
    code, stderr, before = compile_qnn(source, tmp_path / "before", "--no-prepare", "--check", "load")
    assert code == 0, stderr
    assert placement(before) == (2, 1)
    assert "(GroupQueryAttention x1)" in stderr

    code, stderr, after = compile_qnn(source, tmp_path / "after", "-v", "--check", "load")
    assert code == 0, stderr
    assert placement(after) == (1, 0)
    assert "GroupQueryAttention enabled (op_affinity: htp)" in stderr
    assert manifest(after)["prepare"]["ep_fixes"] == [
        {"fix": "provider_option", "option": "op_affinity", "op_type": "GroupQueryAttention", "backend": "htp"}]
    for filled, seed in ((0, 2), (5, 3)):  # a first prefill, and one after 5 cached tokens
        assert_agrees(after, source, gqa_feeds(filled, seed))


@pytest.mark.parametrize("equation", ["bij,bjk->bik", "bhqd,bhkd->bhqk", *REFUSED_EINSUMS, "ij->ji", "bid,bjd->bij"])
def test_einsum_plan_computes_the_einsum(equation: str) -> None:
    """The MatMul/Transpose plan, run with numpy, gives numpy.einsum's result."""
    operands_text, out = equation.split("->")
    rng = np.random.default_rng(0)
    sizes = {c: 2 + i for i, c in enumerate(sorted(set(operands_text.replace(",", ""))))}
    operands = [rng.standard_normal([sizes[c] for c in text]) for text in operands_text.split(",")]
    plan = einsum_plan(equation)
    assert plan is not None
    moved = [x if perm is None else x.transpose(perm) for x, perm in zip(operands, plan.operand_perms)]
    result = moved[0] @ moved[1] if plan.matmul else moved[0]
    result = result if plan.output_perm is None else result.transpose(plan.output_perm)
    np.testing.assert_allclose(result, np.einsum(equation, *operands), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("equation", ["ii->i", "bij,bjk->bk", "...ij,...jk->...ik", "i,i->", "ij,jk,kl->il", "ij->ij"])
def test_einsum_forms_without_a_matmul_are_left_alone(equation: str) -> None:
    assert einsum_plan(equation) is None


def test_a_stitched_graph_is_judged_too(tmp_path: Path) -> None:
    """--partition: each part compiles on its own, yet Mod and Sinh (which QNN does not take) still sit between the
    stitched model's EPContext nodes: the same warning, and --require-full refuses it."""
    code, stderr, model = compile_qnn(FIXTURES / "split.onnx", tmp_path / "out", "--partition", "64KiB")
    assert code == 0, stderr
    assert "split.onnx: the qnn graph is fragmented: 4 EPContext nodes with 2 CPU nodes between them (Mod x1, Sinh x1)" in stderr
    assert "qnn does not take Mod, Sinh and ortcompile knows no rewrite for them" in stderr
    code, stderr, model = compile_qnn(FIXTURES / "split.onnx", tmp_path / "strict", "--partition", "64KiB", "--require-full")
    assert code == 1 and stderr.rstrip().endswith("(--require-full)"), stderr
    assert not model.exists()


def _fixed(model: onnx.ModelProto, tmp_path: Path, options: dict[str, str] | None = None) -> tuple[list[str], object]:
    from ortcompile.compile.epfixes import apply_ep_fixes

    report = apply_ep_fixes(model, "QNNExecutionProvider", tmp_path, options or {})
    return [n.op_type for n in model.graph.node], report


def test_a_fused_norm_whose_statistics_are_read_is_kept(tmp_path: Path) -> None:
    """No standard op gives SkipLayerNormalization's mean / inv_std_var: a node whose statistics are read stays."""
    model = onnx.load(str(skip_norms(tmp_path / "skip.onnx")))
    model.graph.node[3].output.extend(["", "inv_std"])  # SkipLayerNormalization: output, mean, inv_std_var
    model.graph.output.add().CopyFrom(onnx.helper.make_tensor_value_info("inv_std", onnx.TensorProto.FLOAT, None))
    ops, report = _fixed(model, tmp_path)
    assert ops.count("SkipLayerNormalization") == 1 and "SkipSimplifiedLayerNormalization" not in ops
    assert report.kept == {"SkipLayerNormalization": 1} and report.decomposed == {"SkipSimplifiedLayerNormalization": 1}
    assert "SkipLayerNormalization x1 kept (no decomposition of its form)" in report.describe()


def test_op_affinity_only_for_the_htp_backend_and_never_over_the_users(tmp_path: Path) -> None:
    for options, enabled in (({}, True), ({"backend_type": "gpu"}, False), ({"op_affinity": "mine.json"}, False)):
        _, report = _fixed(onnx.load(str(gqa(tmp_path / "gqa.onnx"))), tmp_path, options)
        assert bool(report.provider_options) is enabled, options
    assert json.loads((tmp_path / "op_affinity.json").read_text()) == {"op_type": {"GroupQueryAttention": "htp"}}


def test_cpu_pins_merge_with_the_affinity_fix(tmp_path: Path) -> None:
    """--cpu-nodes writes its own op_affinity file into the stage: the fix adds GroupQueryAttention to it (a pinned
    op stays pinned, and the pin of GroupQueryAttention itself wins) instead of standing aside."""
    from ortcompile.compile.epfixes import PINS_FILE, apply_ep_fixes

    stage = tmp_path / "stage"
    (stage / ".prepare").mkdir(parents=True)
    pins = stage / PINS_FILE
    for pinned, enabled in (({"MatMul": "cpu"}, {"GroupQueryAttention": "htp"}), ({"GroupQueryAttention": "cpu"}, {})):
        pins.write_text(json.dumps({"op_type": pinned}))
        report = apply_ep_fixes(onnx.load(str(gqa(tmp_path / "gqa.onnx"))), "QNNExecutionProvider", stage / ".prepare",
                                {"op_affinity": str(pins)})
        assert report.enabled == enabled
        if enabled:
            written = Path(report.provider_options["op_affinity"])
            assert json.loads(written.read_text()) == {"op_type": {**pinned, **enabled}}


def test_gqa_stays_on_the_npu_when_other_ops_are_pinned(tmp_path: Path) -> None:
    """Before, --cpu-nodes' op_affinity file turned the GroupQueryAttention fix off: nothing was left for QNN."""
    source = gqa(tmp_path / "gqa.onnx")
    code, stderr, compiled = compile_qnn(source, tmp_path / "out", "--cpu-nodes", "op:MatMul", "--check", "load")
    assert code == 0, stderr
    graph = onnx.load(str(compiled), load_external_data=False)
    assert [n.op_type for n in graph.graph.node].count("MatMul") == 4 and len(epcontext_nodes(graph)) == 1
    assert manifest(compiled)["prepare"]["ep_fixes"][0]["op_type"] == "GroupQueryAttention"
    session = qnn_session(compiled)
    feeds = gqa_feeds(5, 3)
    for name, got, want in zip([o.name for o in session.get_outputs()], session.run(None, feeds), cpu_session(source).run(None, feeds)):
        comparison = compare_output(name, got, want, FP16)
        assert comparison.ok, comparison.reason


def test_fragmentation_says_which_ops_were_pinned_and_which_refused() -> None:
    from ortcompile.compile.fragmentation import Fragmentation

    message = Fragmentation(3, {"Log": 1, "Mod": 1}).message("m.onnx", "qnn", "QNNExecutionProvider", True, frozenset({"Log"}))
    assert "Log was pinned to the CPU (--cpu-nodes / --fallback)" in message
    assert "qnn does not take Mod and ortcompile knows no rewrite for it" in message
    only_pinned = Fragmentation(3, {"Log": 2}).message("m.onnx", "qnn", "QNNExecutionProvider", True, frozenset({"Log"}))
    assert "does not take" not in only_pinned and "Log was pinned" in only_pinned
