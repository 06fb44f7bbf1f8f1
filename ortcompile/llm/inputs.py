"""Decoder inputs for the pre-publish check of each graph: what genai feeds, not generic random tensors.

Generic generated inputs are no decoder's inputs (a random `past_seq_len` is no position; a random cache can
overflow fp16 attention). These are: token ids within the vocabulary, the sequence-length inputs of a real step
(the prefill as the second window of a prompt, the decode after a few more tokens), and a small cache filled up
to that step, zeros after it. The check runs the compiled graph on its EP and the rewritten source on the CPU on
them and compares by the EP's criterion.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ortcompile.llm.genai import DECODE, PAST_SEQ_LEN, TOTAL_SEQ_LEN, GenaiModel
from ortcompile.readback.given import Given

CACHE_SCALE = 0.1  # small keys and values, as a real cache holds after layer norms


def check_inputs(model: GenaiModel, stage: str, context: int, prefill: int, vocab: int, ids_dtype: Any) -> dict[str, Given]:
    rng = np.random.default_rng(0)
    new = 1 if stage == DECODE else prefill
    filled = min(prefill + 3, context - 1) if stage == DECODE else min(prefill, context - prefill)
    origin = f"a {'decode' if stage == DECODE else 'prefill'} step after {filled} cached tokens"
    inputs = {model.input_ids: Given(rng.integers(1, vocab, size=(1, new)).astype(ids_dtype), origin),
              PAST_SEQ_LEN: Given(np.array([[filled + new - 1]], np.int32), origin),
              TOTAL_SEQ_LEN: Given(np.array([context], np.int32), origin)}
    for name in model.past_names:
        cache = np.zeros((1, model.kv_heads, context, model.head_size), np.float32)
        cache[:, :, :filled] = rng.standard_normal((1, model.kv_heads, filled, model.head_size)) * CACHE_SCALE
        inputs[name] = Given(cache, origin)
    return inputs
