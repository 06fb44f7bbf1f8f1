"""The pre-publish check: the staged output must load on its EP, run, and loosely agree with the source.

Exit 0 must mean a model that loads and runs. Measured on real models (PyPI wheels), outputs that the raw
Compile API and ortcompile 0.1 published often did neither: QNN had taken only shape-computation
partitions ("count of graph inputs should be at least the count of tensor_wrapper" at load), or the
compiled model ran but computed something else (correlation ~0, another output length). So before
publishing, the worker child (where an EP crash cannot take ortcompile down) opens the staged model with
the target EP — no CPU fallback anywhere — runs it once on generated inputs, and compares with the source
on the CPU EP under the loose `check` criterion for the EP's precision (`verify` stays the strict gate).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile.compile.epstep import EpRequest
from ortcompile.errors import InvalidModel, OrtCompileError, ort_reason
from ortcompile.options import CheckMode
from ortcompile.progress import Reporter

# Load errors whose cause we know, and what to do about it.
_LIKELY_CAUSES = (
    (("count of graph inputs should be at least the count of tensor_wrapper", "zero graph inputs is not supported"),
     "the EP took only shape-computation partitions: pin the dynamic dims with --fix-dim/--fix-shape (and keep the prepare step)"),
    (("single static assignment",),
     "ONNX Runtime's Compile API wrote subgraphs it cannot load again (If/Loop bodies left on the CPU EP); try --no-prepare or --ep cpu"),
)


@dataclass(frozen=True)
class CheckRequest:
    model: Path  # the staged compiled model
    source: Path  # the model it was compiled from: its outputs on the CPU EP are the reference
    ep: EpRequest
    mode: CheckMode
    precision: str  # the EP's compute precision: decides the criterion
    dims: dict[str, int] = field(default_factory=dict)  # pinned symbolic dims (the source's free-dimension overrides)
    seed: int = 0


@dataclass
class CheckReport:
    mode: CheckMode
    ok: bool = True
    error: str = ""  # one line: what failed, with the EP's root cause
    hint: str = ""  # the likely cause and what to try
    seconds: dict[str, float] = field(default_factory=dict)
    placement: dict[str, dict[str, int]] = field(default_factory=dict)  # EP -> op type -> nodes
    criterion: dict[str, Any] = field(default_factory=dict)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how inputs were chosen

    def failure(self) -> str:
        return f"{self.error}; {self.hint}" if self.hint else self.error

    def record(self) -> dict[str, Any]:
        """For the manifest: what was proven (deterministic: no times, no numbers that vary by machine)."""
        record: dict[str, Any] = {"mode": self.mode, "passed": self.ok}
        if self.mode == "run":
            record["criterion"] = f"{self.criterion.get('kind')} ({self.criterion.get('precision')} check)"
            record["inputs"] = "generated (seeded)"
        return record

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "ok": self.ok, "error": self.error, "hint": self.hint, "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
                "placement": self.placement, "criterion": self.criterion, "outputs": self.outputs, "notes": self.notes}


def run_check(request: CheckRequest, reporter: Reporter) -> CheckReport:
    """In the worker child: load (and run) the staged model on its EP; compare with the source on the CPU EP."""
    report = CheckReport(request.mode)
    reporter.stage(f"checking {request.model.name}: {'load and run' if request.mode == 'run' else 'load'} on {request.ep.name}")
    ep = request.ep.resolve()
    try:
        outputs, feeds = _run_compiled(request, ep, report)
        if request.mode == "run":
            _compare_with_source(request, outputs, feeds, report)
    except InvalidModel:
        raise  # the source itself does not load: invalid input, not a failed check
    except OrtCompileError as exc:
        report.ok, report.error = False, exc.message
        report.hint = likely_cause(exc.detail or exc.message)
    return report


def _run_compiled(request: CheckRequest, ep: Any, report: CheckReport) -> tuple[dict[str, Any], dict[str, Any]]:
    from ortcompile.run.sessions import RECORD_ASSIGNMENT, open_session, placement, run_session

    try:
        timed = open_session(request.model, ep, request.dims, config={RECORD_ASSIGNMENT: "1"}, label=f"the compiled {request.model.name}")
    except OrtCompileError:
        _refuse_invalid_source(request)
        raise
    report.seconds["load"] = timed.seconds
    report.placement = placement(timed.session)
    off_ep = report.placement.get("CPUExecutionProvider", {}).get("EPContext", 0)
    if off_ep:
        raise OrtCompileError(f"{off_ep} EPContext node(s) of {request.model.name} were not taken by {ep.name}")
    if request.mode != "run":
        return {}, {}
    feeds = _feeds(request, timed.session, report)
    clock = time.perf_counter()
    outputs = run_session(timed.session, feeds, f"the compiled {request.model.name}", ep)
    report.seconds["run"] = time.perf_counter() - clock
    del timed
    gc.collect()
    return outputs, feeds


def _refuse_invalid_source(request: CheckRequest) -> None:
    """Nothing was compiled from a model ORT cannot load at all: that is invalid input (exit 3), not an EP failure."""
    from ortcompile.run.sessions import open_session

    try:
        open_session(request.source, None, request.dims, options=_no_optimization(), label=str(request.source))
    except OrtCompileError as exc:
        raise InvalidModel(f"{request.source}: ONNX Runtime cannot load this model: {ort_reason(exc.detail or exc.message)}", detail=exc.detail) from None


def _no_optimization() -> Any:
    import onnxruntime as ort

    from ortcompile.run.sessions import session_options

    options = session_options(None)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


def _feeds(request: CheckRequest, session: Any, report: CheckReport) -> dict[str, Any]:
    from ortcompile.readback.feeds import make_feeds, specs_from_session
    from ortcompile.readback.hints import read_hints

    feeds = make_feeds(specs_from_session(session), seed=request.seed, dims=request.dims, hints=read_hints(request.source))
    report.notes = list(feeds.notes)
    if feeds.guessed:
        report.notes.append("guessed dims: " + ", ".join(f"{k}={v}" for k, v in sorted(feeds.guessed.items())))
    return feeds.arrays


def _compare_with_source(request: CheckRequest, outputs: dict[str, Any], feeds: dict[str, Any], report: CheckReport) -> None:
    from ortcompile.readback.compare import compare_output
    from ortcompile.readback.criteria import criterion_for
    from ortcompile.run.sessions import open_session, run_session

    reference = open_session(request.source, None, request.dims, label=f"the source {request.source.name} on the CPU EP")
    clock = time.perf_counter()
    expected = run_session(reference.session, feeds, f"the source {request.source.name}")
    report.seconds["reference"] = reference.seconds + time.perf_counter() - clock
    del reference
    gc.collect()
    criterion = criterion_for(request.precision, "check")
    report.criterion = criterion.to_json()
    if set(outputs) != set(expected):
        report.ok = False
        report.error = f"the compiled model has outputs {sorted(outputs)} but the source has {sorted(expected)}"
        return
    comparisons = [compare_output(name, outputs[name], expected[name], criterion) for name in expected]
    report.outputs = [c.to_json() for c in comparisons]
    bad = [c for c in comparisons if not c.ok]
    if bad:
        report.ok = False
        report.error = f"its output {bad[0].name!r} disagrees with the source on the CPU EP: {bad[0].reason}"
        report.hint = ("the EP computes something else for this model: try another --target, or --no-prepare; "
                       "--check load publishes without comparing")


def likely_cause(text: str) -> str:
    for needles, cause in _LIKELY_CAUSES:
        if any(n in text for n in needles):
            return cause
    return ""


def describe_ok(report: CheckReport) -> str:
    """One line for -v after a passing check."""
    if report.mode == "load":
        return f"check: loads on its EP ({report.seconds.get('load', 0):.2f}s)"
    worst = min((o["snr_db"] for o in report.outputs if o.get("snr_db") is not None), default=None)
    quality = f", worst SNR {worst:.1f} dB" if worst is not None else ""
    seconds = sum(report.seconds.values())
    count = f"{len(report.outputs)} output{'s' if len(report.outputs) != 1 else ''}"
    return f"check: loads, runs and agrees with the source on the CPU EP ({count}{quality}; {seconds:.2f}s)"
