"""`ortcompile verify`: prove a compiled model computes what its source computes.

Order matters for memory and for honesty: integrity first (a tampered file fails before anything runs);
then, in a worker child (an EP that crashes on a bad blob cannot take ortcompile down), one session at a
time: the compiled model on its EP, the source on the same EP for the load-time comparison, the source on
the CPU EP for the reference outputs, each freed before the next (parity.py).

Outputs are judged by the criterion for the EP's precision (criteria.py): fp32 EPs element by element
(`numpy.isclose`), fp16 and quantized EPs by the parity metrics used for accelerators (SNR, cosine, top-1 of
decisive rows). Inputs are the user's (`--input`, `--inputs`) where given, else generated from what the
source graph says (indices inside the tables they index, compared-with constants, masks); the report says
which dims were guessed.

When outputs differ, the divergence is localized as the pre-publish check does (localize.py), on the source given:
its intermediates as outputs, on the EP and on the CPU EP, on the inputs of the failing set. The failure names the
first diverging node and the compile options that keep it off the EP; the node-by-node table is in the JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile import eps
from ortcompile.eps.catalog import library_options
from ortcompile.eps.request import EpRequest, ep_precision
from ortcompile.errors import CompilationFailed, InvalidModel, OrtCompileError, UsageError, VerificationFailed
from ortcompile.jsonedge import JsonObject
from ortcompile.naming import manifest_path_for
from ortcompile.native import native_output_shown
from ortcompile.options import ALL_REFUSAL_OFFERS, refusal_offers_for
from ortcompile.output.digest import hash_file
from ortcompile.output.manifest import Manifest
from ortcompile.paths import not_a_model_file
from ortcompile.plan.shapes import resolve_pins
from ortcompile.plan.source import SourceModel, read_source
from ortcompile.progress import SilentReporter
from ortcompile.readback.criteria import Criterion, criterion_for
from ortcompile.readback.given import Given
from ortcompile.readback.inspect import TensorInfo, inspect_model
from ortcompile.readback.integrity import ManifestStatus, check_manifest
from ortcompile.readback.localize import Divergence, LocalizeRequest, divergence_table, localize_in_child
from ortcompile.readback.nextsteps import next_steps, placement_step
from ortcompile.readback.parity import ParityReport, ParityRequest, ParityRun, run_parity
from ortcompile.run.load import recorded_ep_options
from ortcompile.run.sessions import probe_load
from ortcompile.worker import Worker, fresh_worker

VERIFY_FORMAT = "ortcompile-verify/2"


@dataclass
class VerifyReport:
    compiled: Path
    reference: Path
    ep: str
    criterion: Criterion
    integrity: ManifestStatus
    parity: ParityReport | None = None
    structure_problems: list[str] = field(default_factory=list)  # missing/short/unsafe files the graph names
    reference_note: str = ""  # when the reference is not the source the manifest records: the outputs are compared anyway
    divergence: Divergence | None = None  # where the outputs start to differ (when they do)
    offers: tuple[str, ...] = ALL_REFUSAL_OFFERS  # the options a refusal may suggest: those of the compile that made it (nextsteps.py)

    @property
    def integrity_ok(self) -> bool:
        return (self.integrity.ok or not self.integrity.found) and not self.structure_problems

    @property
    def ok(self) -> bool:
        return self.integrity_ok and self.parity is not None and self.parity.ok and bool(self.parity.runs or self.parity.warning)

    @property
    def runs(self) -> list[ParityRun]:
        return self.parity.runs if self.parity else []

    def failure(self) -> str:
        """One line saying why verification failed."""
        if not self.integrity_ok:
            manifest_problems = self.integrity.problems if self.integrity.found else []  # no manifest is no failure
            return "integrity check failed: " + "; ".join(manifest_problems + self.structure_problems)
        if self.parity is None:
            return "nothing was run"
        if self.divergence is None:
            return self.parity.failure()
        return f"{self.parity.error}; {self.divergence.summary()}; {next_steps('verify', first=self._placement_step(), offers=self.offers)}"

    def divergence_lines(self) -> list[str]:
        """-v: where the outputs start to differ, node by node (nothing when they do not)."""
        if self.divergence is None:
            return []
        return [f"diverges   {self.divergence.summary()}", *divergence_table(self.divergence)]

    def _placement_step(self) -> str | None:
        """Recompiling with the diverging nodes on the CPU EP (None when nothing was localized: the generic steps)."""
        assert self.divergence is not None
        if self.divergence.error:
            return None
        if self.divergence.agrees:  # the source is computed right on the EP: the compiled file is what differs
            return "compile it again from the source (the compiled graph or its context is not what the source compiles to)"
        nodes = [r.node for r in self.divergence.first]
        return placement_step(nodes, "compile with ", self.offers)

    def exception(self) -> OrtCompileError:
        """The error for a failed verification: exit 5 when the model differs (files, outputs), exit 1 when a
        session could not be created or run (the EP's own message: not a verdict on the outputs)."""
        if self.integrity_ok and self.parity is not None and self.parity.exit_code == CompilationFailed.exit_code:
            return CompilationFailed(self.failure())
        return VerificationFailed(self.failure())

    def to_json(self) -> JsonObject:
        seconds = dict(self.parity.seconds) if self.parity else {}
        speedup = None
        if seconds.get("compiled") and seconds.get("source_on_ep") and self.ep != eps.CPU_EP:  # two CPU loads compare nothing
            speedup = round(seconds["source_on_ep"] / seconds["compiled"], 2)
        return {
            "format": VERIFY_FORMAT,
            "ok": self.ok,
            "compiled": str(self.compiled),
            "reference": str(self.reference),
            "reference_note": self.reference_note,
            "ep": self.ep,
            "criterion": {**self.criterion.to_json(), "describe": self.criterion.describe()},
            "integrity": {**self.integrity.to_json(), "referenced_files_problems": self.structure_problems},
            "dims": self.parity.dims if self.parity else {},
            "guessed_dims": self.parity.guessed if self.parity else {},
            "inputs": self.parity.notes if self.parity else [],
            "session_seconds": {k: round(v, 3) for k, v in seconds.items() if k in ("compiled", "source_on_ep", "source_on_cpu")},
            "load_speedup": speedup,
            "runs": [run.to_json() for run in self.runs],
            "input_sets": self.parity.sets if self.parity else [],
            "warning": self.parity.warning if self.parity else "",  # outputs not compared (random ops), said why
            "divergence": self.divergence.to_json() if self.divergence else None,  # first diverging nodes, node by node
            "failure": "" if self.ok else self.failure(),
        }


def verify_model(
    compiled: str | Path,
    reference: str | Path,
    ep: str | None = None,
    criterion: Criterion | None = None,
    seed: int = 0,
    runs: int = 1,
    dims: dict[str, int] | None = None,
    inputs: dict[str, Given] | None = None,
    time_source: bool = True,
    precision: str | None = None,
    localize: bool = True,
    **criterion_overrides: Any,
) -> VerifyReport:
    """Check integrity, then compare the compiled model on its EP with the source on the CPU EP.

    `criterion`: how outputs are judged (default: the verify criterion for the EP's precision, with
    `criterion_overrides` such as rtol=..., min_snr_db=... applied; `precision` judges as an EP of that
    precision instead of the EP's own); `dims`: values of symbolic dims (default:
    the compile's pins, then documented guesses); `inputs`: arrays or scalars for some inputs (readback.given);
    `localize`: when outputs differ, find the first diverging nodes of the source on the EP (one more EP compile).
    """
    compiled, reference = Path(compiled), Path(reference)
    problem = not_a_model_file(compiled)  # missing, a directory, a FIFO (which would block the read): one line
    if problem:
        raise InvalidModel(problem)
    source = read_source(reference)
    integrity = check_manifest(compiled, hash_files=True)
    planned = plan_verify(compiled, reference, source, integrity, ep, criterion, seed, runs, dims, inputs, time_source, precision,
                          localize, **criterion_overrides)
    planned.report.reference_note = _reference_note(reference, integrity.manifest)
    if planned.parity is None:
        return planned.report
    with fresh_worker(planned.label, None, native_output_shown()) as worker:
        return planned.run_in(worker)


@dataclass
class PlannedVerify:
    """What verify runs, decided in the parent: the report so far and the comparison (None: integrity failed, nothing runs)."""

    report: VerifyReport
    parity: ParityRequest | None
    resolved: eps.ResolvedEp
    localize: bool

    @property
    def label(self) -> str:
        """Who a crash in the worker is blamed on."""
        return f"the {self.resolved.info.short_name} EP"

    def run_in(self, worker: Worker) -> VerifyReport:
        """The comparison (and the localization of a divergence) in `worker`, named and silent as verify's own worker
        is; a session `open_for_run` left open there for this comparison is the one it runs."""
        assert self.parity is not None
        label, reporter = worker.label, worker.reporter
        worker.label, worker.reporter = self.label, SilentReporter()
        try:
            self.report.parity, self.report.divergence = _run(worker, self.parity, self.resolved, self.localize)
        finally:
            worker.label, worker.reporter = label, reporter
        return self.report


def plan_verify(compiled: Path, reference: Path, source: SourceModel, integrity: ManifestStatus, ep: str | None = None,
                criterion: Criterion | None = None, seed: int = 0, runs: int = 1, dims: dict[str, int] | None = None,
                inputs: dict[str, Given] | None = None, time_source: bool = True, precision: str | None = None, localize: bool = True,
                **criterion_overrides: Any) -> PlannedVerify:
    """verify_model's decisions, from the manifest's status (`integrity`) and the source read: the EP, the criterion,
    the dims and the comparison to run."""
    structure = inspect_model(compiled)
    request = _ep_request(ep, integrity, compiled)
    resolved = request.resolve()
    criterion = criterion or criterion_for(precision or _precision(resolved, source), "verify", **criterion_overrides)
    recorded = integrity.manifest.options if integrity.manifest else {}
    offers = refusal_offers_for(bool(recorded.get("partition")), bool(recorded.get("share_weights")))  # what its compile took
    report = VerifyReport(compiled, reference, resolved.name, criterion, integrity, offers=offers)
    report.structure_problems = [p for p in structure.problems if p not in integrity.problems]
    if not report.integrity_ok:
        return PlannedVerify(report, None, resolved, localize)
    chosen = choose_dims(source, structure.inputs, recorded, dims or {})
    if integrity.manifest and integrity.manifest.shares_ep_context:
        _require_loadable_shared_context(compiled, resolved, chosen)
    parity = ParityRequest(compiled.absolute(), reference.absolute(), request, "run", criterion, chosen,
                           tuple(seed + i for i in range(max(1, runs))), dict(inputs or {}), time_source)
    return PlannedVerify(report, parity, resolved, localize)


def plan_staged_verify(compiled: Path, reference: Path, manifest: Manifest, check: EpRequest, dims: dict[str, int],
                       inputs: dict[str, Given], **criterion: Any) -> PlannedVerify | None:
    """`compile --verify` of a staged output whose manifest is still in memory (its files were hashed as they were
    written), planned so that its load check opens verify's session (parity.open_for_run); None when that session
    would not be the one the check opens (`check`: the check's EP request; verify leaves out a recorded option that
    loads a library) or verify would open something first (a shared context's probe)."""
    if check.library or library_options(check.options) or manifest.shares_ep_context:
        return None
    integrity = ManifestStatus(manifest_path_for(compiled), found=True, hashed=False, manifest=manifest)
    planned = plan_verify(compiled, reference, read_source(reference), integrity, dims=dims, inputs=inputs, time_source=False, **criterion)
    checked = check.resolve()
    if planned.parity is None or (planned.resolved.name, planned.resolved.options) != (checked.name, checked.options):
        return None
    return planned


def _reference_note(reference: Path, manifest: Manifest | None) -> str:
    """Say so when the reference is not the model file the manifest says COMPILED was built from (size, then sha256):
    comparing with another model is allowed (a re-export, a fixed copy), but a pass then proves something else."""
    if manifest is None or not manifest.input_files:
        return ""
    recorded = manifest.input_files[0]  # the source model itself comes first
    if reference.stat().st_size == recorded.size and hash_file(reference).sha256 == recorded.sha256:
        return ""
    return (f"{reference} is not the source this model was compiled from (the manifest records {recorded.name}, "
            f"{recorded.size} bytes, sha256 {recorded.sha256[:12]}...); its outputs are the reference anyway")


def _run(worker: Worker, request: ParityRequest, resolved: eps.ResolvedEp, localize: bool) -> tuple[ParityReport, Divergence | None]:
    parity = worker.call(run_parity, request, doing=f"running {request.model.name} and its source")
    # Only where the EP computes in another precision: CPU against CPU, or an fp32 tolerance, localizes nothing
    if not (localize and parity.outputs_differ and request.criterion is not None and request.criterion.kind == "parity"
            and resolved.name != eps.CPU_EP):
        return parity, None
    failed_run = parity.failed_run
    assert failed_run is not None  # outputs_differ
    where = LocalizeRequest(request.source, request.source, request.ep, request.criterion, dict(parity.dims), failed_run.seed,
                            request.given, parity.failed_set)
    try:
        return parity, worker.call(localize_in_child, where, doing=f"localizing the divergence in {request.source.name}")
    except Exception as exc:  # only a diagnosis: never hide the comparison's own verdict
        return parity, Divergence(error=str(getattr(exc, "message", exc)))


def _precision(resolved: eps.ResolvedEp, source: SourceModel) -> str:
    return ep_precision(resolved, source.op_counts)


def _ep_request(ep: str | None, integrity: ManifestStatus, compiled: Path) -> EpRequest:
    """By default, verify on the EP, options and target the model was compiled for (a recorded option that loads a
    library left out: run/load.recorded_ep_options)."""
    if ep:
        return EpRequest(ep)
    manifest = integrity.manifest
    if manifest is None:
        return EpRequest("auto")
    target = (manifest.target or {}).get("name")
    return EpRequest(manifest.ep or "auto", recorded_ep_options(manifest, compiled), target)


def _require_loadable_shared_context(compiled: Path, resolved: eps.ResolvedEp, dims: dict[str, int]) -> None:
    """Part of a --share-weights batch: QNN's simulator segfaults loading a shared context; say so, in one line."""
    why = probe_load(compiled, resolved.info.short_name, resolved.options, dims)
    if why:
        raise CompilationFailed(f"shared EP context: cannot be loaded on this device ({resolved.name}: {why})")


def choose_dims(source: SourceModel, compiled_inputs: list[TensorInfo], recorded: JsonObject, requested: dict[str, int]) -> dict[str, int]:
    """A value for every symbolic dim of the source that something decides: --dim, else what the compile pinned,
    else what the compiled model has fixed. The rest are left to the input generator, which guesses and says so.

    A --dim that contradicts a dimension the compiled model has fixed is a usage error: the two models could
    not be fed the same inputs.
    """
    unknown = sorted(set(requested) - source.symbolic_dims)
    if unknown:
        known = ", ".join(sorted(source.symbolic_dims)) or "none"
        raise UsageError(f"--dim {unknown[0]}: the source has no symbolic dimension {unknown[0]!r} (it has: {known})")
    fixed_in_compiled = _fixed_by_compiled(source, compiled_inputs)
    try:
        pinned = resolve_pins(source, recorded.get("fix_dims", {}), {k: tuple(v) for k, v in recorded.get("fix_shapes", {}).items()}).named
    except UsageError:
        pinned = {}
    dims = {}
    for name in sorted(source.symbolic_dims):
        compiled_value = fixed_in_compiled.get(name)
        if name in requested and compiled_value is not None and requested[name] != compiled_value:
            raise UsageError(f"--dim {name}={requested[name]} conflicts with the compiled model, which has {name}={compiled_value} fixed")
        value = requested.get(name, pinned.get(name, compiled_value))
        if value is not None:
            dims[name] = value
    return dims


def _fixed_by_compiled(source: SourceModel, compiled_inputs: list[TensorInfo]) -> dict[str, int]:
    by_name = {i.name: i.shape for i in compiled_inputs}
    fixed = {}
    for model_input in source.inputs:
        for declared, actual in zip(model_input.dims, by_name.get(model_input.name, [])):
            if isinstance(declared, str) and isinstance(actual, int):
                fixed[declared] = actual
    return fixed
