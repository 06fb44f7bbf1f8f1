"""Realistic values for a decoder's inputs: one prefill step over a partly filled KV cache.

Measured on a static standard-ops decoder (tests/llmmodels.py, QNN HTP): generic inputs (cos/sin tables filled
with 0..31, an all-ones additive mask, uniform caches) overflow fp16 attention and the check refused the
correct model at SNR 4.5 dB; the values below are what the model sees when it generates, and it agrees.

The layout is read from the shapes: S query tokens (the token ids' last axis, else the mask's second-last),
C cache slots (a cache input's second-last axis), T keys (the mask's last axis). When T == C + S the present
is past ++ new (slots 0..P-1 filled, the new tokens at C..C+S-1); otherwise the new tokens follow the past
(P..P+S-1). P, the filled length, is half the cache (within what the mask covers): part filled, never empty
or full, so both the cache and the masking are exercised.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ortcompile.readback import roles as r

FP16_MIN = -65504.0  # the additive mask's "minus infinity": the most negative value fp16 holds
CACHE_STD = 0.25  # cached keys/values: small, as after a norm and a projection


@dataclass(frozen=True)
class Layout:
    query: int  # S
    cache: int  # C (0: no cache inputs)
    total: int | None  # T, the keys the mask covers (None: no mask with a key axis)
    past: int  # P: filled cache slots
    head_size: int | None  # D, from a cache's last axis or genai_config

    @property
    def appended(self) -> bool:
        """The present is past ++ new (the new tokens' keys sit after all C slots)."""
        return self.total is not None and self.cache > 0 and self.total == self.cache + self.query

    def key_valid(self) -> np.ndarray:
        """[T] (or [C + S]) bool: key slots holding a real token (past or new)."""
        total = self.total if self.total is not None else self.past + self.query
        slots = np.arange(total)
        if self.appended:
            return (slots < self.past) | (slots >= self.cache)
        return slots < self.past + self.query

    def causal(self) -> np.ndarray:
        """[S, T] bool: query i may attend key j."""
        total = self.total if self.total is not None else self.past + self.query
        slots = np.arange(total)[None, :]
        rows = np.arange(self.query)[:, None]
        if self.appended:
            return (slots < self.past) | ((slots >= self.cache) & (slots - self.cache <= rows))
        return slots <= self.past + rows

    def describe(self) -> str:
        cache = f", cache {self.past}/{self.cache} slots filled" if self.cache else ""
        return f"prefill of {self.query} tokens at positions {self.past}..{self.past + self.query - 1}{cache}"


def layout_of(roles: Mapping[str, str], shapes: Mapping[str, tuple[int, ...]], head_size: int | None = None) -> Layout | None:
    """The layout of a decoder step from its inputs' roles and shapes; None when nothing is LLM-like."""
    named = {role: [n for n, rl in roles.items() if rl == role] for role in r.LLM_ROLES}
    if not (named[r.KV_CACHE] or named[r.ROPE_COS] or named[r.ROPE_SIN] or named[r.MASK_ADDITIVE]):
        return None  # a 0/1 mask or position ids alone (a BERT): the generic choice, nothing to be consistent with
    query = _first_axis(shapes, named[r.TOKEN_IDS] + named[r.POSITIONS], -1) or _first_axis(shapes, named[r.MASK_ADDITIVE], -2) or 1
    caches = [shapes[n] for n in named[r.KV_CACHE] if len(shapes[n]) >= 3]
    cache = caches[0][-2] if caches else 0
    head_size = head_size or (caches[0][-1] if caches else None)
    total = _first_axis(shapes, named[r.MASK_ADDITIVE] + named[r.MASK01], -1)
    past = cache // 2
    if total is not None and total != cache + query:
        past = max(0, min(past, total - query))
    return Layout(query, cache, total, past, head_size)


def _first_axis(shapes: Mapping[str, tuple[int, ...]], names: list[str], axis: int) -> int | None:
    for name in names:
        shape = shapes[name]
        if len(shape) >= -axis:
            return shape[axis]
    return None


def llm_value(role: str, shape: tuple[int, ...], dtype: np.dtype, layout: Layout, rng: np.random.Generator,
              high: int | None, theta: float) -> tuple[np.ndarray, str]:
    """The array for one LLM input, and a note saying what it holds."""
    if role == r.POSITIONS:
        positions = layout.past + np.arange(shape[-1]) if shape[-1] == layout.query else np.arange(shape[-1])
        positions = positions % high if high else positions
        return np.broadcast_to(positions, shape).astype(dtype), f"positions {positions[0]}..{positions[-1]} ({layout.describe()})"
    if role in (r.ROPE_COS, r.ROPE_SIN):
        return _rope(role, shape, dtype, layout, theta)
    if role == r.MASK_ADDITIVE:
        allowed = _fit_keys(layout.causal(), shape[-1])
        mask = np.where(allowed, 0.0, FP16_MIN)
        rows = mask if len(shape) >= 2 and shape[-2] == layout.query else mask[-1:]
        return np.broadcast_to(rows, shape).astype(dtype), f"causal additive mask, 0 or {FP16_MIN:g} ({layout.describe()})"
    if role == r.MASK01:
        valid = _fit_keys(layout.key_valid()[None, :], shape[-1])
        if len(shape) >= 2 and shape[-2] == layout.query and len(shape) >= 3:
            valid = _fit_keys(layout.causal(), shape[-1])
        return np.broadcast_to(valid, shape).astype(dtype), f"1 on the {int(valid[-1].sum())} real tokens, 0 elsewhere ({layout.describe()})"
    if role == r.KV_CACHE:
        values = np.clip(rng.normal(0.0, CACHE_STD, size=shape), -1, 1)
        filled = np.arange(shape[-2]) < layout.past if len(shape) >= 2 else np.ones(shape, bool)
        values = values * filled[:, None] if len(shape) >= 2 else values
        return values.astype(dtype), f"cache: {layout.past} of {shape[-2]} slots filled, normal(0, {CACHE_STD:g}), the rest 0"
    raise ValueError(role)


def _fit_keys(mask: np.ndarray, keys: int) -> np.ndarray:
    """A [.., T] mask cut or padded (with False) to `keys` slots: a mask input whose key axis is not T."""
    if mask.shape[-1] >= keys:
        return mask[..., :keys]
    return np.concatenate([mask, np.zeros((*mask.shape[:-1], keys - mask.shape[-1]), bool)], axis=-1)


def _rope(role: str, shape: tuple[int, ...], dtype: np.dtype, layout: Layout, theta: float) -> tuple[np.ndarray, str]:
    """cos/sin of real positions × inv_freq. A table as wide as the head repeats its halves (rotate-half
    layout); one half as wide has one column per frequency."""
    width = shape[-1]
    full = layout.head_size == width and width % 2 == 0
    head = width if full else 2 * width
    freq_index = np.arange(width) % (head // 2)
    inv_freq = theta ** (-2.0 * freq_index / head)
    rows = shape[-2] if len(shape) >= 2 else 1
    positions = layout.past + np.arange(rows) if rows == layout.query else np.arange(rows)
    angles = positions[:, None] * inv_freq[None, :]
    table = np.cos(angles) if role == r.ROPE_COS else np.sin(angles)
    table = table if len(shape) >= 2 else table[0]
    what = "full-width (halves repeated)" if full else "half-width"
    return np.broadcast_to(table, shape).astype(dtype), f"{role.split()[1]} of positions {positions[0]}..{positions[-1]} × inv_freq (base {theta:g}, {what})"
