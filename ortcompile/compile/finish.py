"""finish: check -> manifest -> verify -> publish -> stamp, shared by every way an output is made.

A single compile, a weight-sharing batch (published together) and a stitched partitioned model all end here, so
nothing reaches an output directory by another road. What finish needs of the thing being finished is the
`Finishing` protocol: CompileJob implements it for compiles, StitchJob (stitch.py) for stitched models.
"""

from __future__ import annotations

import collections
import os
import time
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ortcompile.errors import CompilationFailed, OrtCompileWarning, VerificationFailed, output_error
from ortcompile.naming import OutputNames
from ortcompile.options import CompileOptions, CompileResult
from ortcompile.output.digest import InputDigest, WrittenFile
from ortcompile.output.incremental import write_stamp
from ortcompile.output.manifest import Manifest, Versions
from ortcompile.output.publish import Staging, check_destination, directory_lock, prepare_output_dir, remove_created_dirs, remove_stale_stages
from ortcompile.progress import Reporter
from ortcompile.version import __version__

if TYPE_CHECKING:
    from ortcompile import eps
    from ortcompile.compile.epstep import EpRequest, EpStepOutput
    from ortcompile.compile.graphpass import GraphSummary, StagedNames
    from ortcompile.compile.job import Workers


class Finishing(Protocol):
    names: OutputNames
    output_dir: Path
    options: CompileOptions
    reporter: Reporter
    timings: dict[str, float]

    @property
    def inputs(self) -> list[Path]: ...  # files the output must never overwrite

    @property
    def stamp_source(self) -> Path | None: ...  # the source model, for --if-changed's stamp (None: no stamp)

    def check(self, staging_dir: Path, workers: Workers) -> dict[str, Any]: ...

    def manifest(self, built: Built, digest: InputDigest, check: dict[str, Any], shared: set[str] | None) -> Manifest: ...

    def verify(self, model: Path) -> None: ...

    def result(self, built: Built, manifest: Manifest) -> CompileResult: ...


@dataclass
class Built:
    """What the passes left in the staging directory for one model."""

    job: Finishing
    files: list[tuple[WrittenFile, str]]  # (file, role), the model first
    graph: GraphSummary
    step: EpStepOutput


def open_destination(output_dir: Path, names: OutputNames, force: bool, inputs: list[Path], reporter: Reporter) -> list[Path]:
    """Create the output directory (returning what was created, removed again on failure), refuse to replace an
    output without --force or to overwrite an input, and clean up stages left by killed runs."""
    created = prepare_output_dir(output_dir)
    try:
        check_destination(output_dir, names, force, inputs)
    except BaseException:
        remove_created_dirs(created)
        raise
    with directory_lock(output_dir):  # never beside another process's publish (it recovers under the lock too)
        for stale in remove_stale_stages(output_dir):
            reporter.detail(f"cleaned up staging directory {stale.name} left by a killed run")
    return created


def finish(builds: list[Built], staging: Staging, workers: Workers, digests: list[Future[InputDigest]],
           shared: set[str] | None = None, unchecked: str | None = None) -> list[CompileResult]:
    """check -> manifest -> verify -> publish -> stamp, for one model or a whole batch (published together).

    `unchecked`: why this machine cannot check these outputs (a shared EP context the simulator cannot load)."""
    first = builds[0].job
    if unchecked and first.options.check != "none":
        warnings.warn(f"{', '.join(b.job.names.model for b in builds)}: not checked before publishing: {unchecked}", OrtCompileWarning, stacklevel=2)
    manifests = []
    for built, digest in zip(builds, digests):
        job = built.job
        check = {"mode": "none", "passed": None, "reason": unchecked} if unchecked else job.check(staging.path, workers)
        manifest = job.manifest(built, digest.result(), check, shared)
        write_staged(staging.path / job.names.manifest, manifest.to_bytes())
        manifests.append(manifest)
    if first.options.verify:  # every model of the batch, before anything is published
        for built in builds:
            built.job.verify(staging.path / built.job.names.model)
    clock = time.perf_counter()
    first.reporter.stage("publishing")
    staging.publish(_publish_order(builds), [b.job.names for b in builds], first.options.force, [p for b in builds for p in b.job.inputs])
    results = []
    for built, manifest, digest in zip(builds, manifests, digests):
        built.job.timings["publish"] = time.perf_counter() - clock
        if built.job.stamp_source is not None:
            write_stamp(built.job.output_dir, built.job.names, built.job.stamp_source, digest.result())
        built.job.reporter.stage(f"wrote {built.job.output_dir / built.job.names.model}")
        results.append(built.job.result(built, manifest))
    return results


def stage_graph(step: EpStepOutput, staging_dir: Path, model: str, embed: str,
                staged: StagedNames | None = None) -> tuple[list[tuple[WrittenFile, str]], GraphSummary]:
    """Pass 2 into the stage: the graph proto written on its own, after the data files and the EP's blob files it
    names were renamed to their content-addressed names (hashed and synced). Only the blobs the graph names are
    outputs: anything else an EP left in the stage is not published. `staged`: a batch's, whose data files are shared."""
    from concurrent.futures import ThreadPoolExecutor

    from ortcompile.compile.graphpass import StagedNames, write_graph

    staged = staged or StagedNames(staging_dir, step.data_files)
    with ThreadPoolExecutor(max_workers=1) as pool:
        model_file, blobs, graph = write_graph(step.graph_proto, staging_dir, model, embed, pool, staged)
    data = [f for f in staged.data_files if f.name in graph.data_locations]
    return [(model_file, "model"), *((f, "data") for f in data), *((f, "ep_context") for f in blobs)], graph


@dataclass
class CheckOutcome:
    record: dict[str, Any]  # for the manifest (deterministic)
    report: dict[str, Any] | None  # for the result (--json): everything measured
    seconds: float = 0.0
    peak_rss_bytes: int = 0


def run_check(staged_model: Path, source: Path, request: EpRequest, ep_label: str, mode: str, precision: str, dims: dict[str, int],
              given: dict[str, Any], workers: Workers, reporter: Reporter, verify_criterion: dict[str, Any] | None = None) -> CheckOutcome:
    """The pre-publish check in the worker child: open the staged output on its EP (and run it against the
    source by verify's criterion); raise CompilationFailed when it would not load or not agree. With --verify
    (`verify_criterion`: its settings) outputs that differ are VerificationFailed (exit 5), as --verify's are."""
    from ortcompile.readback import check
    from ortcompile.readback.parity import run_parity

    if mode == "none":
        return CheckOutcome({"mode": "none", "passed": None}, None)
    clock = time.perf_counter()
    worker = workers.get()
    reporter.stage(f"checking {staged_model.name}: {'load and run' if mode == 'run' else 'load'} on {ep_label}")
    request_ = check.check_request(staged_model, source.absolute(), request, mode, precision, dims, given, verify_criterion)
    report = worker.call(run_parity, request_, doing=f"{'running' if mode == 'run' else 'loading'} the compiled {staged_model.name}")
    if not report.ok:
        detail = check.failure_detail(report)
        failed = (VerificationFailed(f"not published: {report.failure()}", detail=detail)  # the very verdict --verify gives
                  if verify_criterion is not None and report.exit_code == VerificationFailed.exit_code
                  else CompilationFailed(f"{source.name}: not published: {report.failure()}", detail=detail))
        failed.parity_report = report  # type: ignore[attr-defined]  # fallback.py localizes the divergence from it
        raise failed
    if report.warning:
        warnings.warn(f"{source.name}: {report.warning}", OrtCompileWarning, stacklevel=2)
    reporter.detail(check.describe_ok(report))
    return CheckOutcome(check.record(report, bool(given)), check.to_json(report), time.perf_counter() - clock, worker.peak_rss_bytes)


def _publish_order(builds: list[Built]) -> list[str]:
    """Data and blobs first, the models after them, the manifests last: a model never points at missing bytes."""
    rest = sorted({f.name for b in builds for f, role in b.files if role != "model"})
    return [*rest, *(b.job.names.model for b in builds), *(b.job.names.manifest for b in builds)]


def write_staged(path: Path, content: bytes) -> None:
    try:
        with open(path, "xb") as stream:
            stream.write(content)
            stream.flush()
            os.fsync(stream.fileno())
    except OSError as exc:
        raise output_error(exc, path.name) from exc


def node_counts(source_ops: dict[str, int], graph: GraphSummary) -> dict[str, Any]:
    """EPContext nodes hide which ops they replaced: record it as source ops minus remaining ops."""
    compiled = collections.Counter(source_ops)
    compiled.subtract(graph.remaining_ops)
    return {
        "epcontext": graph.epcontext_nodes,
        "compiled_ops": {op: n for op, n in sorted(compiled.items()) if n > 0},
        "remaining_ops": graph.remaining_ops,
    }


def versions(ep: eps.ResolvedEp) -> Versions:
    import onnxruntime as ort

    return Versions(__version__, ort.__version__, ep.name, ep.version)
