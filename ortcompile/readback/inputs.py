"""Seeded inputs for every graph input, so two runs of two models see the same numbers."""

from __future__ import annotations

from typing import Any

import numpy as np

from ortcompile.errors import UsageError

# ORT's type strings -> numpy dtypes we can feed from Python.
NUMPY_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(int16)": np.int16,
    "tensor(uint16)": np.uint16,
    "tensor(int32)": np.int32,
    "tensor(uint32)": np.uint32,
    "tensor(int64)": np.int64,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
    "tensor(string)": np.str_,
}
INTEGER_HIGH = 4  # integers are drawn from [0, 4): small enough to be valid indices, token ids, axes


def resolve_shape(shape: list[Any], dims: dict[str, int], used: dict[str, int]) -> tuple[int, ...]:
    """Fixed dims as they are; symbolic ones from `dims` or 1 (recorded in `used`)."""
    resolved = []
    for dim in shape:
        if isinstance(dim, int) and dim >= 0:
            resolved.append(dim)
        else:
            name = dim if isinstance(dim, str) and dim else "?"
            used[name] = dims.get(name, 1)
            resolved.append(used[name])
    return tuple(resolved)


def make_inputs(session: Any, seed: int, dims: dict[str, int]) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """One array per session input; returns them and the symbolic dims that were chosen."""
    rng = np.random.default_rng(seed)
    used: dict[str, int] = {}
    feeds = {}
    for arg in session.get_inputs():
        dtype = NUMPY_TYPES.get(arg.type)
        if dtype is None:
            raise UsageError(f"input {arg.name!r} has type {arg.type}, which verify cannot generate from Python")
        shape = resolve_shape(list(arg.shape), dims, used)
        feeds[arg.name] = _random(rng, dtype, shape)
    return feeds, used


def _random(rng: np.random.Generator, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    if dtype is np.str_:
        return np.full(shape, "ortcompile", dtype=object)
    if dtype is np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, INTEGER_HIGH, size=shape).astype(dtype)
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
