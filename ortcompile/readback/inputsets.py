"""The input sets the check and `verify` judge a model on: several seeds, plus edge values its inputs suggest.

Random inputs alone let wrong models through (measured, issue 21): an audio front end computing
`Log(x² + 1e-10)` agrees at 25–30 dB on white noise and is wrong on real audio (tones over silence), since
1e-10 and small x² fall below fp16's range. So, by the role of each input (roles.py):

- audio-like float inputs feeding a Conv/STFT/Log front end: **silence** and **tones** (a 440 Hz sine at
  amplitude 0.1, a 3 kHz one at 0.01: quiet, as real recordings are);
- images (rank 4, feeding a Conv): a **gradient** and a **flat** field;
- integer ids indexing a table: **padded ids** (in-table ids, then the padding id of genai_config.json, else 0, over
  the second half); the seeded sets
  already draw in-table ids.

Inputs without such a role keep their seeded values in an edge set. Every set is judged by the same
criterion, and a failure names the set. The user's own samples (`--inputs DIR` of `.npz` files, one per
sample) replace the generated sets: realistic inputs are the answer to a generated set that is not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ortcompile.readback import roles as r

SILENCE, TONE_LOW, TONE_HIGH, GRADIENT, FLAT, PADDED_IDS = "silence", "tone 440 Hz", "tone 3 kHz", "gradient", "flat", "padded ids"
EDGES = {r.AUDIO: (SILENCE, TONE_LOW, TONE_HIGH), r.IMAGE: (GRADIENT, FLAT), r.TOKEN_IDS: (PADDED_IDS,), r.IDS: (PADDED_IDS,)}
TONES = {TONE_LOW: (440.0, 0.1), TONE_HIGH: (3000.0, 0.01)}  # Hz, amplitude
SAMPLE_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
DEFAULT_RATE = 16000


@dataclass(frozen=True)
class InputSet:
    """One set of inputs: a seed, and an edge style ("" for plain seeded values) or a user sample's index."""

    name: str
    seed: int = 0
    edge: str = ""
    sample: int | None = None  # index into the user's samples (given.Given.samples)


def seed_sets(seeds: tuple[int, ...]) -> list[InputSet]:
    return [InputSet(f"seed {s}", s) for s in seeds]


def edge_sets(roles: Mapping[str, str], seed: int = 0) -> list[InputSet]:
    """The edge sets the inputs' roles suggest, in a fixed order, each once."""
    names: list[str] = []
    for role in (r.AUDIO, r.IMAGE, r.TOKEN_IDS, r.IDS):
        if role in roles.values():
            names += [e for e in EDGES[role] if e not in names]
    return [InputSet(name, seed, name) for name in names]


def sample_sets(count: int, origins: list[str]) -> list[InputSet]:
    return [InputSet(f"sample {origins[i]}", 0, sample=i) for i in range(count)]


def edge_value(edge: str, role: str, shape: tuple[int, ...], dtype: np.dtype, rate: int, pad_id: int,
               table: int | None = None) -> tuple[np.ndarray, str] | None:
    """The array an edge set feeds an input of this role (None: the edge does not concern it)."""
    if edge not in EDGES.get(role, ()):
        return None
    if edge == SILENCE:
        return np.zeros(shape, dtype), "silence (zeros)"
    if edge in TONES:
        hertz, amplitude = TONES[edge]
        t = np.arange(shape[-1] if shape else 1) / rate
        wave = amplitude * np.sin(2 * np.pi * hertz * t)
        return np.broadcast_to(wave, shape).astype(dtype), f"a {hertz:g} Hz sine at amplitude {amplitude:g} ({rate} Hz sampling)"
    if edge == FLAT:
        return np.full(shape, 0.5, dtype), "a flat field of 0.5"
    if edge == GRADIENT:
        return _gradient(shape).astype(dtype), "a gradient from 0 to 1 across the image, offset per channel"
    return _padded_ids(shape, dtype, pad_id, table)


def _padded_ids(shape: tuple[int, ...], dtype: np.dtype, pad_id: int, table: int | None) -> tuple[np.ndarray, str]:
    """A padded sequence: in-table ids, then the padding id over the second half of the last axis. Not padding
    everywhere: a sequence of nothing but padding masks every position, which no model is fed (an attention's
    softmax over nothing is NaN in fp16 and a large negative number in fp32)."""
    length = shape[-1] if shape else 1
    keep = max(1, length - length // 2)
    top = max(1, table or pad_id + 2)
    ids = (pad_id + 1 + np.arange(length)) % top  # cycles through the table, the padding id last
    ids[keep:] = pad_id
    return np.broadcast_to(ids, shape).astype(dtype), f"in-table ids, then id {pad_id} (padding) from position {keep} of {length}"


def _gradient(shape: tuple[int, ...]) -> np.ndarray:
    channels_last = shape[3] in (1, 3, 4) and shape[1] not in (1, 3, 4)
    height, width = (shape[1], shape[2]) if channels_last else (shape[2], shape[3])
    ramp = (np.linspace(0, 1, width)[None, :] + np.linspace(0, 1, height)[:, None]) / 2
    channels = shape[3] if channels_last else shape[1]
    stacked = np.stack([0.75 * ramp + 0.25 * c / max(channels, 1) for c in range(channels)], axis=-1 if channels_last else 0)
    return np.broadcast_to(stacked, shape)


def sample_rate(hint_values: list[int | float | None]) -> int:
    """The sample rate an audio model is compared against (a `sr` input's Equal constant), else 16 kHz."""
    return next((int(v) for v in hint_values if v in SAMPLE_RATES), DEFAULT_RATE)
