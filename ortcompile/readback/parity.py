"""Run a compiled model on its EP and the source on the CPU EP with the same inputs, and judge the outputs.

Shared by the pre-publish check (compile) and `verify`: it runs in the worker child, where an EP crash
(a corrupted QNN blob loads, then segfaults on its first run) cannot take ortcompile down. One session at a
time, each freed before the next, so a large model is never held twice; the outputs are compared in the
child, so they are never copied back either. Only a small source's CPU reference runs beside the compiled
model's runs (reference.py; the pre-publish check asks for it). `compile --check load --verify` opens the compiled model
once: its load check (`open_for_run`) opens verify's session and leaves it open in the child for verify's run.
"""

from __future__ import annotations

import gc
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile.eps.catalog import CPU_EP, CPU_PINNING_EPS
from ortcompile.eps.request import EpRequest
from ortcompile.errors import InvalidModel, OrtCompileError, UsageError, VerificationFailed, ort_reason
from ortcompile.jsonedge import JsonObject
from ortcompile.options import ALL_REFUSAL_OFFERS
from ortcompile.ortmarkers import likely_cause
from ortcompile.progress import Reporter
from ortcompile.readback.compare import OutputComparison
from ortcompile.readback.criteria import Criterion
from ortcompile.readback.feeds import Arrays, specs_from_session
from ortcompile.readback.given import Given
from ortcompile.readback.hints import freeze_suggestion
from ortcompile.readback.nextsteps import next_steps
from ortcompile.readback.placement import assigned_nodes, counts_by_ep, nodes_by_ep
from ortcompile.readback.reference import SourceReference
from ortcompile.readback.setfeeds import set_feeds
from ortcompile.readback.shapes import compare_shaped, data_dependent_outputs
from ortcompile.run.sessions import EXACT_INT8_CONFIG, LEAN_CONFIG, RECORD_ASSIGNMENT, open_session, run_session, session_options


@dataclass(frozen=True)
class ParityRequest:
    model: Path  # the compiled model
    source: Path  # the model it was compiled from: its outputs on the CPU EP are the reference
    ep: EpRequest
    mode: str  # "load" or "run"
    criterion: Criterion | None = None  # how outputs are judged (None with mode "load")
    dims: dict[str, int] = field(default_factory=dict)  # symbolic dim -> value (named ones are ORT free-dim overrides)
    seeds: tuple[int, ...] = (0,)  # the seeded input sets; edge sets (inputsets.py) follow them unless `edges` is off
    given: dict[str, Given] = field(default_factory=dict)  # the user's inputs; the rest is generated
    time_source_on_ep: bool = False  # also load the source on the EP, to compare load times
    lean: bool = False  # the pre-publish check: no weight prepacking (a session then maps the weights, copies none)
    edges: bool = True  # also judge on the edge sets the inputs suggest (silence, tones, images, padded ids)
    publish_anyway: bool = True  # a refusal of the check may suggest --check load (not under --verify)
    concurrent_reference: bool = False  # the source's CPU run beside the compiled model's (a small source: reference.py)
    offers: tuple[str, ...] = ALL_REFUSAL_OFFERS  # the options a refusal may suggest (nextsteps.py)

    @property
    def config(self) -> dict[str, str]:
        """Entries of both compared sessions, the compiled model's and the source's (like is compared with like)."""
        return {**EXACT_INT8_CONFIG, **({LEAN_CONFIG: "1"} if self.lean else {})}


@dataclass(frozen=True)
class ParityRun:
    """One input set run through both models: each output judged."""

    seed: int
    input_set: str  # "seed 0", "silence", "sample a.npz"
    outputs: tuple[OutputComparison, ...]

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def to_json(self) -> JsonObject:
        return {"seed": self.seed, "set": self.input_set, "outputs": [o.to_json() for o in self.outputs]}


@dataclass
class ParityReport:
    mode: str
    ok: bool = True
    error: str = ""  # one line: what failed, with the EP's root cause
    exit_code: int = VerificationFailed.exit_code  # of the failure: 5 outputs differ; 1 a session could not be created or run
    hint: str = ""  # the likely cause and what to try
    seconds: dict[str, float] = field(default_factory=dict)  # compiled (load), run, source_on_ep, source_on_cpu, source_run
    run_seconds: list[float] = field(default_factory=list)  # each input set's run of the compiled model, in `sets` order
    cpu_seconds: float = 0.0  # user + system CPU of the whole comparison in its process (every thread: EP, simulator, reference)
    placement: dict[str, dict[str, int]] = field(default_factory=dict)  # EP -> op type -> nodes
    placement_nodes: dict[str, list[dict[str, str]]] = field(default_factory=dict)  # EP -> [{name, op_type, domain}]
    criterion: Criterion | None = None  # the one the outputs were judged by (None: nothing was compared)
    runs: list[ParityRun] = field(default_factory=list)
    dims: dict[str, int] = field(default_factory=dict)  # every symbolic dim's value in the runs
    guessed: dict[str, int] = field(default_factory=dict)  # of those, the ones nobody gave
    notes: list[str] = field(default_factory=list)  # how inputs were chosen
    sets: list[str] = field(default_factory=list)  # the input sets judged, in order ("seed 0", "silence", "sample a.npz")
    warning: str = ""  # compared less than asked: random ops nobody can remove (see randomops.py)
    failed_set: str = ""  # the input set of the first failing output
    failed_output: str = ""
    seeds_of_sets: list[int] = field(default_factory=list)
    concurrent_reference: bool = False  # the source's CPU run went beside the compiled model's
    compiled_sessions: int = 0  # sessions this call opened on the compiled model (0: it ran on one open_for_run left open)
    compiled_failed: bool = False  # the compiled model failed to load or run on its EP (not: outputs differ, the source failed)

    def failure(self) -> str:
        return f"{self.error}; {self.hint}" if self.hint else self.error

    @property
    def outputs(self) -> list[OutputComparison]:
        return [o for run in self.runs for o in run.outputs]

    @property
    def outputs_differ(self) -> bool:
        """The comparison ran and outputs were outside the criterion (not: would not load, crashed)."""
        return bool(self.runs) and any(not o.ok for o in self.outputs)

    @property
    def failed_run(self) -> ParityRun | None:
        """The first input set with an output outside the criterion."""
        return next((run for run in self.runs if not run.ok), None)


def run_parity(request: ParityRequest, reporter: Reporter) -> ParityReport:
    """In the worker child: load (and run) the compiled model on its EP; compare with the source on the CPU EP.
    A session `open_for_run` left open in this child for the same request is used instead of opening it again."""
    report = ParityReport(request.mode)

    def compare(ep: Any) -> None:
        reference = SourceReference(request.source, request.dims, request.config, request.concurrent_reference)
        report.concurrent_reference = request.concurrent_reference and request.mode == "run"
        outputs, feeds = _run_compiled(request, ep, report, reporter, reference)
        if request.mode == "run":
            if request.time_source_on_ep and ep.name != CPU_EP:
                report.seconds["source_on_ep"] = _load_seconds(request.source, ep, request.dims)
            _compare_with_source(request, feeds, outputs, report, reference)
            if not report.ok and report.failed_output and request.criterion is not None:
                report.hint = next_steps(request.criterion.purpose if request.publish_anyway else "verify", can_pin=ep.name in CPU_PINNING_EPS,
                                         offers=request.offers)

    return _measured(request, report, compare)


def open_for_run(request: ParityRequest, reporter: Reporter) -> ParityReport:
    """In the worker child, the load check of `compile --check load --verify`: open the compiled model as the run of
    `request` (verify's) opens it and keep it open in this child for that `run_parity` call, so the model is opened
    once. The report is a load check's: the load is proven when it comes back ok."""
    report = ParityReport("load")

    def hold(ep: Any) -> None:
        report.compiled_failed = True  # until it is open and on its EP
        timed = _open_compiled(request, ep, report)
        _take_stock(request, ep, timed, report)
        report.compiled_failed = False
        _held[request.model] = (_session_key(request), timed)

    return _measured(request, report, hold)


# In the worker child: the compiled model `open_for_run` opened, for the `run_parity` of the same request that follows
_held: dict[Path, tuple[tuple[Any, ...], Any]] = {}


def _session_key(request: ParityRequest) -> tuple[Any, ...]:
    """What the compiled model's session depends on: the same key, the same session."""
    return request.ep, sorted(request.dims.items()), sorted(request.config.items()), request.mode


def _measured(request: ParityRequest, report: ParityReport, work: Callable[[Any], None]) -> ParityReport:
    """`work(ep)` with its CPU time in the report; an error of the EP or of a session is the report's failure."""
    ep = request.ep.resolve()
    cpu = _cpu_seconds()
    try:
        work(ep)
    except (InvalidModel, UsageError):
        raise  # the source itself does not load, or the inputs/dims/EP asked for cannot work: not a failed comparison
    except OrtCompileError as exc:
        report.ok, report.error, report.exit_code = False, exc.message, exc.exit_code
        report.hint = likely_cause(exc.detail or exc.message) or _switch_hint(request.source)
    report.cpu_seconds = _cpu_seconds() - cpu
    return report


def _cpu_seconds() -> float:
    """This process's user + system CPU so far (all threads): on a shared machine the wall time says little."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _switch_hint(source: Path) -> str:
    """A model that switches networks on an input often loads once specialized on it: say how."""
    import onnx

    try:
        return freeze_suggestion(onnx.load_model(str(source), load_external_data=False)).removeprefix("; ")
    except Exception:
        return ""  # only a hint: never let it hide the real error


def _run_compiled(request: ParityRequest, ep: Any, report: ParityReport, reporter: Reporter,
                  reference: SourceReference) -> tuple[list[Arrays], list[Arrays]]:
    """The compiled model's outputs and the inputs they came from (the reference gets the very same arrays)."""
    report.compiled_failed = True  # while the compiled model loads on its EP, and below while it runs
    key, timed = _held.pop(request.model, (None, None))
    if key != _session_key(request):
        timed = None  # (one held for another request is let go before this one opens)
        timed = _open_compiled(request, ep, report)
    _take_stock(request, ep, timed, report)
    report.compiled_failed = False
    if request.mode != "run":
        return [], []
    feeds = _feeds(request, timed.session, report)
    reporter.stage(f"running {request.model.name} on {ep.name}")
    clock = time.perf_counter()
    with reference.beside(feeds):
        report.compiled_failed = True
        outputs = [_timed_run(timed.session, f, _label(request), ep, report) for f in feeds]
        report.compiled_failed = False  # (the source's reference may still fail as the block ends: its own failure)
        report.seconds["run"] = time.perf_counter() - clock
    del timed
    gc.collect()
    return outputs, feeds


def _label(request: ParityRequest) -> str:
    return f"the compiled {request.model.name}"


def _open_compiled(request: ParityRequest, ep: Any, report: ParityReport) -> Any:
    """The compiled model's session on its EP (a load-only check's at the basic optimization level)."""
    config = {RECORD_ASSIGNMENT: "1", **request.config}
    options = _load_only_options(ep, request.dims, config) if request.mode == "load" else None
    report.compiled_sessions += 1
    try:
        return open_session(request.model, ep, request.dims, config=config, options=options, label=_label(request))
    except OrtCompileError:
        _refuse_invalid_source(request)
        raise


def _take_stock(request: ParityRequest, ep: Any, timed: Any, report: ParityReport) -> None:
    """The session's load time and placement in the report; every EPContext node must be on the EP."""
    report.seconds["compiled"] = timed.seconds
    assigned = assigned_nodes(timed.session)
    report.placement, report.placement_nodes = counts_by_ep(assigned), nodes_by_ep(assigned)
    off_ep = report.placement.get(CPU_EP, {}).get("EPContext", 0)
    if off_ep:
        raise OrtCompileError(f"{off_ep} EPContext node{'s' if off_ep > 1 else ''} of {request.model.name} not taken by {ep.name}")


def _load_only_options(ep: Any, dims: dict[str, int], config: dict[str, str]) -> Any:
    """A load-only check proves the output loads on its EP, at ORT's basic optimization level: the EPs are offered
    the same nodes (partitioning follows the basic level), while the extended levels rewrite the CPU EP's nodes
    after it and, on fp16 weights, fold the Casts the CPU EP needs into an fp32 copy of every weight (measured: a
    16 GB fp16 pass-through's check grew past 19.8 GiB; a 64 MiB one's took 128 MiB more than the model)."""
    import onnxruntime as ort

    return session_options(ep, dims, config, graph_optimization_level=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)


def _timed_run(session: Any, feeds: Arrays, label: str, ep: Any, report: ParityReport) -> Arrays:
    """One input set's run on the EP, its seconds kept (the check's cost is this times the sets)."""
    clock = time.perf_counter()
    outputs = run_session(session, feeds, label, ep)
    report.run_seconds.append(time.perf_counter() - clock)
    return outputs


def _feeds(request: ParityRequest, session: Any, report: ParityReport) -> list[Arrays]:
    chosen = set_feeds(request.source, specs_from_session(session), request.seeds, request.dims, request.given, request.edges)
    report.dims, report.guessed, report.notes = chosen.dims, chosen.guessed, chosen.notes
    report.sets, report.warning = [s.name for s in chosen.sets], chosen.unverifiable
    report.seeds_of_sets = [s.seed for s in chosen.sets]
    return chosen.arrays


def _load_seconds(model: Path, ep: Any, dims: dict[str, int]) -> float:
    timed = open_session(model, ep, dims, label=f"the source {model.name} on {ep.name}")
    seconds = timed.seconds
    del timed
    gc.collect()
    return seconds


def _compare_with_source(request: ParityRequest, feeds: list[Arrays], outputs: list[Arrays], report: ParityReport,
                         reference: SourceReference) -> None:
    assert request.criterion is not None
    expected, report.seconds["source_on_cpu"], report.seconds["source_run"] = reference.outputs(feeds)
    report.criterion = request.criterion
    if report.warning:  # random draws nobody can remove: the runs prove it runs; outputs cannot be compared
        return
    dynamic = data_dependent_outputs(request.source)
    for name_of_set, seed, got, want in zip(report.sets, report.seeds_of_sets, outputs, expected):
        if set(got) != set(want):  # a compiled model that computes fewer (or other) things is not the same model
            report.ok = False
            report.error = f"the compiled model has outputs {sorted(got)} but the source has {sorted(want)}"
            return
        comparisons = [compare_shaped(name, got[name], want[name], request.criterion, name in dynamic) for name in want]
        report.runs.append(ParityRun(seed, name_of_set, tuple(comparisons)))
        bad = next((c for c in comparisons if not c.ok), None)
        if bad is not None and report.ok:
            report.ok = False
            report.failed_set, report.failed_output = name_of_set, bad.name
            report.error = f"output {bad.name!r} differs from the source on the CPU EP {set_label(name_of_set)}: {bad.reason}"


def set_label(name: str) -> str:
    """How a message names an input set: "(seed 0)", "(input set 'silence')"."""
    return f"({name})" if name.startswith("seed ") else f"(input set {name!r})"


def reference_outputs(source: Path, feeds: list[Arrays], dims: dict[str, int], config: dict[str, str]) -> tuple[list[Arrays], float]:
    """The source's outputs on the CPU EP for each feed, and the reference session's load time (then freed)."""
    expected, seconds, _ = SourceReference(source, dims, config, concurrent=False).outputs(feeds)
    return expected, seconds


def _refuse_invalid_source(request: ParityRequest) -> None:
    """A compiled model that does not load, from a source ORT cannot load either: invalid input (exit 3)."""
    options = session_options(None, request.dims)
    options.graph_optimization_level = _disable_all()
    try:
        open_session(request.source, None, options=options, label=str(request.source))
    except OrtCompileError as exc:
        raise InvalidModel(f"{request.source}: ONNX Runtime cannot load this model: {ort_reason(exc.detail or exc.message)}", detail=exc.detail) from None


def _disable_all() -> Any:
    import onnxruntime as ort

    return ort.GraphOptimizationLevel.ORT_DISABLE_ALL
