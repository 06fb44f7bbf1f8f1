"""`ortcompile verify`: prove a compiled model computes what its source computes.

Order matters for memory and for honesty: integrity first (a tampered file fails before anything
runs); then one session at a time (compiled on its EP, the source on the same EP for the load-time
comparison, the source on the CPU EP for reference outputs), each freed before the next, so a large
model is never held twice.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ortcompile import eps
from ortcompile.compile.shapes import dimension_overrides
from ortcompile.compile.source import SourceModel, read_source
from ortcompile.errors import CompilationFailed, InvalidModel, UsageError
from ortcompile.options import Tolerance
from ortcompile.readback.inputs import make_inputs
from ortcompile.readback.inspect import inspect_model
from ortcompile.readback.integrity import ManifestStatus, check_manifest
from ortcompile.run.sessions import open_session, probe_load

VERIFY_FORMAT = "ortcompile-verify/1"


@dataclass(frozen=True)
class OutputComparison:
    name: str
    shape: list[int]
    dtype: str
    max_abs: float | None  # None when the outputs cannot be compared element by element (see reason)
    max_rel: float | None
    mismatches: int
    total: int
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "ok": self.ok}  # floats are finite or None: the JSON stays RFC 8259


@dataclass
class VerifyReport:
    compiled: Path
    reference: Path
    ep: str
    tolerance: Tolerance
    integrity: ManifestStatus
    dims: dict[str, int] = field(default_factory=dict)
    session_seconds: dict[str, float] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)  # {"seed": n, "outputs": [OutputComparison]}
    structure_problems: list[str] = field(default_factory=list)  # missing/short/unsafe files the graph names
    error: str = ""

    @property
    def integrity_ok(self) -> bool:
        return (self.integrity.ok or not self.integrity.found) and not self.structure_problems

    @property
    def outputs_ok(self) -> bool:
        return bool(self.runs) and all(c.ok for run in self.runs for c in run["outputs"])

    @property
    def ok(self) -> bool:
        return self.integrity_ok and self.outputs_ok and not self.error

    def failure(self) -> str:
        """One line saying why verification failed."""
        if not self.integrity_ok:
            manifest_problems = self.integrity.problems if self.integrity.found else []  # no manifest is no failure
            return "integrity check failed: " + "; ".join(manifest_problems + self.structure_problems)
        if self.error:
            return self.error
        bad = [(run["seed"], c) for run in self.runs for c in run["outputs"] if not c.ok]
        seed, worst = bad[0]
        if worst.reason:
            return f"output {worst.name!r} differs from the source: {worst.reason}"
        return (f"output {worst.name!r} differs from the source (seed {seed}): {worst.mismatches}/{worst.total} elements "
                f"outside rtol={self.tolerance.rtol} atol={self.tolerance.atol}, max abs diff {worst.max_abs:.3g}")

    def to_json(self) -> dict[str, Any]:
        compiled_s, source_s = self.session_seconds.get("compiled"), self.session_seconds.get("source_on_ep")
        return {
            "format": VERIFY_FORMAT,
            "ok": self.ok,
            "compiled": str(self.compiled),
            "reference": str(self.reference),
            "ep": self.ep,
            "tolerance": {"rtol": self.tolerance.rtol, "atol": self.tolerance.atol},
            "integrity": {**self.integrity.to_json(), "referenced_files_problems": self.structure_problems},
            "dims": self.dims,
            "session_seconds": self.session_seconds,
            # Only meaningful when the EP compiled something: for the CPU EP both loads are the same work.
            "load_speedup": round(source_s / compiled_s, 2) if compiled_s and source_s and self.ep != eps.CPU_EP else None,
            "runs": [{"seed": r["seed"], "outputs": [c.to_json() for c in r["outputs"]]} for r in self.runs],
            "failure": "" if self.ok else self.failure(),
        }


def verify_model(
    compiled: str | Path,
    reference: str | Path,
    ep: str | eps.ResolvedEp | None = None,
    tolerance: Tolerance | None = None,
    seed: int = 0,
    runs: int = 1,
    fix_dims: dict[str, int] | None = None,
    time_source: bool = True,
) -> VerifyReport:
    """Check integrity, then compare the compiled model on its EP with the source on the CPU EP."""
    compiled, reference = Path(compiled), Path(reference)
    if not compiled.is_file():
        raise InvalidModel(f"{compiled}: no such file")
    source = read_source(reference)
    integrity = check_manifest(compiled, hash_files=True)
    structure = inspect_model(compiled)
    report = VerifyReport(compiled, reference, "", tolerance or Tolerance(), integrity)
    report.structure_problems = [p for p in structure.problems if p not in integrity.problems]
    report.ep = (resolved := _resolve_ep(ep, integrity)).name
    report.tolerance = default_tolerance(resolved.info, tolerance)
    if not report.integrity_ok:
        return report
    recorded = integrity.manifest.options if integrity.manifest else {}
    report.dims = choose_dims(source, structure.inputs, recorded, fix_dims or {})
    if integrity.manifest and integrity.manifest.shares_ep_context:
        why = probe_load(compiled, resolved.info.short_name, resolved.options, report.dims)
        if why:
            raise CompilationFailed(f"shared EP context: cannot be loaded on this device ({resolved.name}: {why})")
    _compare_sessions(report, resolved, [seed + i for i in range(max(1, runs))], time_source)
    return report


def default_tolerance(info: eps.EpInfo, given: Tolerance | None) -> Tolerance:
    """The bounds for this EP's precision when none were chosen (or the generic defaults were passed as they are:
    the CLI's --rtol/--atol defaults): an fp16 EP (QNN HTP) differs from the CPU EP by ~1e-3 on correct outputs."""
    if given is not None and given != Tolerance():
        return given
    rtol, atol = eps.PRECISION_TOLERANCE.get(info.precision, (Tolerance().rtol, Tolerance().atol))
    return Tolerance(rtol, atol)


def _resolve_ep(ep: str | eps.ResolvedEp | None, integrity: ManifestStatus) -> eps.ResolvedEp:
    """By default, verify on the EP (and options) the model was compiled for."""
    if isinstance(ep, eps.ResolvedEp):
        return ep
    recorded = integrity.manifest.options if integrity.manifest else {}
    return eps.resolve(ep or recorded.get("ep") or "auto", None if ep else recorded.get("ep_options"))


def choose_dims(source: SourceModel, compiled_inputs: list[dict[str, Any]], recorded: dict[str, Any], requested: dict[str, int]) -> dict[str, int]:
    """A value for every symbolic dim of the source: --fix-dim, else what the compile pinned, else 1.

    A --fix-dim that contradicts a dimension the compiled model has fixed is a usage error: the two
    models could not be fed the same inputs.
    """
    unknown = sorted(set(requested) - source.symbolic_dims)
    if unknown:
        raise UsageError(f"--fix-dim {unknown[0]}: the source has no symbolic dimension {unknown[0]!r}")
    fixed_in_compiled = _fixed_by_compiled(source, compiled_inputs)
    try:
        pinned = dimension_overrides(source, recorded.get("fix_dims", {}), {k: tuple(v) for k, v in recorded.get("fix_shapes", {}).items()})
    except UsageError:
        pinned = {}
    dims = {}
    for name in sorted(source.symbolic_dims):
        compiled_value = fixed_in_compiled.get(name)
        if name in requested and compiled_value is not None and requested[name] != compiled_value:
            raise UsageError(f"--fix-dim {name}={requested[name]} conflicts with the compiled model, which has {name}={compiled_value} fixed")
        dims[name] = requested.get(name, pinned.get(name, compiled_value or 1))
    return dims


def _fixed_by_compiled(source: SourceModel, compiled_inputs: list[dict[str, Any]]) -> dict[str, int]:
    by_name = {i["name"]: i["shape"] for i in compiled_inputs}
    fixed = {}
    for model_input in source.inputs:
        for declared, actual in zip(model_input.dims, by_name.get(model_input.name, [])):
            if isinstance(declared, str) and isinstance(actual, int):
                fixed[declared] = actual
    return fixed


def _compare_sessions(report: VerifyReport, ep: eps.ResolvedEp, seeds: list[int], time_source: bool) -> None:
    """One session at a time, each freed before the next: a large model is never held twice."""
    dims = report.dims
    timed = open_session(report.compiled, ep, dims)
    report.session_seconds["compiled"] = round(timed.seconds, 3)
    compiled_outputs = _run_all(timed.session, seeds, dims)
    del timed
    gc.collect()

    if time_source and ep.name != eps.CPU_EP:
        source_timed = open_session(report.reference, ep, dims)
        report.session_seconds["source_on_ep"] = round(source_timed.seconds, 3)
        del source_timed
        gc.collect()

    reference_timed = open_session(report.reference, None, dims)
    report.session_seconds["source_on_cpu"] = round(reference_timed.seconds, 3)
    if ep.name == eps.CPU_EP:
        report.session_seconds["source_on_ep"] = report.session_seconds["source_on_cpu"]
    expected_outputs = _run_all(reference_timed.session, seeds, dims)
    del reference_timed
    gc.collect()

    for seed_value, got, want in zip(seeds, compiled_outputs, expected_outputs):
        if set(got) != set(want):  # a compiled model that computes fewer (or other) things is not the same model
            report.error = f"the compiled model has outputs {sorted(got)} but the source has {sorted(want)}"
            return
        report.runs.append({"seed": seed_value, "outputs": [compare_outputs(n, got[n], want[n], report.tolerance) for n in want]})


def _run_all(session: Any, seeds: list[int], dims: dict[str, int]) -> list[dict[str, np.ndarray]]:
    names = [o.name for o in session.get_outputs()]
    results = []
    for seed in seeds:
        feeds, _ = make_inputs(session, seed, dims)
        results.append(dict(zip(names, session.run(names, feeds))))
    return results


def compare_outputs(name: str, got: np.ndarray, want: np.ndarray | None, tolerance: Tolerance) -> OutputComparison:
    got = np.asarray(got)
    if want is None or np.asarray(want).shape != got.shape or np.asarray(want).dtype != got.dtype:
        expected = "missing" if want is None else f"{np.asarray(want).dtype}{list(np.asarray(want).shape)}"
        reason = f"the compiled model gives {got.dtype}{list(got.shape)}, the source {expected}"
        return OutputComparison(name, list(got.shape), str(got.dtype), None, None, int(got.size) or 1, int(got.size), reason)
    want = np.asarray(want)
    if got.dtype.kind not in "fc":
        mismatched = int(np.count_nonzero(got != want))
        diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0)) if got.dtype.kind in "iub" else float(mismatched)
        return OutputComparison(name, list(got.shape), str(got.dtype), diff, diff, mismatched, int(got.size))
    g, w = got.astype(np.float64), want.astype(np.float64)
    close = np.isclose(g, w, rtol=tolerance.rtol, atol=tolerance.atol, equal_nan=True)
    both_finite = np.isfinite(g) & np.isfinite(w)
    abs_diff = np.where(both_finite, np.abs(g - w), 0.0)  # inf/nan placement differences count as mismatches
    rel_diff = abs_diff / np.maximum(np.abs(w), max(tolerance.atol, 1e-30))  # near zero, relative error means nothing
    return OutputComparison(
        name,
        list(got.shape),
        str(got.dtype),
        float(abs_diff.max(initial=0.0)),
        float(rel_diff.max(initial=0.0)),
        int(close.size - np.count_nonzero(close)),
        int(got.size),
    )
