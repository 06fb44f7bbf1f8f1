"""When the NPU computes something else: say where, keep it off the NPU (`--fallback auto`), never publish it wrong.

One compile is one round: build into a stage, then finish (check -> manifest -> publish). When the pre-publish check
finds outputs outside its criterion, the divergence is localized (readback/localize.py) before the stage goes:

- `--fallback off` (the default): nothing is published; the refusal names the first diverging node(s) and the next
  step (`--fallback auto`, `--cpu-nodes NODE`). A model that computes something else is never the default outcome,
  and nodes never leave the NPU unless the user said so (as `--allow-partial` is never assumed either).
- `--fallback auto`: the diverging nodes move to the CPU EP (with the rest of the fp16 lint pattern they belong to,
  and, for a node already on the CPU, the nodes feeding it: its inputs came wrong from the EP), then the model is
  compiled and checked again, up to MAX_ROUNDS more times. What moved, how many nodes and partitions now run on the
  CPU EP and the check's worst SNR before and after go into the summary and the manifest (`cpu_nodes`).

When the EP fails on the graph it compiled instead (crashes running it, cannot load it: nothing to localize), `--fallback
auto` moves the op types it took to the CPU EP one at a time, fewest nodes first (`Probe`), until a round passes.

The fp16 lint (readback/lint.py) runs first, for EPs computing in fp16: its warnings name nodes before the long
compile, and are the first candidates when the divergence cannot be pinned on single nodes.
"""

from __future__ import annotations

import itertools
import warnings
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ortcompile.compile.cpunodes import CpuPins, pinned_request, require_supported, resolve_cpu_nodes
from ortcompile.compile.epstep import PREPARE_DIR
from ortcompile.compile.finish import EP_BUG_SIGNALS, Built, Finished, finish, given_inputs, worst_snr, worst_snr_of
from ortcompile.compile.nodecut import CannotCut, CompileOne, PlacedStitch, Placement, placed_stitch, placement_of
from ortcompile.compile.ortstep import LayoutRefused
from ortcompile.eps.catalog import CPU_EP, CPU_PINNING_EPS
from ortcompile.eps.request import EpRequest
from ortcompile.errors import CompilationFailed, OrtCompileWarning, UsageError, VerificationFailed
from ortcompile.jsonedge import JsonObject
from ortcompile.options import CompileResult
from ortcompile.output.digest import InputDigest
from ortcompile.output.publish import Staging
from ortcompile.plan.planner import CompilePlan
from ortcompile.progress import Reporter
from ortcompile.readback.lint import Finding, lint_model
from ortcompile.readback.nextsteps import next_steps, placement_step
from ortcompile.worker import NOT_PUBLISHED, WorkerCrashed, Workers

if TYPE_CHECKING:
    from ortcompile.readback.localize import Divergence

MAX_ROUNDS = 3  # recompiles --fallback auto may add: each moves the nodes the last check found diverging
MAX_PROBES = 12  # op types --fallback auto tries off the EP, one at a time, when the EP fails on its compiled graph
FALLBACK_MODES = ("off", "auto")


class CompileRound(Protocol):
    """What the rounds need of the compile that drives them (compile/compilejob.py's CompileJob): its plan, one build
    into a stage, its result from what finish did, and the EP request to build with."""

    plan: CompilePlan
    reporter: Reporter
    fallback: FallbackState | None
    request_override: EpRequest | None

    @property
    def request(self) -> EpRequest: ...

    def build(self, staging_dir: Path, workers: Workers) -> Built: ...

    def result(self, built: Built, finished: Finished) -> CompileResult: ...


@dataclass
class FallbackState:
    """What the rounds of one compile found and did (the manifest's `cpu_nodes`, the result's `fallback`)."""

    pins: CpuPins
    findings: list[Finding] = field(default_factory=list)
    rounds: list[JsonObject] = field(default_factory=list)  # (rows of the manifest's cpu_nodes record) one per failed check: the pins, worst SNR, divergence
    placement: JsonObject = field(default_factory=dict)  # (cpunodes.cpu_placement's) the published graph's CPU nodes and partitions
    how: Placement = field(default_factory=Placement)  # this round's: op types refused whole, nodes cut out (nodecut.py)
    model: Any = None  # the source's graph (no weights): what the pins are placed in
    can_cut: bool = True  # False once the graph could not be cut (nodecut.CannotCut): whole op types from then on

    def place(self, pins: CpuPins) -> Placement:
        """How `pins` leave the EP: whole op types, and nodes cut out while the graph can be cut."""
        if not pins:
            return Placement()
        if self.model is None or not self.can_cut:  # (no graph read: no --cpu-nodes, --fallback or fp16 lint asked for it)
            return Placement(pins.op_types)
        return placement_of(self.model, pins)

    def failed_round(self, failure: str) -> None:
        """A round in which the EP failed on its own graph (nothing to localize): this round's placement and why."""
        failure = failure.removesuffix(NOT_PUBLISHED)
        self.rounds.append({"op_types": list(self.how.op_types), "cut": list(self.how.cut), "worst_snr_db": None, "first": [],
                            "divergence": {"ep_failure": failure}, "ep_failure": failure})

    def record(self, check_report: JsonObject | None) -> JsonObject | None:
        """For the manifest: requested patterns, op types refused to the EP, the nodes on the CPU EP, the rounds."""
        if not self.pins and not self.rounds:
            return None
        return {"requested": list(self.pins.patterns), "op_types": list(self.how.op_types), "cut": list(self.how.cut), "moved": list(self.pins.nodes),
                "nodes": [n["name"] for n in self.placement.get("nodes", [])], "partitions": self.placement.get("partitions", 0),
                "rounds": [{"op_types": r["op_types"], "cut": r["cut"], "worst_snr_db": r["worst_snr_db"], "first": r["first"],
                            **({"ep_failure": r["ep_failure"]} if "ep_failure" in r else {})} for r in self.rounds],
                "worst_snr_db_before": self.rounds[0]["worst_snr_db"] if self.rounds else None,
                "worst_snr_db_after": worst_snr(check_report)}

    def to_result(self, check_report: JsonObject | None) -> JsonObject | None:
        """For the result (--json): the record, its one-line summary and each round's node-by-node table."""
        record = self.record(check_report)
        if record is None:
            return None
        return {**record, "summary": self.summary(check_report), "divergence": [r["divergence"] for r in self.rounds]}

    def summary(self, check_report: JsonObject | None) -> str:
        """One line for the summary: what runs on the CPU EP and why."""
        record = self.record(check_report) or {}
        if not record:
            return ""
        moved = f"moved to the CPU EP: {self.how.describe()}"
        nodes, partitions = len(record["nodes"]), record["partitions"]
        counts = f"{nodes} node{'s' if nodes != 1 else ''} in {partitions} CPU partition{'s' if partitions != 1 else ''}"
        if not self.rounds:
            return f"{moved} (--cpu-nodes); {counts}"
        before, after = record["worst_snr_db_before"], record["worst_snr_db_after"]
        snr = (f"the EP failed on the graph as first compiled; check worst SNR {_db(after)}" if "ep_failure" in self.rounds[0]
               else f"check worst SNR {_db(before)} -> {_db(after)}")
        return f"{moved} (--fallback auto, {len(self.rounds)} round{'s' if len(self.rounds) > 1 else ''}); {counts}; {snr}"


def _db(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} dB"


def start_state(job: CompileRound) -> FallbackState:
    """Resolve --cpu-nodes against the source and lint it for fp16 EPs (warnings before the long compile)."""
    import onnx

    plan = job.plan
    options = plan.options
    fp16 = options.lint and plan.precision == "fp16"
    if not (options.cpu_nodes or options.fallback == "auto" or fp16):
        return FallbackState(CpuPins())
    model = onnx.load_model(str(plan.source.path), load_external_data=False)
    pins = resolve_cpu_nodes(model, options.cpu_nodes, plan.source.path.name) if options.cpu_nodes else CpuPins()
    require_supported(plan.ep.name, options.ep_options, pins)
    if options.fallback == "auto":
        require_supported(plan.ep.name, options.ep_options, ("auto",), "--fallback auto")
        if options.check in ("none", "load"):
            raise UsageError(f"--fallback auto moves the nodes the check finds diverging: it needs --check run or auto, not --check {options.check}")
    findings = lint_model(model) if fp16 else []
    for finding in findings:
        if finding.severity == "warning":
            warnings.warn(f"{plan.source.path.name}: fp16: {finding.describe()}", OrtCompileWarning, stacklevel=2)
        else:
            job.reporter.detail(f"fp16 lint: {finding.describe()}")
    return FallbackState(pins, findings, model=model)


def run_rounds(job: CompileRound, workers: Workers, digest: Future[InputDigest], compile_part: CompileOne) -> CompileResult:
    """Build, check and publish; on outputs that differ, localize, and with --fallback auto move nodes and retry; when
    the EP fails on the graph it compiled, with --fallback auto look for the op type it fails on (`Probe`).
    `compile_part`: job.compile_model, what the parts of a graph cut around pinned nodes compile with (nodecut.py)."""
    state = start_state(job)
    job.fallback = state
    base_request = job.plan.request
    probe: Probe | None = None
    parity_rounds = 0
    for attempt in itertools.count():
        if attempt:
            workers.renew()  # a fresh EP state for the next compile, as every compile gets
        with Staging(job.plan.output_dir) as staging:
            # (the localization runs the whole graph: there the pinned nodes' op types are all refused to the EP)
            job.request_override = pinned_request(base_request, state.pins, staging.path)
            state.placement = {}
            state.how = state.place(state.pins)
            try:
                # some nodes of an op type, not all: cut around them; --partition: split by its budget too
                stitch = _cut(job, state, staging.path, compile_part) if state.how.cut or job.plan.options.partition else None
                if stitch is not None:
                    built, result = stitch.build(staging.path), stitch.result
                else:
                    built, result = job.build(staging.path, workers), job.result  # (its graph pass reads the placement into state)
            except LayoutRefused as refused:
                _move_refused(job, state, refused)
                continue
            try:
                return result(built, finish([built], staging, workers, [digest])[0])
            except (CompilationFailed, VerificationFailed) as exc:
                if ep_failed(exc):
                    probe = _probe_on(job, state, probe, exc, built)
                    continue
                report = getattr(exc, "parity_report", None)
                if report is None or not report.outputs_differ:
                    raise
                if job.plan.options.partition is not None:  # localizing would compile the whole graph, which --partition avoids
                    raise partition_refusal(exc, state) from exc
                try:
                    divergence = _localize(job, staging.path, workers, report)
                except WorkerCrashed:  # (--fallback auto only) the EP crashed running the diagnostic copy
                    probe = _probe_on(job, state, probe, exc, built)
                    continue
                state.rounds.append({"op_types": list(state.how.op_types), "cut": list(state.how.cut),
                                     "worst_snr_db": worst_snr_of(o.to_json() for o in report.outputs),
                                     "first": [r.node for r in divergence.first], "divergence": divergence.to_json()})
                job.reporter.detail(f"check: {divergence.summary()}")
                from ortcompile.readback.localize import divergence_table  # see LAZY_IMPORTS (--if-changed)

                for line in divergence_table(divergence):
                    job.reporter.detail(line)
                more = next_pins(state.pins, divergence, state.findings)
                how = state.place(more)
                if job.plan.options.fallback != "auto" or how == state.how or parity_rounds == MAX_ROUNDS:
                    raise refusal(exc, divergence, job, state, more) from exc
                job.reporter.stage(f"fallback: moving {how.describe(state.how)} to the CPU EP")
                state.pins = more
                parity_rounds += 1
            finally:
                job.request_override = None
    raise AssertionError("unreachable")


def _move_refused(job: CompileRound, state: FallbackState, refused: LayoutRefused) -> None:
    """--fallback auto: the op type whose NHWC form the EP refused goes to the CPU EP (else the refusal stands)."""
    plan = job.plan
    if (plan.options.fallback != "auto" or plan.ep.name not in CPU_PINNING_EPS or plan.options.partition is not None
            or refused.op_type in state.pins.op_types or len(state.rounds) >= MAX_PROBES):
        raise refused
    state.failed_round(refused.message)
    job.reporter.stage(f"fallback: moving {refused.op_type} to the CPU EP ({plan.ep.info.short_name} refused its NHWC form)")
    state.pins = state.pins.adding([refused.op_type])


def ep_failed(exc: CompilationFailed | VerificationFailed) -> bool:
    """The EP crashed on, or could not load or run, the graph it compiled: not outputs that differ, not the source."""
    if isinstance(exc, WorkerCrashed):
        return exc.compiled_failed
    report = getattr(exc, "parity_report", None)
    return report is not None and report.compiled_failed


@dataclass
class Probe:
    """--fallback auto when the EP fails on the graph it compiled (a crash, a graph it cannot load or run): the op
    types it took, each moved to the CPU EP alone, fewest nodes first, until a compile passes its check."""

    base: CpuPins  # the pins before the search
    left: list[str]  # op types still to try
    failure: str  # the EP's failure on the graph as compiled first
    tried: list[str] = field(default_factory=list)


def _probe_on(job: CompileRound, state: FallbackState, probe: Probe | None, exc: CompilationFailed | VerificationFailed,
              built: Built) -> Probe:
    """The next op type to keep off the EP (state.pins set for the next round), or the refusal when there is none."""
    plan = job.plan
    if plan.ep.name not in CPU_PINNING_EPS or plan.options.partition is not None:
        raise exc  # (no op can be kept off this EP; --partition refuses --fallback auto)
    if plan.options.fallback != "auto":
        raise ep_failure_refusal(exc, runs=plan.options.check not in ("none", "load")) from exc
    if probe is None:
        probe = Probe(state.pins, probe_candidates(state.model, state.pins, built.graph.remaining_ops), exc.message)
    if not probe.left:
        tried = (f"each of {', '.join(probe.tried)}" if len(probe.tried) > 1 else probe.tried[0] if probe.tried
                 else "nothing (no op type it took is left to move)")
        raise type(exc)(f"{probe.failure}; --fallback auto moved {tried} to the CPU EP alone, and the EP still failed "
                        "(-v shows its log)", detail=exc.detail) from exc
    op_type = probe.left.pop(0)
    probe.tried.append(op_type)
    state.failed_round(exc.message)
    job.reporter.stage(f"fallback: the EP failed on the compiled graph; trying {op_type} on the CPU EP")
    state.pins = probe.base.adding([op_type])
    return probe


def probe_candidates(model: Any, pins: CpuPins, left_on_cpu: dict[str, int]) -> list[str]:
    """The op types the EP took (every node's but those already on the CPU EP or pinned), fewest nodes first."""
    if model is None:
        return []
    counts = Counter(n.op_type for n in model.graph.node if n.op_type not in ("EPContext", "Constant"))
    took = [t for t in counts if t not in left_on_cpu and t not in pins.op_types]
    return sorted(took, key=lambda t: (counts[t], t))[:MAX_PROBES]


def ep_failure_refusal(exc: CompilationFailed | VerificationFailed, runs: bool) -> CompilationFailed | VerificationFailed:
    """The EP's failure as it was, with the way to find the op type it fails on (`runs`: the check runs the model, as
    --fallback auto needs)."""
    search = "--fallback auto" + ("" if runs else " (with --check auto)")
    error = type(exc)(f"{exc.message}; next: {search} to find the op type the EP fails on and keep it on the CPU EP, or --cpu-nodes op:TYPE",
                      detail=exc.detail)
    error.parity_report = getattr(exc, "parity_report", None)  # type: ignore[attr-defined]
    return error


def _cut(job: CompileRound, state: FallbackState, staging_dir: Path, compile_part: CompileOne) -> PlacedStitch | None:
    """The graph cut around the pinned nodes and its parts compiled; None when it cannot be cut there (the pinned
    nodes' op types are then refused whole, said in a warning: more moves than was asked)."""
    try:
        return placed_stitch(job.plan, state.how, staging_dir, job, compile_part, state)
    except CannotCut as exc:
        warnings.warn(f"{job.plan.source.path.name}: cannot cut the graph around {', '.join(state.how.cut)} ({exc.message}): "
                      f"moving every node of {', '.join(state.pins.op_types)} to the CPU EP instead", OrtCompileWarning, stacklevel=2)
        state.can_cut, state.how = False, Placement(state.pins.op_types)
        return None


def _localize(job: CompileRound, staging_dir: Path, workers: Workers, report: Any) -> Divergence:
    """The diagnostic run in the worker child, on the graph the EP compiled, with this round's pins."""

    plan = job.plan
    prepared = staging_dir / PREPARE_DIR / plan.source.path.name
    model = prepared if prepared.is_file() else plan.source.path.absolute()
    seed = report.failed_run.seed if report.failed_run else 0
    dims = {} if model == prepared else plan.pins.named  # the prepared graph has its dims pinned in it
    from ortcompile.readback.localize import Divergence, LocalizeRequest, localize_in_child  # see LAZY_IMPORTS (--if-changed)

    request = LocalizeRequest(model, plan.source.path.absolute(), job.request, report.criterion, dims, seed,
                              given_inputs(plan.options.freeze, plan.options.inputs), report.failed_set)
    try:
        return workers.get().call(localize_in_child, request, doing=f"localizing the divergence in {plan.source.path.name}")
    except WorkerCrashed as exc:
        if exc.signal in EP_BUG_SIGNALS and plan.options.fallback == "auto":
            raise  # the EP crashed on the diagnostic copy: run_rounds looks for the op type it fails on instead
        return Divergence(error=exc.message.removesuffix(NOT_PUBLISHED))
    except Exception as exc:  # only a diagnosis: never hide the check's own verdict
        return Divergence(error=str(getattr(exc, "message", exc)))


def next_pins(pins: CpuPins, divergence: Divergence, findings: list[Finding]) -> CpuPins:
    """The nodes to move next: the first diverging ones on the EP (with their lint pattern), and for one already on
    the CPU EP the nodes it reads from (its inputs came wrong); when no node stands out, every lint warning's nodes."""
    ops = {r.node: r.op_type for r in divergence.rows}
    moving: list[str] = []
    for row in divergence.first:
        if row.ep == CPU_EP:
            moving += row.reads
            continue
        moving.append(row.node)
        for finding in findings:
            if row.node in (finding.nodes or (finding.node,)):
                moving += list(finding.nodes)
    if not divergence.first:
        moving += [n for f in findings if f.severity == "warning" for n in (f.nodes or (f.node,))]
    known = [n for n in moving if n in ops]
    return pins.adding((ops[n] for n in known), known)


def partition_refusal(exc: CompilationFailed | VerificationFailed, state: FallbackState) -> CompilationFailed | VerificationFailed:
    """The check's error under --partition, whose next steps cannot include --fallback auto (refused with it)."""
    report = exc.parity_report  # type: ignore[attr-defined]  # run_rounds only refuses a failed comparison
    failure = exc.message.removesuffix(f"; {report.hint}") if report.hint else exc.message
    step = ("--cpu-nodes NODE for more nodes to keep on the CPU EP ('ortcompile inspect MODEL --lint' lists the fp16-fragile ones; "
            "--fallback auto finds them in a compile without --partition)")
    purpose = "verify" if isinstance(exc, VerificationFailed) else "check"
    error = type(exc)(f"{failure}; {next_steps(purpose, first=step)}", detail=exc.detail)
    error.json_detail = {"fallback": state.to_result(None)}  # type: ignore[attr-defined]
    return error


def refusal(exc: CompilationFailed | VerificationFailed, divergence: Divergence, job: CompileRound, state: FallbackState,
            more: CpuPins) -> CompilationFailed | VerificationFailed:
    """The check's error, with where the outputs start to differ and what to do next."""
    where = divergence.summary()
    nodes = [n for n in more.nodes if n not in state.pins.nodes] or [r.node for r in divergence.first]
    if divergence.first and all(r.ep == CPU_EP for r in divergence.first):
        where += " (on the CPU EP already: what it reads comes wrong from the EP)"
    can_pin, offers = job.plan.ep.name in CPU_PINNING_EPS, job.plan.check.offers
    if not can_pin:
        step = None  # this EP cannot keep nodes off it: --cpu-nodes / --fallback would be refused
    elif job.plan.options.fallback == "auto":
        tried = state.how.describe() if state.pins else "nothing"
        step = f"--fallback auto moved {tried} to the CPU EP in {len(state.rounds) - 1} round(s) and found nothing more to move"
    else:
        step = placement_step(nodes, offers=offers)
    report = exc.parity_report  # type: ignore[attr-defined]  # run_rounds only refuses a failed comparison
    failure = exc.message.removesuffix(f"; {report.hint}") if report.hint else exc.message
    purpose = "verify" if isinstance(exc, VerificationFailed) else "check"  # --verify's verdict: --check load would not help
    error = type(exc)(f"{failure}; {where}; {next_steps(purpose, first=step, can_pin=can_pin, offers=offers)}", detail=exc.detail)
    error.json_detail = {"fallback": state.to_result(None)}  # type: ignore[attr-defined]  # --json: the node-by-node tables
    return error
