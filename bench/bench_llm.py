#!/usr/bin/env python3
"""An LLM package for the NPU in one command, against separate compiles (issue 20's benchmark).

    python bench/bench_llm.py --gb 3                      # a ~3 GB fp32 Llama-shaped decoder
    python bench/bench_llm.py --gb 3 --precision int4     # its int4 (MatMulNBits) build
    python bench/bench_llm.py --gb 3 --workdir /data/b --keep

The decoder: a Llama config (hidden 2048, 16 heads, 4 KV heads, MLP 5632, vocab 32000) with as many layers as
make the size, random weights from `transformers` (`from_config`, nothing downloaded), then onnxruntime-genai's
model builder (`-e cpu`). Built once per size into the work directory (`--keep` keeps it).

Rows, each a fresh process after `sync`, with the process tree's peak RSS (tests/treerss.py):
- `ortcompile llm`: the package (prefill + decode graphs, weights shared: stored once, one EP context);
- `ortcompile llm --no-share-weights`: the same two graphs compiled separately (weights stored twice), the
  shape of a package made by separate compiles;
- `raw prefill`, `raw decode`: the raw `onnxruntime.ModelCompiler` on the same static graph (ortcompile's one
  graph change, llm/surgery.py, then free-dimension overrides; no EP fixes, so it may leave fused ops on the CPU:
  its EPContext/CPU node counts are printed), one compile per graph as a separate-compile recipe does.
Prints wall time, peak RSS (goal: <= 4 x the largest part + 1 GiB), package bytes against 2 x the weights.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from bench_partition import GiB, measure  # noqa: E402

LLAMA = {"hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
         "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False}
CONTEXT, PREFILL = 1024, 128

RAW_LLM_SCRIPT = r"""
import json, os, sys, time
import onnxruntime as ort, onnxruntime_qnn
src, out, dims = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ort.set_default_logger_severity(3)
ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
options = ort.SessionOptions()
for name, value in dims.items():
    options.add_free_dimension_override_by_name(name, value)
devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
options.add_provider_for_devices(devices[:1], {"backend_path": onnxruntime_qnn.get_qnn_htp_path(), "soc_model": "60", "htp_arch": "73"})
compiler = ort.ModelCompiler(options, src, embed_compiled_data_into_model=False,
                             external_initializers_file_path=os.path.basename(out) + ".data")
clock = time.perf_counter()
compiler.compile_to_file(out)
print(f"{time.perf_counter() - clock:.3f}")
"""


def layers_for(gb: float) -> int:
    """Layers that make a decoder of about `gb` GB in fp32."""
    h, i, v, heads, kv = (LLAMA[k] for k in ("hidden_size", "intermediate_size", "vocab_size", "num_attention_heads", "num_key_value_heads"))
    per_layer = 2 * h * h + 2 * h * (h * kv // heads) + 3 * h * i
    return max(1, round((gb * 1e9 / 4 - 2 * v * h) / per_layer))


def build(work: Path, gb: float, precision: str) -> Path:
    """The genai builder's folder for a random-weight decoder of ~`gb` GB (cached in `work`)."""
    layers = layers_for(gb)
    folder = work / f"llama-{layers}l-{precision}"
    if (folder / "genai" / "genai_config.json").is_file():
        return folder / "genai"
    hf = work / f"llama-{layers}l-hf"
    clock = time.perf_counter()
    if not (hf / "config.json").is_file():
        _hf_folder(hf, layers)
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(folder / "genai"), "-p", precision,
                    "-e", "cpu", "-c", str(work / "builder-cache")], check=True, capture_output=True)
    print(f"built {folder.name}: {layers} layers, {_bytes(folder / 'genai') / 1e9:.2f} GB in {time.perf_counter() - clock:.0f}s", flush=True)
    return folder / "genai"


def _hf_folder(target: Path, layers: int) -> None:
    import torch
    from llmmodels import TEXT
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**LLAMA, num_hidden_layers=layers)).save_pretrained(target)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=512, special_tokens=["<pad>", "<s>", "</s>"],
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>").save_pretrained(target)


def _bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


def static_graphs(folder: Path, out_dir: Path) -> dict[str, tuple[Path, dict[str, int]]]:
    """ortcompile's graph change (llm/surgery.py) for each stage, written beside hard links to the weights, for the
    raw rows, with the stage's dimension values (llm/package.py stage_pins)."""
    import onnx

    from ortcompile.llm.genai import DECODE as DECODE_STAGE
    from ortcompile.llm.genai import PREFILL as PREFILL_STAGE
    from ortcompile.llm.genai import read_genai_folder
    from ortcompile.llm.package import LlmOptions, stage_pins
    from ortcompile.llm.surgery import rewrite_decoder
    from ortcompile.onnxfacts import external_locations

    model = read_genai_folder(folder)
    out_dir.mkdir(parents=True, exist_ok=True)
    options = LlmOptions(context_length=CONTEXT, prefill_length=PREFILL)
    graphs = {}
    for name, stage, sequence in (("prefill", PREFILL_STAGE, PREFILL), ("decode", DECODE_STAGE, 1)):
        graph = out_dir / f"{name}.onnx"
        dims = rewrite_decoder(model, graph, sequence)
        for location in external_locations(onnx.load_model(str(graph), load_external_data=False)):
            if not (out_dir / location).exists():
                os.link(folder / location, out_dir / location)
        graphs[name] = (graph, stage_pins(dims, model, options, stage))
    return graphs


def planned_parts(graph: Path) -> list[tuple[int, int]]:
    """(held, stored) weight bytes of each part `ortcompile llm`'s default `--partition auto` cuts `graph` into
    (llm/parts.py: held counts packed int4 at 3x, the even budget), for the goal: <= 4 x the largest part + 1 GiB."""
    import onnx

    from ortcompile.compile.partition import plan_partition
    from ortcompile.llm.parts import even_budget, held_bytes, part_budget
    from ortcompile.onnxfacts import stored_nbytes
    from ortcompile.optiontable import PARTITION_AUTO

    model = onnx.load_model(str(graph), load_external_data=False)
    held = held_bytes(model)
    stored = {t.name: stored_nbytes(t) or 0 for t in model.graph.initializer}
    budget = part_budget(PARTITION_AUTO, sum(held.values()))
    if budget is None:
        return [(sum(held.values()), sum(stored.values()))]
    plan = plan_partition(model, held, even_budget(model, held, budget))
    return [(part.weight_bytes, sum(stored[name] for name in part.initializers)) for part in plan.parts]


def placement(model: Path) -> str:
    import onnx

    nodes = onnx.load_model(str(model), load_external_data=False).graph.node
    contexts = sum(n.op_type == "EPContext" for n in nodes)
    return f"{contexts} EPContext, {len(nodes) - contexts} CPU nodes"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=3.0)
    parser.add_argument("--precision", choices=["fp32", "int4"], default="fp32")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the built decoder for the next run")
    parser.add_argument("--skip-raw", action="store_true")
    parser.add_argument("--skip-llm", action="store_true", help="only the raw rows")
    parser.add_argument("--skip-separate", action="store_true", help="no --no-share-weights row (it also runs each graph's check)")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args()
    work = args.workdir or Path(os.environ.get("TMPDIR", "/tmp")) / "bench_llm"
    work.mkdir(parents=True, exist_ok=True)
    folder = build(work, args.gb, args.precision)
    weights = sum(p.stat().st_size for p in folder.iterdir() if p.name.startswith("model.onnx"))
    print(f"{folder.parent.name}: weights {weights / 1e9:.2f} GB; load {os.getloadavg()[0]:.2f}", flush=True)
    rows: list[dict[str, Any]] = []

    def row(method: str, argv: list[str], out: Path, env: dict[str, str] | None = None, make_dir: bool = False) -> None:
        shutil.rmtree(out, ignore_errors=True)
        if make_dir:  # (the raw compiler writes into an existing directory; ortcompile makes its own)
            out.mkdir(parents=True)
        os.environ.update(env or {})
        result = {"method": method, **measure(argv)}
        for key in env or {}:
            os.environ.pop(key, None)
        result["bytes"] = _bytes(out) if out.is_dir() else 0
        rows.append(result)
        print(f"  {method:30s} rc={result['rc']} wall {result['wall']:7.1f}s  cpu {result['cpu']:7.1f}s  peak {result['peak_rss'] / GiB:5.2f} GiB  "
              f"output {result['bytes'] / 1e9:5.2f} GB ({result['bytes'] / weights:.2f} x weights)  load {os.getloadavg()[0]:.2f}"
              f"{'  ' + result['stderr'] if result['rc'] else ''}", flush=True)

    tree = {"PYTHONPATH": str(REPO)}
    llm = [sys.executable, "-m", "ortcompile", "llm", str(folder), "--context-length", str(CONTEXT), "--prefill-length", str(PREFILL), "--json"]
    if not args.skip_llm:  # (the unshared graphs are also run and compared on the simulator before publishing; shared
        # contexts cannot be loaded there, so the shared row has no such check: docs/llm.md)
        row("ortcompile llm (shared)", [*llm, "-o", str(work / "pkg")], work / "pkg", tree)
        if not args.skip_separate:
            row("ortcompile llm --no-share-weights", [*llm, "--no-share-weights", "-o", str(work / "pkg-separate")], work / "pkg-separate", tree)
    graphs = static_graphs(folder, work / "static")
    parts = planned_parts(graphs["prefill"][0])
    largest = max(held for held, _ in parts)
    print(f"parts (held / stored GiB): {', '.join(f'{h / GiB:.2f} / {s / GiB:.2f}' for h, s in parts)}; goal 4 x largest + 1 GiB: "
          f"{(4 * largest + GiB) / GiB:.2f} GiB held, {(4 * max(s for _, s in parts) + GiB) / GiB:.2f} GiB stored", flush=True)
    rows.append({"method": "parts", "held": [h for h, _ in parts], "stored": [s for _, s in parts]})
    if not args.skip_raw:
        for stage, (graph, overrides) in graphs.items():
            out = work / f"raw-{stage}"
            model = out / f"{stage}_ctx.onnx"
            row(f"raw {stage}", [sys.executable, "-c", RAW_LLM_SCRIPT, str(graph), str(model), json.dumps(overrides)], out, make_dir=True)
            if rows[-1]["rc"] == 0:
                print(f"    {placement(model)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "stdout"} for r in rows], indent=2))
    shutil.rmtree(work / "pkg", ignore_errors=True)
    shutil.rmtree(work / "pkg-separate", ignore_errors=True)
    for stage in ("prefill", "decode"):
        shutil.rmtree(work / f"raw-{stage}", ignore_errors=True)
    shutil.rmtree(work / "static", ignore_errors=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
