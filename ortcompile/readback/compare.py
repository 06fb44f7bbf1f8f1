"""Judging one output of a compiled model against the reference's, under a Criterion (criteria.py).

`compare_output` keeps every field of verify's OutputComparison (name, shape, dtype, max_abs, max_rel,
mismatches, total, reason, ok), computed as verify always has, and adds the parity metrics and which
criterion applied. The JSON stays RFC 8259: a metric that is not finite is null, and

- ``exact`` is true when every element is equal (NaN matching NaN): SNR and PSNR are then +inf, given as null;
- otherwise a null SNR/PSNR means there is no signal to compare with (the reference is all zeros), a null
  cosine that one side is all zeros or the output has one element (its cosine is only a sign), a null top1
  that no row of the last axis has a decisive winner.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, TypedDict

import numpy as np

from ortcompile.jsonedge import JsonObject
from ortcompile.readback.criteria import DEFAULTS, PRECISIONS, PURPOSES, Criterion, criterion_for

__all__ = ["DEFAULTS", "PRECISIONS", "PURPOSES", "Criterion", "OutputComparison", "compare_output", "criterion_for"]

FP16_MAX = 65504.0  # an fp16 EP saturates where fp32 overflows to inf: +-65504 matches a reference's +-inf under parity
TOP_K = 5  # the k of the reported top-k overlap (Qualcomm AI Hub reports top-1 and top-5)


@dataclass(frozen=True)
class OutputComparison:
    name: str
    shape: list[int]
    dtype: str
    max_abs: float | None  # None when the outputs cannot be compared element by element (see reason)
    max_rel: float | None
    mismatches: int  # elements outside the criterion's rtol/atol (integers, bools, strings: not equal)
    total: int
    reason: str = ""  # "" when ok; else one line saying why not
    ok: bool = True
    criterion: str = "tolerance"  # the kind that applied; the report carries Criterion.to_json() once
    exact: bool = False
    snr_db: float | None = None
    psnr_db: float | None = None
    cosine: float | None = None
    top1: float | None = None  # argmax agreement over decisive rows of the last axis
    top1_rows: int = 0  # decisive rows counted in top1
    topk: float | None = None  # mean overlap of the top-5 sets over rows of the last axis (last axis > 5)
    nonfinite: int = 0  # elements NaN/inf where the reference is finite, or not matching the reference's NaN/inf
    note: str = ""  # ok through the elementwise tolerance alone, the metrics would fail (near-zero outputs): a weak pass

    def to_json(self) -> JsonObject:
        return {k: _finite_or_none(v) for k, v in asdict(self).items()}

    def metric(self, name: str) -> float | None:
        """A metric as the JSON gives it: None when unknown or not finite (an exact output's SNR is +inf)."""
        return _finite_or_none(getattr(self, name))


class _Common(TypedDict):
    """The fields every comparison of one output shares, passed on as OutputComparison's keywords."""

    name: str
    shape: list[int]
    dtype: str
    total: int
    criterion: str


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def compare_output(name: str, got: np.ndarray, want: np.ndarray | None, criterion: Criterion) -> OutputComparison:
    """Compare the compiled model's output `got` with the reference's `want` (None: the reference has no such output)."""
    got = np.asarray(got)
    base = _Common(name=name, shape=list(got.shape), dtype=str(got.dtype), total=int(got.size), criterion=criterion.kind)
    if want is None or np.asarray(want).shape != got.shape or np.asarray(want).dtype != got.dtype:
        expected = "missing" if want is None else f"{np.asarray(want).dtype}{list(np.asarray(want).shape)}"
        reason = f"the compiled model gives {got.dtype}{list(got.shape)}, the source {expected}"
        return OutputComparison(**base, max_abs=None, max_rel=None, mismatches=int(got.size) or 1, reason=reason, ok=False)
    want = np.asarray(want)
    if got.dtype.kind != "f":  # complex outputs too: compared for equality
        return _compare_exact(base, got, want, criterion)
    return _compare_floats(base, got, want, criterion)


def _compare_exact(base: _Common, got: np.ndarray, want: np.ndarray, criterion: Criterion) -> OutputComparison:
    """Integers, bools, strings: equal or not (verify's max_abs/max_rel as numbers; strings: the count of differences)."""
    mismatched = int(np.count_nonzero(got != want))
    numeric = got.dtype.kind in "iub"
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0)) if numeric else float(mismatched)
    equal_fraction = 1.0 - mismatched / got.size if got.size else 1.0
    required = 1.0 if criterion.kind == "tolerance" else criterion.min_equal_fraction
    ok = equal_fraction >= required
    reason = "" if ok else f"{mismatched}/{got.size} elements differ" + (f" (at most {1 - required:.3g} of them may)" if required < 1 else "")
    return OutputComparison(**base, max_abs=diff, max_rel=diff, mismatches=mismatched, reason=reason, ok=ok, exact=mismatched == 0)


def _compare_floats(base: _Common, got: np.ndarray, want: np.ndarray, criterion: Criterion) -> OutputComparison:
    g, w = got.astype(np.float64), want.astype(np.float64)
    both_finite = np.isfinite(g) & np.isfinite(w)
    close = np.isclose(g, w, rtol=criterion.rtol, atol=criterion.atol, equal_nan=True)
    if criterion.kind == "parity":  # fp16 saturates where fp32 overflows: +-65504 (or beyond) is the reference's +-inf
        with np.errstate(invalid="ignore"):
            close |= np.isinf(w) & (np.sign(w) * g >= FP16_MAX)
    with np.errstate(invalid="ignore"):  # inf - inf: those elements are masked out just below
        abs_diff = np.where(both_finite, np.abs(g - w), 0.0)  # inf/nan placement differences count as mismatches
    # Near zero, relative error means nothing: the atol floor. Over finite pairs only (verify.compare_outputs
    # divides by a NaN reference here and reports max_rel NaN, which is not JSON).
    rel_diff = abs_diff / np.maximum(np.where(both_finite, np.abs(w), 0.0), max(criterion.atol, 1e-30))
    nonfinite = _nonfinite_problems(g, w, both_finite, saturate=criterion.kind == "parity")
    metrics = _metrics(g[both_finite], w[both_finite]) if both_finite.any() else {}
    exact = bool(np.array_equal(g, w, equal_nan=True))
    comparison = OutputComparison(
        **base,
        max_abs=float(abs_diff.max(initial=0.0)),
        max_rel=float(rel_diff.max(initial=0.0)),
        mismatches=int(close.size - np.count_nonzero(close)),
        exact=exact,
        nonfinite=nonfinite,
        **metrics,
    )
    if criterion.kind == "parity" and g.ndim and g.shape[-1] >= 2:
        top1, rows, topk = _top1(g, w, criterion)
        comparison = _replace(comparison, top1=top1, top1_rows=rows, topk=topk)
    if criterion.kind == "tolerance":
        reason = _tolerance_failure(comparison, criterion)
        return _replace(comparison, reason=reason, ok=not reason)
    reason = _parity_failure(comparison, criterion)
    note = ""
    if not reason and comparison.mismatches == 0 and not exact and (weak := _metrics_failure(comparison, criterion)):
        note = f"passed on rtol={criterion.rtol:g} atol={criterion.atol:g} alone ({weak}): too small or flat to judge by its metrics; real inputs would tell"
    return _replace(comparison, reason=reason, ok=not reason, note=note)


def _replace(comparison: OutputComparison, **changes: Any) -> OutputComparison:
    return OutputComparison(**{**asdict(comparison), **changes})


def _nonfinite_problems(g: np.ndarray, w: np.ndarray, both_finite: np.ndarray, saturate: bool) -> int:
    """Elements where got is NaN/inf and want is finite, or want's NaN/inf is not reproduced.

    Under parity an fp16 EP's +-65504 (or beyond) stands for the reference's +-inf: fp16 saturates there.
    """
    if both_finite.all():
        return 0
    want_finite = np.isfinite(w)
    broken = int(np.count_nonzero(want_finite & ~np.isfinite(g)))
    odd = ~want_finite
    reproduced = (np.isnan(w[odd]) & np.isnan(g[odd])) | (w[odd] == g[odd])
    if saturate:
        reproduced |= np.isinf(w[odd]) & (np.sign(w[odd]) * g[odd] >= FP16_MAX)
    return broken + int(np.count_nonzero(~reproduced))


def _metrics(g: np.ndarray, w: np.ndarray) -> dict[str, float | None]:
    """SNR, PSNR (peak = max |reference|) and cosine over elements finite on both sides."""
    noise = float(np.sum((g - w) ** 2))
    signal = float(np.sum(w * w))
    peak = float(np.max(np.abs(w)))
    if noise == 0.0:
        snr = psnr = math.inf  # exact: null plus "exact": true in JSON
    elif signal == 0.0:
        snr = psnr = None  # no signal: undefined
    else:
        snr = 10.0 * math.log10(signal / noise)
        psnr = 20.0 * math.log10(peak / math.sqrt(noise / w.size))
    norms = float(np.linalg.norm(g)) * math.sqrt(signal)
    cosine = float(np.dot(g.ravel(), w.ravel()) / norms) if norms > 0 and w.size > 1 else None
    return {"snr_db": snr, "psnr_db": psnr, "cosine": None if cosine is None else max(-1.0, min(1.0, cosine))}


def _top1(g: np.ndarray, w: np.ndarray, criterion: Criterion) -> tuple[float | None, int, float | None]:
    """Argmax agreement over decisive rows of the last axis, and the mean top-k overlap of all rows.

    A row is decisive when the reference's winner beats its runner-up by more than twice the elementwise
    tolerance at the winner: rounding within that tolerance cannot swap them, a wrong model can.
    """
    g2, w2 = g.reshape(-1, g.shape[-1]), w.reshape(-1, w.shape[-1])
    usable = np.isfinite(g2).all(axis=1) & np.isfinite(w2).all(axis=1)
    g2, w2 = g2[usable], w2[usable]
    if not len(w2):
        return None, 0, None
    top2 = np.partition(w2, -2, axis=1)[:, -2:]
    margin = 2.0 * (criterion.atol + criterion.rtol * np.abs(top2[:, 1]))
    decisive = (top2[:, 1] - top2[:, 0]) > margin
    rows = int(np.count_nonzero(decisive))
    agree = np.argmax(g2[decisive], axis=1) == np.argmax(w2[decisive], axis=1)
    top1 = float(np.mean(agree)) if rows else None
    topk = None
    if w2.shape[1] > TOP_K:
        want_k = np.argpartition(w2, -TOP_K, axis=1)[:, -TOP_K:]
        got_k = np.argpartition(g2, -TOP_K, axis=1)[:, -TOP_K:]
        topk = float(np.mean((want_k[:, :, None] == got_k[:, None, :]).any(axis=2)))
    return top1, rows, topk


def _tolerance_failure(c: OutputComparison, criterion: Criterion) -> str:
    if c.mismatches == 0:
        return ""
    return f"{c.mismatches}/{c.total} elements outside rtol={criterion.rtol} atol={criterion.atol}, max abs diff {c.max_abs:.3g}"


def _parity_failure(c: OutputComparison, criterion: Criterion) -> str:
    """"" when the output passes parity; else the first reason it does not (criteria.py says why each exists)."""
    if c.nonfinite:
        return f"{c.nonfinite}/{c.total} elements are NaN or inf where the source's are not (or the other way round)"
    if c.mismatches == 0:
        return ""  # every element within the elementwise tolerance
    failure = _metrics_failure(c, criterion)
    if not failure:
        return ""
    return f"{failure}; max abs diff {c.max_abs:.3g}, {c.mismatches}/{c.total} elements outside rtol={criterion.rtol:g} atol={criterion.atol:g}"


def _metrics_failure(c: OutputComparison, criterion: Criterion) -> str:
    """The first aggregate metric below its threshold, or ""."""
    if c.snr_db is None and not c.exact:
        return "the source's output is all zeros, the compiled model's is not"
    if criterion.min_snr_db is not None and c.snr_db is not None and c.snr_db < criterion.min_snr_db:
        return f"SNR {c.snr_db:.1f} dB < {criterion.min_snr_db:g} dB"
    if criterion.min_psnr_db is not None and c.psnr_db is not None and c.psnr_db < criterion.min_psnr_db:
        return f"PSNR {c.psnr_db:.1f} dB < {criterion.min_psnr_db:g} dB"
    if criterion.min_cosine is not None and c.cosine is not None and c.cosine < criterion.min_cosine:
        digits = 4  # enough to show the two apart: 0.99999987 < 0.9999999, not 1.0000 < 1
        while round(c.cosine, digits) >= round(criterion.min_cosine, digits) and digits < 12:
            digits += 1
        return f"cosine similarity {c.cosine:.{digits}f} < {criterion.min_cosine:.{digits}g}"
    if criterion.min_top1 is not None and c.top1 is not None and c.top1 < criterion.min_top1:
        return f"argmax differs on {round((1 - c.top1) * c.top1_rows)}/{c.top1_rows} decisive rows (top-1 agreement {c.top1:.3f} < {criterion.min_top1:g})"
    return ""
