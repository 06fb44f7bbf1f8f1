"""`ortcompile llm --partition` and decoders with position_ids, on QNN's HTP simulator and onnxruntime-genai.

The sources are tests/llmmodels.py's tiny builder Llamas (2 layers, hidden 64, 689 KB of fp32 weights). Forced into
parts of at most 300 KB, each graph becomes 3 pipeline stages (one QNN context each): the package must generate,
with onnxruntime-genai on the simulator, the source's greedy tokens, and every decode step's logits must agree by
the fp16 criterion (tests/test_llm.py's assert_generates_like). The > 2 GB case is this path with a real budget.
As in test_llm.py, shared contexts do not load on the simulator: the shared partitioned package is checked against
the unshared one where they must agree.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import epcontext_nodes, run_cli

for _module in ("onnxruntime_genai", "transformers", "torch", "onnx_ir"):
    if os.environ.get("CI"):
        __import__(_module)
    pytest.importorskip(_module, reason="needs the llm extra (pip install ortcompile[llm])")

from llmmodels import genai_builder_model  # noqa: E402
from test_llm import SETTINGS, assert_generates_like, graph, signature  # noqa: E402

from ortcompile.compile.partition import plan_partition  # noqa: E402
from ortcompile.llm.genai import DECODE, PREFILL, read_genai_folder  # noqa: E402
from ortcompile.llm.package import LlmOptions, stage_pins  # noqa: E402
from ortcompile.llm.parts import held_bytes, part_budget, split_stages, weight_bytes  # noqa: E402
from ortcompile.llm.surgery import rewrite_decoder  # noqa: E402
from ortcompile.onnxfacts import stored_nbytes  # noqa: E402
from ortcompile.plan.shapes import Pins, apply_pins  # noqa: E402

pytestmark = pytest.mark.llm
PARTS = ("--partition", "300KB")


@pytest.fixture(scope="module")
def source() -> Path:
    return genai_builder_model()


@pytest.fixture(scope="module")
def unshared_parts(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("parts") / "unshared"
    proc = run_cli("llm", source, "-o", out, *SETTINGS, *PARTS, "--no-share-weights")
    assert proc.returncode == 0, proc.stderr
    return out


def pipeline(package: Path) -> list[tuple[str, dict]]:
    return [(name, stage) for entry in json.loads((package / "genai_config.json").read_text())["model"]["decoder"]["pipeline"]
            for name, stage in entry.items()]


def test_partitioned_package_generates_what_the_source_does(source: Path, unshared_parts: Path) -> None:
    stages = pipeline(unshared_parts)
    assert [n for n, _ in stages] == ["context_0", "iterator_0", "context_1", "iterator_1", "context_2", "iterator_2"]
    caches = []
    for name, stage in stages:
        assert (stage["run_on_prompt"], stage["run_on_token_gen"]) == ((True, False) if name.startswith("context") else (False, True))
        model = graph(unshared_parts / stage["filename"])
        assert len(epcontext_nodes(model)) == 1 and len(model.graph.node) == 1, name  # each stage one QNN context, no CPU node
        assert stage["inputs"] == [i.name for i in model.graph.input] and stage["outputs"] == [o.name for o in model.graph.output]
        caches.append({i for i in stage["inputs"] if i.startswith("past_key_values")})
        check = json.loads((unshared_parts / stage["filename"].replace(".onnx", ".manifest.json")).read_text())["check"]
        assert (check["mode"], check["passed"], check["criterion"]) == ("run", True, "parity (fp16 check)"), name  # ran before publishing
    assert "input_ids" in stages[0][1]["inputs"] and "input_ids" not in stages[2][1]["inputs"] and stages[-1][1]["outputs"] == ["logits"]
    handed = set(stages[0][1]["outputs"]) - {o for o in stages[0][1]["outputs"] if o.startswith("present.")}
    assert handed and handed <= set(stages[2][1]["inputs"]) | set(stages[4][1]["inputs"])  # hidden states, to the later parts by name
    assert set().union(*caches) == {f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")}
    assert sum(map(len, caches)) == 8  # each layer's cache in one context part and its iterator part, no other
    manifest = json.loads((unshared_parts / "llm.manifest.json").read_text())
    assert manifest["partition"] == 300_000 and len(manifest["graphs"]) == 6

    assert_generates_like(unshared_parts, source)


def test_shared_partitioned_package_pairs_each_context_part_with_its_iterator_part(source: Path, unshared_parts: Path, tmp_path: Path) -> None:
    """Weights shared between context part k and iterator part k: one blob per pair, smaller than the pair's two
    unshared contexts; config, tokenizer and graph signatures as in the unshared package."""
    out = tmp_path / "shared"
    proc = run_cli("llm", source, "-o", out, *SETTINGS, *PARTS)
    assert proc.returncode == 0, proc.stderr
    assert (out / "genai_config.json").read_bytes() == (unshared_parts / "genai_config.json").read_bytes()
    stages = dict(pipeline(out))
    blobs = []
    for index in range(3):
        pair = [stages[f"{kind}_{index}"]["filename"] for kind in ("context", "iterator")]
        names = set()
        for name in pair:
            assert signature(graph(out / name)) == signature(graph(unshared_parts / name))
            (node,) = epcontext_nodes(graph(out / name))
            names.add({a.name: a for a in node.attribute}["ep_cache_context"].s.decode())
            check = json.loads((out / name.replace(".onnx", ".manifest.json")).read_text())["check"]  # run on its unshared twin
            assert (check["mode"], check["passed"], check["on"].split(":")[0]) == ("run", True, "the model compiled without --share-weights"), name
        (blob,) = names
        unshared = sum(len({a.name: a for a in epcontext_nodes(graph(unshared_parts / n))[0].attribute}["ep_cache_context"].s) for n in pair)
        assert (out / blob).stat().st_size < unshared
        blobs.append(blob)
    assert len(set(blobs)) == 3


def test_auto_partition_compiles_a_small_decoder_whole(source: Path, tmp_path: Path) -> None:
    """--partition auto (the default) cuts only what would make a context over the EP's limit (1 GiB of weights)."""
    proc = run_cli("llm", source, "-o", tmp_path / "pkg", *SETTINGS, "--no-share-weights", "--json")
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)["graphs"]) == {"context", "iterator"}
    assert json.loads((tmp_path / "pkg" / "llm.manifest.json").read_text())["partition"] == 0


def test_auto_cuts_only_over_the_limit() -> None:
    """auto (0): parts of 1 GiB only when the weights are over 1 GiB; SIZE: parts when over SIZE; None: never."""
    gib = 1 << 30
    assert (part_budget(0, gib), part_budget(0, gib + 1), part_budget(0, 3 * gib)) == (None, gib, gib)
    assert (part_budget(300_000, 689_408), part_budget(300_000, 300_000), part_budget(None, 3 * gib)) == (300_000, None, None)


def test_int4_parts_are_sized_by_what_qnn_holds(tmp_path: Path) -> None:
    """QNN's compile holds MatMulNBits' packed int4 weights at ~3x their bytes (docs/performance.md: the 0.70 GB int4
    build compiled whole peaked at 5.57 GiB, over 4x its size + 1 GiB): the part plan counts them at that size, so a
    decoder whose stored weights fit the budget but whose held ones do not is cut, into parts each within it."""
    genai = read_genai_folder(genai_builder_model("int4"))
    options = LlmOptions(context_length=64, prefill_length=8)
    graphs = {PREFILL: tmp_path / "prefill.onnx", DECODE: tmp_path / "decode.onnx"}
    pins = {s: stage_pins(rewrite_decoder(genai, graphs[s], 8 if s == PREFILL else 1), genai, options, s) for s in graphs}
    proto = graph(graphs[PREFILL])
    stored = {t.name: stored_nbytes(t) for t in proto.graph.initializer}
    packed = {n.input[1] for n in proto.graph.node if n.op_type == "MatMulNBits"}
    assert len(packed) == 2 * 5 + 1  # per layer: qkv (packed), o, gate, up, down; and the lm_head
    held = weight_bytes(graphs[PREFILL])
    assert held == sum(stored.values()) + 2 * sum(stored[name] for name in packed)
    budget = (sum(stored.values()) + held) // 2  # the stored weights fit, the held ones do not
    assert part_budget(budget, held) == budget
    parts = split_stages(graphs, pins, budget)
    assert len(parts[PREFILL]) == len(parts[DECODE]) >= 2
    for path in (*parts[PREFILL], *parts[DECODE]):
        assert weight_bytes(path) <= budget, path.name
    # As few parts as the budget allows, made even: the largest is smaller than when each part is filled up first.
    pinned = graph(graphs[PREFILL])
    apply_pins(pinned, Pins(named=pins[PREFILL]))
    filled = plan_partition(pinned, held_bytes(pinned), budget).parts
    assert len(filled) == len(parts[PREFILL])
    assert max(weight_bytes(p) for p in parts[PREFILL]) < max(p.weight_bytes for p in filled)


def test_position_ids_decoder_generates_what_the_source_does(tmp_path: Path) -> None:
    """The builder's separate-rotary form (RotaryEmbedding fed by position_ids): the rotation goes back into
    GroupQueryAttention (QNN refuses RotaryEmbedding), whose positions genai's past_seq_len gives."""
    source = genai_builder_model(rotary="separate")
    assert "position_ids" in {i.name for i in graph(source / "model.onnx").graph.input}
    out = tmp_path / "pkg"
    proc = run_cli("llm", source, "-o", out, *SETTINGS, "--no-share-weights", "--json")
    assert proc.returncode == 0, proc.stderr
    graphs = json.loads(proc.stdout)["graphs"]
    assert {(g["epcontext_nodes"], sum(g["remaining_ops"].values())) for g in graphs.values()} == {(1, 0)}
    config = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    assert "position_ids" not in config["inputs"] and all("position_ids" not in s["inputs"] for _, s in pipeline(out))
    assert_generates_like(out, source)


def test_derived_position_ids_match_the_ones_genai_feeds(tmp_path: Path) -> None:
    """Where the rotation stays a RotaryEmbedding (here: an explicit rotary_embedding_dim), its position_ids come
    from past_seq_len. On the CPU, the rewritten graph computes what the source does with the positions fed: a
    5-token prefill, then one decode step at position 5."""
    import onnxruntime as ort

    folder = _copy_folder(genai_builder_model(rotary="separate"), tmp_path / "src")
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    for node in (n for n in model.graph.node if n.op_type == "RotaryEmbedding"):
        values = {"rotary_embedding_dim": 16, "num_heads": 4 if "q_rotary" in node.name else 2}  # the heads of q and of k
        for attribute in node.attribute:
            attribute.i = values.get(attribute.name, attribute.i)
    onnx.save(model, str(folder / "model.onnx"))
    genai = read_genai_folder(folder)
    rewrite_decoder(genai, folder / "prefill.onnx", 5)
    rewrite_decoder(genai, folder / "decode.onnx", 1)
    assert "position_ids" not in {i.name for i in graph(folder / "prefill.onnx").graph.input}
    assert "RotaryEmbedding" in {n.op_type for n in graph(folder / "prefill.onnx").graph.node}  # not folded: positions derived

    def run(path: str, feeds: dict) -> list[np.ndarray]:
        return ort.InferenceSession(str(folder / path), providers=["CPUExecutionProvider"]).run(None, feeds)

    rng = np.random.default_rng(0)
    ids = rng.integers(1, 512, size=(1, 6)).astype(np.int64)
    empty = {f"past_key_values.{i}.{kv}": np.zeros((1, 2, 0, 16), np.float32) for i in range(2) for kv in ("key", "value")}
    want = run("model.onnx", {"input_ids": ids[:, :5], "attention_mask": np.ones((1, 5), np.int64),
                              "position_ids": np.arange(5)[None], **empty})
    static = {name: np.zeros((1, 2, 64, 16), np.float32) for name in empty}
    got = run("prefill.onnx", {"input_ids": ids[:, :5], "past_seq_len": np.array([[4]], np.int32), "total_seq_len": np.array([64], np.int32), **static})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    names = [o.name for o in ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"]).get_outputs()]
    past = {n.replace("present", "past_key_values"): v for n, v in zip(names[1:], want[1:])}
    want = run("model.onnx", {"input_ids": ids[:, 5:], "attention_mask": np.ones((1, 6), np.int64), "position_ids": np.array([[5]]), **past})
    for name, value in past.items():
        static[name][:, :, :5] = value
    got = run("decode.onnx", {"input_ids": ids[:, 5:], "past_seq_len": np.array([[5]], np.int32), "total_seq_len": np.array([64], np.int32), **static})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


def test_other_attention_is_refused_in_one_line(tmp_path: Path) -> None:
    folder = _copy_folder(genai_builder_model(), tmp_path / "mha")
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    for node in (n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
        node.op_type = "MultiHeadAttention"
    onnx.save(model, str(folder / "model.onnx"))
    proc = run_cli("llm", folder, "-o", tmp_path / "out", *SETTINGS)
    assert proc.returncode == 3 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "its attention is MultiHeadAttention, not GroupQueryAttention" in proc.stderr and "-e cpu" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_fixed_batch_over_one_is_refused_in_one_line(tmp_path: Path) -> None:
    """The package runs batch 1 (genai refuses a batch over 1 with its windowed prompt: docs/llm.md); a source whose
    input_ids fixes a larger batch is refused before anything is written."""
    folder = _copy_folder(genai_builder_model(), tmp_path / "batch2")
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    (ids,) = (i for i in model.graph.input if i.name == "input_ids")
    ids.type.tensor_type.shape.dim[0].dim_value = 2
    onnx.save(model, str(folder / "model.onnx"))
    proc = run_cli("llm", folder, "-o", tmp_path / "out", *SETTINGS)
    assert proc.returncode == 3 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "its input_ids has a fixed batch of 2; `ortcompile llm` builds batch-1 packages only" in proc.stderr
    assert not (tmp_path / "out").exists()


def _copy_folder(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target
