"""`ortcompile llm`: a decoder from onnxruntime-genai's model builder to a package genai runs on QNN's HTP simulator.

The source is a tiny random-weights Llama (2 layers, hidden 64, 4 heads, 2 KV heads; tests/llmmodels.py). The package
(context 64, prefill 8) must generate, greedily and with onnxruntime-genai, the same tokens as the source on the CPU
for an 11-token prompt (two prefill windows, the second right-padded), and each decode step's logits must agree by
the fp16 release criterion (readback/criteria.py FP16_VERIFY: SNR >= 20 dB, cosine >= 0.995 where the elementwise
bound does not hold). QNN's simulator cannot load weight-shared contexts (it segfaults): the generation runs on the
unshared package, and the shared one is checked against it where they must agree.

Needs the `llm` extra (torch, transformers, onnxruntime-genai); skipped cleanly without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import CliResult, epcontext_nodes, run_cli

for _module in ("onnxruntime_genai", "transformers", "torch", "onnx_ir"):
    if os.environ.get("CI"):  # CI installs the extra: missing, these tests fail instead of vanishing
        __import__(_module)
    pytest.importorskip(_module, reason="needs the llm extra (pip install ortcompile[llm])")

from llmmodels import genai_builder_model  # noqa: E402  (after the skips: it needs the extra)

from ortcompile.readback.compare import compare_output  # noqa: E402
from ortcompile.readback.criteria import criterion_for  # noqa: E402

pytestmark = pytest.mark.llm
HERE = Path(__file__).resolve().parent
PROMPT = [5, 17, 33, 100, 7, 250, 9, 11, 40, 41, 42]  # no pad token (0): genai would take it for padding
SETTINGS = ("--context-length", "64", "--prefill-length", "8")


@pytest.fixture(scope="module")
def source() -> Path:
    return genai_builder_model()


@pytest.fixture(scope="module")
def unshared(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pkg") / "unshared"
    proc = run_cli("llm", source, "-o", out, *SETTINGS, "--no-share-weights")
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def shared_run(source: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CliResult]:
    out = tmp_path_factory.mktemp("pkg") / "shared"
    proc = run_cli("llm", source, "-o", out, *SETTINGS, "--json", "-v")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["graphs"]["context"]["epcontext_nodes"] == 1
    return out, proc


@pytest.fixture(scope="module")
def shared(shared_run: tuple[Path, CliResult]) -> Path:
    return shared_run[0]


def generate(folder: Path, count: int, qnn: bool) -> dict:
    """Greedy tokens and decode-step logits from onnxruntime-genai, in a child (tests/genai_run.py says why)."""
    args = [sys.executable, str(HERE / "genai_run.py"), str(folder), str(count), *map(str, PROMPT), *(["--qnn"] if qnn else [])]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def graph(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path), load_external_data=False)


def signature(model: onnx.ModelProto) -> list[tuple[str, int, list[int]]]:
    return [(v.name, v.type.tensor_type.elem_type, [d.dim_value for d in v.type.tensor_type.shape.dim])
            for v in (*model.graph.input, *model.graph.output)]


def test_package_generates_what_the_source_does(source: Path, unshared: Path) -> None:
    config = json.loads((unshared / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert config["model"]["type"] == "decoder-pipeline" and config["search"]["max_length"] == 64
    assert decoder["sliding_window"] == {"window_size": 8, "pad_value": 0, "alignment": "left", "slide_key_value_cache": False, "slide_inputs": True}
    stages = {name: stage for entry in decoder["pipeline"] for name, stage in entry.items()}
    assert (stages["context"]["run_on_prompt"], stages["context"]["run_on_token_gen"]) == (True, False)
    assert (stages["iterator"]["run_on_prompt"], stages["iterator"]["run_on_token_gen"]) == (False, True)
    for name, sequence in (("context", 8), ("iterator", 1)):
        model = graph(unshared / stages[name]["filename"])
        assert len(epcontext_nodes(model)) == 1 and len(model.graph.node) == 1  # one NPU graph, no CPU node
        shapes = {n: s for n, _, s in signature(model)}
        assert shapes["input_ids"] == [1, sequence] and shapes["past_key_values.0.key"] == [1, 2, 64, 16]
        assert shapes["past_seq_len"] == [1, 1] and shapes["total_seq_len"] == [1] and "attention_mask" not in shapes

    assert_generates_like(unshared, source)


def assert_generates_like(package: Path, source: Path) -> None:
    """Same 12 greedy tokens as the source on the CPU; each decode step's logits by the fp16 criterion."""
    want, got = generate(source, 12, qnn=False), generate(package, 12, qnn=True)
    assert got["tokens"] == want["tokens"]
    assert len(got["logits"]) == len(want["logits"]) >= 10
    criterion = criterion_for("fp16")
    for step, (g, w) in enumerate(zip(got["logits"], want["logits"])):
        comparison = compare_output(f"logits[{step}]", np.array(g, np.float32), np.array(w, np.float32), criterion)
        assert comparison.ok, comparison.reason


def test_int4_package_generates_what_the_source_does(tmp_path: Path) -> None:
    """The builder's int4 model (MatMulNBits): compiled as it is, one EPContext node per graph."""
    source = genai_builder_model("int4")
    proc = run_cli("llm", source, "-o", tmp_path / "pkg", *SETTINGS, "--no-share-weights", "--json")
    assert proc.returncode == 0, proc.stderr
    graphs = json.loads(proc.stdout)["graphs"]
    assert {(g["epcontext_nodes"], sum(g["remaining_ops"].values())) for g in graphs.values()} == {(1, 0)}
    assert_generates_like(tmp_path / "pkg", source)


def test_package_carries_the_tokenizer_and_a_manifest_of_every_file(source: Path, unshared: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (unshared / name).read_bytes() == (source / name).read_bytes()
    manifest = json.loads((unshared / "llm.manifest.json").read_text())
    listed = {f["name"]: f for f in manifest["files"]}
    assert set(listed) == {p.name for p in unshared.iterdir()} - {"llm.manifest.json"}
    for name, entry in listed.items():
        data = (unshared / name).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["size"], entry["sha256"])
    assert manifest["graphs"]["context"]["pins"] == {"batch_size": 1, "sequence_length": 8, "past_sequence_length": 64, "kv_cache_dim": 16}
    assert manifest["graphs"]["iterator"]["pins"]["sequence_length"] == 1
    for name in ("prefill_ctx", "decode_ctx"):  # each graph ran on decoder inputs before publishing, by the fp16 criterion
        check = json.loads((unshared / f"{name}.manifest.json").read_text())["check"]
        assert (check["mode"], check["passed"], check["criterion"]) == ("run", True, "parity (fp16 check)")
    assert not [p for p in unshared.parent.iterdir() if p.name.startswith(".ortcompile")]  # the staging directory is gone


def test_shared_package_agrees_with_the_unshared_one(unshared: Path, shared: Path) -> None:
    """Where they must agree: the same config, tokenizer and graph signatures; the shared graphs name one blob,
    smaller than the unshared package's two contexts together (the weights stored once)."""
    for name in ("genai_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (shared / name).read_bytes() == (unshared / name).read_bytes(), name
    for name in ("prefill_ctx.onnx", "decode_ctx.onnx"):
        assert signature(graph(shared / name)) == signature(graph(unshared / name))
    blobs = set()
    for name in ("prefill_ctx.onnx", "decode_ctx.onnx"):
        (node,) = epcontext_nodes(graph(shared / name))
        attrs = {a.name: a for a in node.attribute}
        assert attrs["embed_mode"].i == 0
        blobs.add(attrs["ep_cache_context"].s.decode())
    (blob,) = blobs
    unshared_bytes = sum(len({a.name: a for a in epcontext_nodes(graph(unshared / n))[0].attribute}["ep_cache_context"].s)
                         for n in ("prefill_ctx.onnx", "decode_ctx.onnx"))
    assert (shared / blob).stat().st_size < unshared_bytes


def test_shared_package_ran_each_graph_before_publishing(shared: Path) -> None:
    """The simulator cannot load the shared context, so each graph was compiled alone and run on its decoder inputs
    (compile/twins.py), by the fp16 criterion: a shared package is never published unchecked."""
    for name in ("prefill_ctx", "decode_ctx"):
        check = json.loads((shared / f"{name}.manifest.json").read_text())["check"]
        assert (check["mode"], check["passed"], check["criterion"]) == ("run", True, "parity (fp16 check)"), check
        assert check["on"].startswith("the model compiled without --share-weights"), check


def test_shared_log_names_the_shared_context_and_its_size(shared_run: tuple[Path, CliResult]) -> None:
    """QNN keeps the weights in its context, so no data file is left to share: -v says what is stored once (the
    blob both graphs name, with its size), not "0 bytes stored once"."""
    out, proc = shared_run
    (node,) = epcontext_nodes(graph(out / "prefill_ctx.onnx"))
    blob = {a.name: a for a in node.attribute}["ep_cache_context"].s.decode()
    size = (out / blob).stat().st_size
    assert f"shared EP context: {blob}, {size} bytes, one file for 2 models instead of one each" in proc.stderr
    assert "shared weights: 0 bytes" not in proc.stderr


def test_force_replaces_a_package_atomically(shared: Path, source: Path, tmp_path: Path) -> None:
    out = tmp_path / "pkg"
    shutil.copytree(shared, out)
    before = json.loads((out / "llm.manifest.json").read_text())
    proc = run_cli("llm", source, "-o", out, "--context-length", "32", "--prefill-length", "4", "--force")
    assert proc.returncode == 0, proc.stderr
    after = json.loads((out / "llm.manifest.json").read_text())
    assert (before["context_length"], after["context_length"]) == (64, 32)
    assert {p.name for p in out.iterdir()} == {f["name"] for f in after["files"]} | {"llm.manifest.json"}  # nothing of the old one
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ortcompile")]


def test_if_changed_leaves_a_current_package_and_rebuilds_a_stale_one(shared: Path, source: Path, tmp_path: Path) -> None:
    out = tmp_path / "pkg"
    shutil.copytree(shared, out)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    proc = run_cli("llm", source, "-o", out, *SETTINGS, "--if-changed")
    assert proc.returncode == 0 and proc.stdout == f"{out}: up to date\n", proc.stderr
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    proc = run_cli("llm", source, "-o", out, "--context-length", "32", "--prefill-length", "8", "--if-changed", "-v")
    assert proc.returncode == 0 and "rebuilding: other settings" in proc.stderr, proc.stderr
    assert json.loads((out / "llm.manifest.json").read_text())["context_length"] == 32


def test_refusals(source: Path, tmp_path: Path) -> None:
    proc = run_cli("llm", source, "-o", tmp_path / "a", "--context-length", "8", "--prefill-length", "16")
    assert proc.returncode == 2 and "longer than --context-length" in proc.stderr
    proc = run_cli("llm", tmp_path, "-o", tmp_path / "b")
    assert proc.returncode == 3 and "no genai_config.json" in proc.stderr
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "keep.txt").write_text("x")
    proc = run_cli("llm", source, "-o", tmp_path / "c", *SETTINGS)
    assert proc.returncode == 4 and "not empty" in proc.stderr
    assert (tmp_path / "c" / "keep.txt").read_text() == "x"


def test_plain_compile_of_the_builder_model_is_one_epcontext_node(source: Path, tmp_path: Path) -> None:
    """`compile` with the pins a user finds, no option given: the EP fixes leave 1 EPContext node and no CPU node
    (without them: 7 EPContext nodes and 6 CPU nodes, 4 SkipSimplifiedLayerNormalization and 2 GroupQueryAttention)."""
    pins = [f"--fix-dim={d}" for d in ("batch_size=1", "sequence_length=8", "past_sequence_length=64", "total_sequence_length=64",
                                       "kv_cache_dim=16")]
    proc = run_cli("compile", source / "model.onnx", "-o", f"{tmp_path}/", "--ep", "qnn", "--check", "load", *pins, "--json")
    assert proc.returncode == 0, proc.stderr
    (document,) = json.loads(proc.stdout)["outputs"]
    assert (document["epcontext_nodes"], document["remaining_ops"]) == (1, {})
    assert "fragmented" not in proc.stderr
    fixes = json.loads((tmp_path / "model_ctx.manifest.json").read_text())["prepare"]["ep_fixes"]
    assert fixes == [{"fix": "decompose", "op_type": "SkipSimplifiedLayerNormalization", "nodes": 4},
                     {"fix": "provider_option", "option": "op_affinity", "op_type": "GroupQueryAttention", "backend": "htp"}]
