"""Outputs whose shape depends on the data (a TTS whose length comes from rounded durations, a detector's box
count): at fp16 the compiled model may give another shape than the source, "[1, 601, 694] vs [1, 601, 696]",
and no elementwise check can pass. Such an output is compared on the overlapping region when the shapes differ
a little along the source's symbolic axes (the same rank and dtype, each differing axis within
MAX_LENGTH_CHANGE): it passes when that region meets the criterion — the extra trailing elements are what a
data-dependent length is — and the comparison says so. Otherwise the failure says "shape depends on the data"
with both shapes, not a bare accuracy failure.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx

from ortcompile.readback.compare import OutputComparison, compare_output
from ortcompile.readback.criteria import Criterion

MAX_LENGTH_CHANGE = 0.1  # a differing axis may be at most 10 % shorter or longer for the overlap to mean something


def data_dependent_outputs(source: Path) -> set[str]:
    """Outputs of the source whose declared shape has a symbolic or unknown dim (or no shape at all)."""
    model = onnx.load(str(source), load_external_data=False)
    dynamic = set()
    for output in model.graph.output:
        tensor = output.type.tensor_type
        if not tensor.HasField("shape") or any(not d.HasField("dim_value") for d in tensor.shape.dim):
            dynamic.add(output.name)
    return dynamic


def compare_shaped(name: str, got: np.ndarray, want: np.ndarray, criterion: Criterion, dynamic: bool) -> OutputComparison:
    """compare_output, or for a data-dependent output of another shape, the overlap (module docstring)."""
    got, want = np.asarray(got), np.asarray(want)
    if not dynamic or got.shape == want.shape or got.dtype != want.dtype or got.ndim != want.ndim:
        return compare_output(name, got, want, criterion)
    shapes = f"the compiled model gives {list(got.shape)}, the source {list(want.shape)}"
    whole = compare_output(name, got, want, criterion)
    overlap = tuple(min(a, b) for a, b in zip(got.shape, want.shape))
    change = max(abs(a - b) / max(a, b) for a, b in zip(got.shape, want.shape) if a != b)
    if 0 in overlap or change > MAX_LENGTH_CHANGE:
        return dataclasses.replace(whole, reason=f"shape depends on the data: {shapes}, too different to compare on their overlap")
    region = tuple(slice(0, n) for n in overlap)
    inner = compare_output(name, got[region], want[region], criterion)
    where = f"shape depends on the data: {shapes}; compared on the overlapping {list(overlap)}"
    if inner.ok:
        return dataclasses.replace(inner, shape=list(got.shape), note=f"{where}, which agrees" + (f" ({inner.note})" if inner.note else ""))
    return dataclasses.replace(inner, shape=list(got.shape), reason=f"{where}: {inner.reason}")
