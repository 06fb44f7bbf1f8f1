"""onnxruntime-genai model folders: what their genai_config.json says, and the config of a compiled package.

The package runs with genai's `decoder-pipeline` model type (onnxruntime-genai src/config.cpp): a `context` graph
(prefill, S = window) that runs on the prompt and an `iterator` graph (decode, S = 1) that runs on each generated
token, sharing one static KV cache of `context_length` slots (`past_present_share_buffer`). The `sliding_window`
section with `slide_inputs` makes genai feed the prompt in windows of exactly the prefill length (right-padded with
the pad token: `alignment: left`), and `slide_key_value_cache: false` keeps the cache static. genai then feeds
`past_sequence_length` ([1, 1] int32, the GroupQueryAttention `seqlens_k`: tokens so far - 1) and
`total_sequence_length` ([1] int32, the cache size) instead of an attention mask (genai src/models/input_ids.cpp).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

from ortcompile.errors import InvalidModel
from ortcompile.jsonedge import JsonObject
from ortcompile.paths import UnsafePath, resolve_inside
from ortcompile.plan.source import read_source

CONFIG = "genai_config.json"
PAST_SEQ_LEN = "past_seq_len"
TOTAL_SEQ_LEN = "total_seq_len"
PREFILL, DECODE = "context", "iterator"  # genai's names for the prompt and token-generation stages


@dataclass(frozen=True)
class GenaiModel:
    """The facts of a genai model folder that decide the static graphs."""

    folder: Path
    config: JsonObject  # genai_config.json as read: written back with the stages' changes (package_config)
    model_file: Path
    layers: int
    kv_heads: int
    head_size: int
    input_ids: str
    attention_mask: str
    past_key: str  # a %d pattern: past_key_values.%d.key
    past_value: str
    pad_token_id: int
    position_ids: str = "position_ids"

    @property
    def past_names(self) -> list[str]:
        return [pattern % i for i in range(self.layers) for pattern in (self.past_key, self.past_value)]


def read_genai_folder(folder: Path) -> GenaiModel:
    path = folder / CONFIG
    if not path.is_file():
        raise InvalidModel(f"{folder}: no {CONFIG}: give an onnxruntime-genai model folder (genai_config.json + model.onnx)")
    try:
        config = json.loads(path.read_text())
        decoder = config["model"]["decoder"]
        inputs = decoder["inputs"]
        model = GenaiModel(folder, config, folder / decoder["filename"], int(decoder["num_hidden_layers"]),
                           int(decoder["num_key_value_heads"]), int(decoder["head_size"]), inputs.get("input_ids", "input_ids"),
                           inputs.get("attention_mask", "attention_mask"), inputs.get("past_key_names", "past_key_values.%d.key"),
                           inputs.get("past_value_names", "past_key_values.%d.value"), int(config["model"].get("pad_token_id", 0)),
                           inputs.get("position_ids", "position_ids"))
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidModel(f"{path}: not an onnxruntime-genai config this version reads: {exc!r}") from exc
    if "pipeline" in decoder:
        raise InvalidModel(f"{path}: already a decoder pipeline; give the folder the model builder wrote")
    try:
        resolve_inside(folder, decoder["filename"])
    except UnsafePath as exc:
        raise InvalidModel(f"{path}: decoder filename: {exc}") from None
    if not model.model_file.is_file():
        raise InvalidModel(f"{path}: its decoder file {decoder['filename']!r} is not in {folder}")
    read_source(model.model_file)  # every external-data location checked (inside the folder) before one is linked
    carried_files(model)  # refused now, not after minutes of compile
    return model


@dataclass(frozen=True)
class PipelineStage:
    """One entry of the package's decoder pipeline: a compiled graph, what it reads and writes, when genai runs it."""

    name: str  # context, iterator; context_0, iterator_0, ... when partitioned
    filename: str
    inputs: list[str]
    outputs: list[str]
    prompt: bool  # run_on_prompt (the prefill graphs); else run_on_token_gen (the decode graphs)


def package_config(model: GenaiModel, stages: list[PipelineStage], context_length: int, prefill_length: int,
                   provider_options: dict[str, str]) -> JsonObject:
    """The genai_config.json of the compiled package. genai runs the stages in this order, each on the prompt or on
    generated tokens, and hands a stage's other outputs to the later stages reading them by name
    (src/models/decoder_only_pipeline.cpp); the KV cache, the sequence lengths and the logits it manages itself."""
    config = copy.deepcopy(model.config)
    decoder = config["model"]["decoder"]
    config["model"]["type"] = "decoder-pipeline"
    config["model"]["context_length"] = context_length
    decoder.pop("filename", None)
    inputs = {k: v for k, v in decoder["inputs"].items() if k not in ("attention_mask", "position_ids")}  # both derived (surgery.py)
    decoder["inputs"] = {**inputs, "past_sequence_length": PAST_SEQ_LEN, "total_sequence_length": TOTAL_SEQ_LEN}
    session = {"log_id": "onnxruntime-genai", "provider_options": [{"qnn": dict(provider_options)}]}
    decoder["session_options"] = session
    decoder["sliding_window"] = {"window_size": prefill_length, "pad_value": 0, "alignment": "left",
                                 "slide_key_value_cache": False, "slide_inputs": True}
    decoder["pipeline"] = [{stage.name: {"filename": stage.filename, "inputs": stage.inputs, "outputs": stage.outputs,
                                         "session_options": copy.deepcopy(session),
                                         "run_on_prompt": stage.prompt, "run_on_token_gen": not stage.prompt}}
                           for stage in stages]
    search = config.setdefault("search", {})
    search["max_length"] = context_length
    search["past_present_share_buffer"] = True
    return config


def carried_files(model: GenaiModel) -> list[Path]:
    """The folder's other files the package keeps (tokenizer, chat template, processor config): not the model or its data.

    A symlink that leads out of the folder is refused, never followed: the package would carry (and ship) whatever
    file it names, a private key as readily as a tokenizer."""
    skip = {CONFIG, model.model_file.name}
    carried = sorted(p for p in model.folder.iterdir()
                     if p.is_file() and p.name not in skip and not p.name.startswith(model.model_file.name) and p.suffix != ".onnx")
    for path in carried:
        try:
            resolve_inside(model.folder, path.name, plain=True)
        except UnsafePath as exc:
            raise InvalidModel(f"{path}: {exc}: the package would carry that file; copy it into {model.folder} or remove the link") from None
    return carried
