"""finish: check -> manifest -> verify -> publish, shared by every way an output is made.

A single compile, a weight-sharing batch (published together) and a stitched partitioned model all end here, so
nothing reaches an output directory by another road. finish works from data: each `Built` carries its
`FinishPlan` (where it goes, what the check and --verify do, what the manifest records), made by its driver
from the frozen plan; finish never calls back into a job. It returns what it did (`Finished`); the driver makes
the result from that.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import signal
import time
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ortcompile.compile.graphpass import GraphSummary, StagedNames, write_graph
from ortcompile.durable import write_new
from ortcompile.errors import CompilationFailed, OrtCompileWarning, VerificationFailed, output_error
from ortcompile.jsonedge import JsonObject
from ortcompile.naming import OutputTarget
from ortcompile.options import GivenInputs
from ortcompile.output.digest import InputDigest, WrittenFile
from ortcompile.output.manifest import CheckRecord, InitializerCounts, Manifest, NodeCounts, Versions, file_entries
from ortcompile.output.publish import Staging, check_destination, directory_lock, prepare_output_dir, remove_created_dirs, remove_stale_stages
from ortcompile.plan.planner import CheckPlan, VerifyPlan
from ortcompile.progress import Reporter
from ortcompile.version import __version__
from ortcompile.worker import Worker, WorkerCrashed, Workers

if TYPE_CHECKING:
    from ortcompile import eps
    from ortcompile.compile.epstep import EpStepOutput
    from ortcompile.readback.parity import ParityReport
    from ortcompile.readback.verify import PlannedVerify, VerifyReport


@dataclass(frozen=True)
class ManifestPlan:
    """What the manifest records besides the files, the digest and the check: decided by the driver."""

    versions: Versions
    options: JsonObject
    source_ops: dict[str, int]  # the source's op counts: compiled ops = these minus the remaining ones
    target: JsonObject | None
    parts: tuple[JsonObject, ...] | None = None  # a stitched model's parts
    cpu_nodes: JsonObject | None = None  # --cpu-nodes / --fallback (fallback.py); the check's worst SNR added here


@dataclass(frozen=True)
class FinishPlan:
    """Everything finish needs to know of one output, as data."""

    target: OutputTarget  # where it is published (the plan's record of -o)
    inputs: list[Path]  # files the output must never overwrite
    force: bool
    check: CheckPlan
    verify: VerifyPlan | None
    manifest: ManifestPlan
    reporter: Reporter


@dataclass
class Built:
    """What the passes left in the staging directory for one model, and how it is to be finished."""

    plan: FinishPlan
    files: list[tuple[WrittenFile, str]]  # (file, role), the model first
    graph: GraphSummary
    step: EpStepOutput


@dataclass
class CheckOutcome:
    record: CheckRecord  # for the manifest (deterministic)
    report: JsonObject | None  # for the result (--json): everything measured
    seconds: float = 0.0
    peak_rss_bytes: int = 0


@dataclass
class Finished:
    """What finish did for one model: its published manifest, the check's outcome, how long verify and publish took."""

    manifest: Manifest
    check: CheckOutcome
    timings: dict[str, float] = field(default_factory=dict)


def open_destination(target: OutputTarget, force: bool, inputs: list[Path], reporter: Reporter) -> list[Path]:
    """Create the output directory (returning what was created, removed again on failure), refuse to replace an
    output without --force or to overwrite an input, and clean up stages left by killed runs."""
    created = prepare_output_dir(target.directory)
    try:
        check_destination(target, force, inputs)
    except BaseException:
        remove_created_dirs(created)
        raise
    with directory_lock(target.directory):  # never beside another process's publish (it recovers under the lock too)
        for stale in remove_stale_stages(target.directory):
            reporter.detail(f"cleaned up staging directory {stale.name} left by a killed run")
    return created


def finish(builds: list[Built], staging: Staging, workers: Workers, digests: list[Future[InputDigest]],
           shared: set[str] | None = None, unchecked: str | None = None, checked: list[CheckOutcome] | None = None) -> list[Finished]:
    """check -> manifest -> verify -> publish, for one model or a whole batch (published together).

    `unchecked`: why this machine cannot check these outputs (a shared EP context the simulator cannot load);
    `checked`: their checks, made on something it can load instead (twins.py), one per build."""
    first = builds[0].plan
    if unchecked and first.check.mode != "none" and checked is None:
        warnings.warn(f"{', '.join(b.plan.target.names.model for b in builds)}: not checked before publishing: {unchecked}", OrtCompileWarning, stacklevel=2)
    done, opened = [], []
    for index, (built, digest) in enumerate(zip(builds, digests)):
        plan, staged = built.plan, staging.path / built.plan.target.names.model
        # the input's hash is done before the check starts: its mmap windows and the check's session never coexist
        source_digest = digest.result()
        held = None  # --check load --verify: verify's comparison, whose session the load check opened and left open
        if checked is not None:
            outcome = checked[index]
        elif unchecked:
            outcome = CheckOutcome(CheckRecord("none", None, reason=unchecked), None)
        else:
            outcome, held = check_staged(built, staged, source_digest, shared, workers, alone=len(builds) == 1)
        manifest = manifest_for(built, source_digest, outcome, shared)  # the check record: what the check proved
        write_staged(staging.path / plan.target.names.manifest, manifest.to_bytes())
        done.append(Finished(manifest, outcome))
        opened.append(held)
    for built, finished, held in zip(builds, done, opened):  # every model of the batch, before anything is published
        if built.plan.verify is None:
            continue
        verified = checked is None and _verified_by_the_check(finished.check, built.plan)  # a twin's check is not these files
        if verified:
            finished.timings["verify"] = 0.0
        elif held is not None:
            finished.timings["verify"] = run_held_verify(held, built.plan.verify, workers, built.plan.reporter)
        else:
            finished.timings["verify"] = run_verify(staging.path / built.plan.target.names.model, built.plan.verify, built.plan.reporter)
    clock = time.perf_counter()
    first.reporter.stage("publishing")
    staging.publish(_publish_order(builds), [b.plan.target for b in builds], first.force, [p for b in builds for p in b.plan.inputs])
    for built, finished in zip(builds, done):
        finished.timings["publish"] = time.perf_counter() - clock
        built.plan.reporter.stage(f"wrote {built.plan.target.model_path}")
    return done


def manifest_for(built: Built, digest: InputDigest, check: CheckOutcome | None, shared: set[str] | None) -> Manifest:
    """The output's manifest; `check` None: without the check's record (what verify reads of it before the check)."""
    record = built.plan.manifest
    prepare = built.step.prepare.to_record() if built.step.prepare is not None else None
    report = check.report if check else None
    cpu_nodes = {**record.cpu_nodes, "worst_snr_db_after": worst_snr(report)} if record.cpu_nodes else None
    return Manifest(model=built.plan.target.names.model, files=file_entries(built.files, shared), input_sha256=digest.combined,
                    input_files=digest.input_files, versions=record.versions, options=record.options,
                    nodes=node_counts(record.source_ops, built.graph),
                    initializers=InitializerCounts(built.step.external_count, built.step.inline_count),
                    prepare=prepare, check=check.record if check else None, target=record.target, parts=record.parts, cpu_nodes=cpu_nodes)


def worst_snr(report: JsonObject | None) -> float | None:
    """The check's lowest output SNR (a --fallback record's figure after the nodes moved)."""
    return worst_snr_of((report or {}).get("outputs", []))


def worst_snr_of(outputs: Iterable[JsonObject]) -> float | None:
    """The lowest SNR among compared outputs, to 0.1 dB (None when none has one)."""
    snrs = [o["snr_db"] for o in outputs if o.get("snr_db") is not None]
    return round(min(snrs), 1) if snrs else None


def _verified_by_the_check(check: CheckOutcome, plan: FinishPlan) -> bool:
    """The check just ran the staged files against the source by --verify's criterion: that was the one parity pass
    (a mismatch failed there, exit 5); a second session pair and re-hash would prove nothing more."""
    report = check.report
    if report is None or report.get("mode") != "run" or not report.get("ok") or plan.check.verify_criterion is None:
        return False
    worst = max((o.get("max_abs") or 0.0 for o in report.get("outputs", [])), default=0.0)
    kind = (report.get("criterion") or {}).get("kind")
    plan.reporter.detail(f"verified: outputs match the source on the CPU EP (max abs diff {worst:.3g}; {kind}), "
                         "in the pre-publish check (one comparison)")
    return True


def given_inputs(freeze: dict[str, int | float], inputs: GivenInputs) -> GivenInputs:
    """What the check and --verify feed: the user's inputs, and every frozen input at its frozen value (the
    compiled model ignores it; the source must get the same value to compute the same thing)."""
    from ortcompile.readback.given import Given

    return {**{name: Given(value, f"--freeze {name}={value}") for name, value in freeze.items()}, **inputs}


def run_verify(model: Path, plan: VerifyPlan, reporter: Reporter) -> float:
    """Run `verify` on the staged output: a model that computes the wrong thing is never published. Returns its seconds."""
    from ortcompile.readback.verify import verify_model

    reporter.stage("verifying against the source")
    clock = time.perf_counter()
    report = verify_model(model, plan.source, dims=plan.dims, inputs=given_inputs(plan.freeze, plan.inputs), time_source=False,
                          **plan.criterion)
    _publish_only_verified(report, plan.offers, reporter)
    return time.perf_counter() - clock


def verify_session(built: Built, staged: Path, digest: InputDigest, shared: set[str] | None) -> PlannedVerify | None:
    """--check load --verify: verify's comparison planned before the load check, so that the check opens the session
    verify runs (the compiled model opened once); None when the check loads only, or opens another session."""
    from ortcompile.readback.verify import plan_staged_verify

    plan = built.plan
    if plan.check.mode != "load" or plan.verify is None:
        return None
    manifest = manifest_for(built, digest, None, shared)  # what verify reads of it: the EP, its options, the pins
    return plan_staged_verify(staged, plan.verify.source, manifest, plan.check.request, plan.verify.dims,
                              given_inputs(plan.verify.freeze, plan.verify.inputs), **plan.verify.criterion)


def run_held_verify(planned: PlannedVerify, plan: VerifyPlan, workers: Workers, reporter: Reporter) -> float:
    """run_verify's comparison on the session the load check left open in the worker. Returns its seconds."""
    reporter.stage("verifying against the source")
    clock = time.perf_counter()
    _publish_only_verified(planned.run_in(workers.get()), plan.offers, reporter)
    return time.perf_counter() - clock


def _publish_only_verified(report: VerifyReport, offers: tuple[str, ...], reporter: Reporter) -> None:
    """Raise the refusal of a model that differs, its next steps as far as the compile's command takes them (`offers`)."""
    if not report.ok:
        error = dataclasses.replace(report, offers=offers).exception()
        raise type(error)(f"not published: {error.message}")
    worst = max((o.metric("max_abs") or 0.0 for run in report.runs for o in run.outputs), default=0.0)
    reporter.detail(f"verified: outputs match the source on the CPU EP (max abs diff {worst:.3g}; {report.criterion.kind})")


def stage_graph(step: EpStepOutput, staging_dir: Path, model: str, embed: str,
                staged: StagedNames | None = None) -> tuple[list[tuple[WrittenFile, str]], GraphSummary]:
    """Pass 2 into the stage: the graph proto written on its own, after the data files and the EP's blob files it
    names were renamed to their content-addressed names (hashed and synced). Only the blobs the graph names are
    outputs: anything else an EP left in the stage is not published. `staged`: a batch's, whose data files are shared."""
    staged = staged or StagedNames(staging_dir, step.data_files)
    with ThreadPoolExecutor(max_workers=1) as pool:
        model_file, blobs, graph = write_graph(step.graph_proto, staging_dir, model, embed, pool, staged)
    data = [f for f in staged.data_files if f.name in graph.data_locations]
    return [(model_file, "model"), *((f, "data") for f in data), *((f, "ep_context") for f in blobs)], graph


def check_staged(built: Built, staged: Path, digest: InputDigest, shared: set[str] | None, workers: Workers,
                 alone: bool) -> tuple[CheckOutcome, PlannedVerify | None]:
    """The pre-publish check of a staged output, and with --check load --verify (`alone`: not a batch, whose sessions
    would all be held at once) verify's comparison, whose session the check opened and left open."""
    plan = built.plan
    held = verify_session(built, staged, digest, shared) if alone else None
    if held is None:
        return run_check(staged, plan.check, workers, plan.reporter), None
    return check_in_verify_session(staged, plan.check, held, workers, plan.reporter), held


def run_check(staged_model: Path, plan: CheckPlan, workers: Workers, reporter: Reporter) -> CheckOutcome:
    """The pre-publish check in the worker child: open the staged output on its EP (and run it against the
    source by verify's criterion); raise CompilationFailed when it would not load or not agree. With --verify
    (`verify_criterion`: its settings) outputs that differ are VerificationFailed (exit 5), as --verify's are."""
    from ortcompile.readback import check
    from ortcompile.readback.parity import run_parity

    if plan.note:
        reporter.detail(plan.note)
    mode, source, verify_criterion = plan.mode, plan.source, plan.verify_criterion
    if mode == "none":
        return CheckOutcome(CheckRecord("none", None), None)
    given = given_inputs(plan.freeze, plan.inputs)
    clock = time.perf_counter()
    worker = workers.get()
    reporter.stage(f"checking {staged_model.name}: {'load and run' if mode == 'run' else 'load'} on {plan.ep_label}")
    request_ = check.check_request(staged_model, source.absolute(), plan.request, mode, plan.precision, plan.dims, given, verify_criterion,
                                   offers=plan.offers)
    with _ep_death_marked():
        report = worker.call(run_parity, request_, doing=f"{'running' if mode == 'run' else 'loading'} the compiled {staged_model.name}")
    return _passed(report, plan, bool(given), clock, worker, reporter)


def check_in_verify_session(staged_model: Path, plan: CheckPlan, verify: PlannedVerify, workers: Workers, reporter: Reporter) -> CheckOutcome:
    """The load check (`--check load`) when --verify follows: verify's session opened in the worker child and left
    open there for verify's run (parity.open_for_run). The load is proven when that session is created."""
    from ortcompile.readback.parity import open_for_run

    if plan.note:
        reporter.detail(plan.note)
    clock = time.perf_counter()
    worker = workers.get()
    reporter.stage(f"checking {staged_model.name}: load on {plan.ep_label}")
    assert verify.parity is not None  # (plan_staged_verify plans nothing else)
    with _ep_death_marked():
        report = worker.call(open_for_run, verify.parity, doing=f"loading the compiled {staged_model.name}")
    return _passed(report, plan, bool(given_inputs(plan.freeze, plan.inputs)), clock, worker, reporter)


# What a worker dies of when the EP's code fails on the graph (not SIGKILL: the user, or the kernel out of memory)
EP_BUG_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})


@contextlib.contextmanager
def _ep_death_marked() -> Iterator[None]:
    """A worker that crashes while the check loads or runs the compiled model crashed in the EP on it: marked so (as
    the report's `compiled_failed`), for --fallback auto to look for the op type it fails on (fallback.py)."""
    try:
        yield
    except WorkerCrashed as exc:
        exc.compiled_failed = exc.signal in EP_BUG_SIGNALS
        raise


def _passed(report: ParityReport, plan: CheckPlan, given: bool, clock: float, worker: Worker, reporter: Reporter) -> CheckOutcome:
    """The check's outcome (its record, its report, its time and peak), or its refusal: nothing is published."""
    from ortcompile.readback import check

    source, verify_criterion = plan.source, plan.verify_criterion
    if not report.ok:
        detail = check.failure_detail(report)
        failed = (VerificationFailed(f"not published: {report.failure()}", detail=detail)  # the very verdict --verify gives
                  if verify_criterion is not None and report.exit_code == VerificationFailed.exit_code
                  else CompilationFailed(f"{source.name}: not published: {report.failure()}", detail=detail))
        failed.parity_report = report  # type: ignore[attr-defined]  # fallback.py localizes the divergence from it
        raise failed
    if report.warning:
        warnings.warn(f"{source.name}: {report.warning}", OrtCompileWarning, stacklevel=3)
    seconds = time.perf_counter() - clock
    reporter.detail(check.describe_ok(report, seconds))
    return CheckOutcome(check.record(report, given), check.to_json(report), seconds, worker.peak_rss_bytes)


def _publish_order(builds: list[Built]) -> list[str]:
    """Data and blobs first, the models after them, the manifests last: a model never points at missing bytes."""
    rest = sorted({f.name for b in builds for f, role in b.files if role != "model"})
    return [*rest, *(b.plan.target.names.model for b in builds), *(b.plan.target.names.manifest for b in builds)]


def write_staged(path: Path, content: bytes) -> None:
    try:
        write_new(path, content)
    except OSError as exc:
        raise output_error(exc, path.name) from exc


def node_counts(source_ops: dict[str, int], graph: GraphSummary) -> NodeCounts:
    """EPContext nodes hide which ops they replaced: record it as source ops minus remaining ops."""
    compiled = collections.Counter(source_ops)
    compiled.subtract(graph.remaining_ops)
    return NodeCounts(graph.epcontext_nodes, {op: n for op, n in sorted(compiled.items()) if n > 0}, graph.remaining_ops)


def versions(ep: eps.ResolvedEp) -> Versions:
    import onnxruntime as ort

    return Versions(__version__, ort.__version__, ep.name, ep.version)
