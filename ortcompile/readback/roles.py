"""What each input of a model *is*: token ids, position ids, a RoPE table, an attention mask, a KV cache, audio,
an image — from its name, type, rank and the ops that consume it in the source graph, and from the
onnxruntime-genai `genai_config.json` beside the model when there is one.

The role decides what realistic values look like (llm.py, inputsets.py): the check once refused a correct
decoder at "SNR 0.0 dB" because its cos/sin tables were filled with 0..31 (named like position ids) and its
caches with uniform noise, which overflows fp16 attention; an audio front end `Log(x² + 1e-10)` passed on
white noise and was wrong on silence. Nothing here knows a particular model.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from ortcompile.jsonedge import JsonObject
from ortcompile.onnxfacts import graph_inputs
from ortcompile.readback.hints import PASS_THROUGH, InputHint
from ortcompile.readback.inputspec import InputSpec

TOKEN_IDS, IDS, POSITIONS = "token ids", "ids", "position ids"
ROPE_COS, ROPE_SIN = "rope cos", "rope sin"
MASK01, MASK_ADDITIVE, KV_CACHE = "0/1 attention mask", "additive attention mask", "kv cache"
AUDIO, IMAGE = "audio", "image"
LLM_ROLES = (TOKEN_IDS, POSITIONS, ROPE_COS, ROPE_SIN, MASK01, MASK_ADDITIVE, KV_CACHE)

KV_NAME = re.compile(r"(^|[_./])(past|cache|kv)([_./]|$)|past_key|past_value|key_cache|value_cache|past_key_values", re.IGNORECASE)
COS_NAME = re.compile(r"(^|[^a-z])cos([^a-z]|$)|cos_cache|cos_cached", re.IGNORECASE)
SIN_NAME = re.compile(r"(^|[^a-z])sin([^a-z]|$)|sin_cache|sin_cached", re.IGNORECASE)
MASK_NAME = re.compile(r"mask", re.IGNORECASE)
POSITION_NAME = re.compile(r"position|(^|[_./])pos(_?ids?)?$", re.IGNORECASE)
TOKEN_NAME = re.compile(r"input_ids|token|(^|[_./])ids$|(^|[_./])tokens?([_./]|$)", re.IGNORECASE)
AUDIO_NAME = re.compile(r"audio|wav|speech|pcm|waveform|signal|samples", re.IGNORECASE)
FRONT_END_OPS = frozenset({"Conv", "STFT", "DFT", "Log", "MelWeightMatrix"})  # what raw audio meets first
FRONT_END_HOPS = 4  # ops of any kind followed from an input: Log(x*x + eps) is 3 ops away
MIN_AUDIO_SAMPLES = 128


@dataclass(frozen=True)
class InputFacts:
    """What the source graph does with one input."""

    reaches: frozenset[str] = frozenset()  # op types within FRONT_END_HOPS (any op)
    first_op: str = ""  # the first op past value-preserving ones ("" when none)


@dataclass
class ModelFacts:
    """Per-input facts of the source graph and its genai_config.json (empty when absent)."""

    inputs: dict[str, InputFacts] = field(default_factory=dict)
    genai: JsonObject = field(default_factory=dict)  # genai_config.json as read: genai's schema, checked field by field where read
    rope_theta: float = 10000.0  # from a Hugging Face config.json beside the model, else the usual base


def read_facts(model: onnx.ModelProto, source: Path | None = None) -> ModelFacts:
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in model.graph.node:
        for name in node.input:
            if name:
                consumers[name].append(node)
    facts = ModelFacts({v.name: _facts_of(v.name, consumers) for v in graph_inputs(model.graph)})
    if source is not None:
        facts.genai = _json_beside(source, "genai_config.json")
        theta = _json_beside(source, "config.json").get("rope_theta")
        if isinstance(theta, (int, float)) and theta > 1:
            facts.rope_theta = float(theta)
    return facts


def _facts_of(name: str, consumers: Mapping[str, list[onnx.NodeProto]]) -> InputFacts:
    reaches: set[str] = set()
    first = ""
    frontier, seen = [(name, True)], {name}
    for _ in range(FRONT_END_HOPS):
        following = []
        for tensor, through_copies in frontier:
            for node in consumers.get(tensor, []):
                reaches.add(node.op_type)
                copies = node.op_type in PASS_THROUGH and node.op_type not in ("Concat", "Gather")
                if through_copies and not copies and not first:
                    first = node.op_type
                following += [(o, through_copies and copies) for o in node.output if o and o not in seen]
                seen.update(node.output)
        frontier = following
    return InputFacts(frozenset(reaches), first)


def _json_beside(source: Path, name: str) -> JsonObject:
    path = source.parent / name
    try:
        if path.is_file() and path.stat().st_size < 2**20:
            loaded = json.loads(path.read_text(encoding="utf-8"))
            return loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        pass  # an unreadable config only means fewer facts
    return {}


def genai_decoder(facts: ModelFacts) -> JsonObject:
    decoder = facts.genai.get("model", {}).get("decoder", {}) if isinstance(facts.genai.get("model"), dict) else {}
    return decoder if isinstance(decoder, dict) else {}


def genai_int(facts: ModelFacts, key: str) -> int | None:
    """model.KEY (vocab_size, pad_token_id, context_length) or model.decoder.KEY (head_size) from genai_config."""
    model = facts.genai.get("model", {})
    value = model.get(key, genai_decoder(facts).get(key)) if isinstance(model, dict) else None
    value = value[0] if isinstance(value, list) and value else value  # eos/pad may be lists
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _genai_roles(facts: ModelFacts) -> dict[str, str]:
    """Input names genai_config declares (model.decoder.inputs), by role; `%d` templates become patterns."""
    names = genai_decoder(facts).get("inputs", {})
    if not isinstance(names, dict):
        return {}
    by_key = {"input_ids": TOKEN_IDS, "position_ids": POSITIONS, "attention_mask": MASK01,
              "past_key_names": KV_CACHE, "past_value_names": KV_CACHE}
    return {str(v): by_key[k] for k, v in names.items() if k in by_key and isinstance(v, str)}


def role_of(spec: InputSpec, facts: ModelFacts, hint: InputHint | None, extent: int | None = None) -> str:
    """The role of one input ("" when none applies). `extent`: the size of its last axis, when known."""
    declared = _declared_role(spec, facts)
    if declared:
        return _mask_kind(spec, facts) if declared == MASK01 else declared
    dtype = spec.dtype
    kind = dtype.kind if dtype is not None else ""
    rank = len(spec.dims)
    name = spec.name
    if kind == "f" and rank >= 3 and KV_NAME.search(name) and not (COS_NAME.search(name) or SIN_NAME.search(name)):
        return KV_CACHE
    if kind == "f" and COS_NAME.search(name):
        return ROPE_COS
    if kind == "f" and SIN_NAME.search(name):
        return ROPE_SIN
    if kind and kind in "biuf" and MASK_NAME.search(name):
        return _mask_kind(spec, facts)
    integer = bool(kind) and kind in "iu"
    if integer and POSITION_NAME.search(name):
        return POSITIONS
    if integer and hint is not None and hint.high:
        return TOKEN_IDS if TOKEN_NAME.search(name) else IDS
    if kind == "f":
        return _signal_role(spec, facts.inputs.get(name, InputFacts()), extent)
    return ""


def _declared_role(spec: InputSpec, facts: ModelFacts) -> str:
    for pattern, role in _genai_roles(facts).items():
        if re.fullmatch(re.escape(pattern).replace("%d", r"\d+"), spec.name):
            return role
    return ""


def _mask_kind(spec: InputSpec, facts: ModelFacts) -> str:
    """Additive when the mask is added to scores (or, unseen, a float mask of rank >= 3); else 0/1."""
    dtype = spec.dtype
    if dtype is None or dtype.kind != "f":
        return MASK01
    first = facts.inputs.get(spec.name, InputFacts()).first_op
    if first:
        return MASK_ADDITIVE if first in ("Add", "Sum") else MASK01
    return MASK_ADDITIVE if len(spec.dims) >= 3 else MASK01


def _signal_role(spec: InputSpec, facts: InputFacts, extent: int | None) -> str:
    rank = len(spec.dims)
    if rank == 4 and "Conv" in facts.reaches and any(_dim_in(spec, axis, (1, 3, 4)) for axis in (1, 3)):
        return IMAGE
    long_enough = extent is None or extent >= MIN_AUDIO_SAMPLES
    mono = rank < 3 or _dim_in(spec, 1, (1, 2))
    if 1 <= rank <= 3 and mono and long_enough and (facts.reaches & FRONT_END_OPS or (AUDIO_NAME.search(spec.name) and "Conv" in facts.reaches)):
        return AUDIO
    return ""


def _dim_in(spec: InputSpec, axis: int, sizes: Sequence[int]) -> bool:
    return axis < len(spec.dims) and spec.dims[axis] in sizes
