"""The compile job: plan -> pass 1 (EP step) -> pass 2 (graph) -> finish (check, manifest, verify, publish, stamp).

Usable from Python without click:

    from ortcompile import compile_model, CompileOptions
    result = compile_model("model.onnx", "build/", CompileOptions(ep="qnn", fix_dims={"batch": 1}))

`CompileJob.plan` does every check that can fail before work starts; `build` runs the two passes into a
staging directory (pass 1 in the worker child for EPs that compile); `finish` is shared with the
weight-sharing batch: nothing reaches the output directory unless every step before publishing passed.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile import eps
from ortcompile.compile.epstep import EpRequest, EpStep, EpStepOutput, ep_starts, run_ep_step, run_relayout
from ortcompile.compile.finish import Built, finish, node_counts, open_destination, run_check, stage_graph, versions
from ortcompile.compile.graphpass import StagedNames
from ortcompile.compile.ortstep import NothingCompiled
from ortcompile.errors import CompilationFailed, OrtCompileError, OrtCompileWarning, UsageError, output_error
from ortcompile.naming import OutputNames
from ortcompile.native import native_output_shown, peak_rss_bytes
from ortcompile.options import AUTO_RUN_LIMIT, CompileOptions, CompileResult, effective_check
from ortcompile.output.digest import InputDigest, digest_inputs_in_background
from ortcompile.output.incremental import why_not_up_to_date
from ortcompile.output.manifest import Manifest, file_entries
from ortcompile.output.publish import Staging, remove_created_dirs
from ortcompile.plan.shapes import Pins, dynamic_inputs_hint, require_static, resolve_pins
from ortcompile.plan.source import SourceModel, read_source
from ortcompile.progress import Reporter, SilentReporter
from ortcompile.worker import Worker, expect_more_workers, fresh_worker, retire_worker

# Ops that mark a quantized model (QDQ format, or integer compute): an NPU runs these in integers.
QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger",
                 "DynamicQuantizeLinear"}

# EPs whose outputs this machine cannot load even when they are right: QNN's x86 HTP simulator segfaults
# on a context shared by several models (measured with onnxruntime-qnn 2.7.0).
SHARED_CONTEXT_UNLOADABLE = {"QNNExecutionProvider": "QNN's HTP simulator cannot load shared EP contexts on this machine"}


def compile_model(
    source_path: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    options: CompileOptions | None = None,
    reporter: Reporter | None = None,
) -> CompileResult:
    """Compile one model into `output_dir` atomically; raise an OrtCompileError subclass on failure."""
    options, reporter = options or CompileOptions(), reporter or SilentReporter()
    if options.if_changed:
        current = _current_output(Path(source_path), Path(output_dir), options, reporter)
        if current is not None:
            return current
        options = dataclasses.replace(options, force=True)  # --if-changed may replace its own stale output
    with Workers(native_output_shown(), reporter) as workers:
        if options.partition is None:  # (parts get workers of their own; this one would idle through them)
            workers.start()  # its imports overlap with reading the model and resolving the EP
        job = CompileJob.plan(Path(source_path), Path(output_dir), options, reporter)
        return job.run(workers)


def compile_models(models: list[str | os.PathLike[str]], output_dir: str | os.PathLike[str],
                   options: CompileOptions | Callable[[str | os.PathLike[str]], CompileOptions] | None = None,
                   reporter: Reporter | None = None) -> list[CompileResult]:
    """Compile each model into `output_dir`, one after another; stop at the first failure, naming the model.

    `options` is one CompileOptions for every model, or a function giving each model its own (a config file's
    per-model settings, see ortcompile/config.py). Each compile is self-contained: an EP that compiles runs in
    its own worker child, so a batch gives the bytes of single runs and peaks at its largest model, not at the sum.
    """
    options_for = options if callable(options) else (lambda model: options)
    per_model = [options_for(m) for m in models]
    named = next((o.output_name for o in per_model if o and o.output_name), None)
    if named and len(models) > 1:
        raise UsageError(f"-o {named} names one compiled model; give a directory (-o DIR/) for {len(models)} models")
    targets = [OutputNames.for_compile(Path(m), o.output_name if o else None).model for m, o in zip(models, per_model)]
    clash = next((t for t in targets if targets.count(t) > 1), None)
    if clash is not None:
        raise UsageError(f"two models would both be compiled to {clash} in one directory; rename one or use two -o")
    results = []
    for index, model in enumerate(models):
        if index < len(models) - 1:
            expect_more_workers()
        try:
            results.append(compile_model(model, output_dir, per_model[index], reporter))
        except OrtCompileError as exc:
            if len(models) > 1 and str(model) not in exc.message:
                exc.message = f"{model}: {exc.message}"  # in a batch, say which model failed
            raise
    return results


def _current_output(source: Path, output_dir: Path, options: CompileOptions, reporter: Reporter) -> CompileResult | None:
    """The published result when it is up to date (checked without loading onnx or onnxruntime)."""
    clock = time.perf_counter()
    reason = why_not_up_to_date(source, output_dir, options)
    if reason:
        reporter.detail(f"{source.name}: rebuilding: {reason}")
        return None
    manifest = Manifest.load(output_dir / OutputNames.for_compile(source, options.output_name).manifest)
    reporter.stage(f"{output_dir / manifest.model} is up to date")
    return CompileResult.from_manifest(source, output_dir, manifest, time.perf_counter() - clock, peak_rss_bytes())


@dataclass
class CompileJob:
    """One model's compile: everything decided up front, then run into a staging directory."""

    source: SourceModel
    ep: eps.ResolvedEp
    request: EpRequest
    output_dir: Path
    names: OutputNames
    options: CompileOptions
    pins: Pins
    require_compiled: bool
    reporter: Reporter
    created_dirs: list[Path] = field(default_factory=list)  # by prepare_output_dir: removed again on failure
    timings: dict[str, float] = field(default_factory=dict)
    peaks: dict[str, int] = field(default_factory=dict)  # peak RSS by stage: compile, check
    check_report: dict[str, Any] | None = None  # the pre-publish check's full report, for the result

    @classmethod
    def plan(cls, source_path: Path, output_dir: Path, options: CompileOptions, reporter: Reporter) -> CompileJob:
        """Every check that can fail before work starts: input, EP, shapes, destination."""
        clock = time.perf_counter()
        reporter.stage("reading model")
        source, ep, pins, require = plan_source(source_path, options)
        names = OutputNames.for_compile(source.path, options.output_name)
        created = open_destination(output_dir, names, options.force, [source.path, *source.external_files], reporter)
        reporter.detail(f"{source.path.name}: {len(source.initializers)} initializers, {source.weight_bytes} bytes of weights; "
                        f"EP {ep.name} {ep.version}")
        job = cls(source, ep, ep_request(options), output_dir, names, options, pins, require, reporter, created)
        job.timings["read"] = time.perf_counter() - clock
        return job

    @property
    def compiles(self) -> bool:
        return self.ep.info.compiles

    @property
    def inputs(self) -> list[Path]:
        return [self.source.path, *self.source.external_files]

    @property
    def stamp_source(self) -> Path:
        return self.source.path

    @property
    def worker_label(self) -> str:
        """Who a crash in the worker child is blamed on."""
        return f"the {self.ep.info.short_name} EP" if self.compiles else "ONNX Runtime"

    def run(self, workers: Workers) -> CompileResult:
        digester = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortcompile-digest")
        workers.label = self.worker_label
        try:
            digest = digester.submit(digest_inputs_in_background, self.source.path.absolute(), self.source.external_files)
            with Staging(self.output_dir) as staging:
                built = self.build(staging.path, workers)
                return finish([built], staging, workers, [digest])[0]
        except BaseException:
            remove_created_dirs(self.created_dirs)  # a failed run leaves no empty output directory behind
            raise
        finally:
            digester.shutdown(wait=False, cancel_futures=True)  # on Ctrl-C, do not wait for a hash of gigabytes

    def step(self, staging_dir: Path, session_config: dict[str, str] | None = None) -> EpStep:
        return EpStep(self.source, self.request, staging_dir, self.names.model, self.options.layout, self.pins,
                      self.compiles and self.options.prepare, self.require_compiled, session_config or {}, dict(self.options.freeze))

    def build(self, staging_dir: Path, workers: Workers) -> Built:
        """Passes 1 and 2 into the staging directory (--partition: split, compile the parts, stitch)."""
        try:
            if self.options.partition is not None:
                from ortcompile.compile.parts import partitioned_build

                return partitioned_build(self, staging_dir)
            return self.graph_pass(staging_dir, self.ep_step(self.step(staging_dir), workers), workers)
        except OSError as exc:  # a staged write failed (the input was read and checked before): disk full, quota...
            raise output_error(exc, f"outputs in {self.output_dir}") from exc
        finally:
            self.reporter.close()

    def ep_step(self, step: EpStep, workers: Workers) -> EpStepOutput:
        """Pass 1: the EP's compile in the worker child, or the re-layout here for EPs that compile nothing."""
        clock = time.perf_counter()
        if not self.compiles:
            output = run_relayout(step, self.reporter)
            self.peaks["compile"] = peak_rss_bytes()
        else:
            worker = workers.get()
            try:
                output = worker.call(run_ep_step, step, doing=f"compiling {self.source.path.name}")
            except NothingCompiled as exc:
                raise self.explain_nothing_compiled(exc) from exc
            self.peaks["compile"] = worker.peak_rss_bytes
        self.timings.update(output.seconds)
        self.timings["compile"] = time.perf_counter() - clock  # the whole pass 1, prepare included
        return output

    def explain_nothing_compiled(self, exc: NothingCompiled) -> CompilationFailed:
        """Say why nothing compiled: dynamic shapes, an EP that cannot start, or ops the EP does not take."""
        short = self.ep.info.short_name
        hint = dynamic_inputs_hint(self.source, self.pins.named) if not self.options.prepare else ""
        if hint:
            return CompilationFailed(f"{short}: the EP compiled no nodes{hint}; or pass --allow-partial", exc.detail)
        if exc.ep_starts is False:
            return CompilationFailed(f"{short}: the EP compiled nothing, not even a one-node test model: it failed to start "
                                     "with these options (check --ep-option values; -v shows its log)", exc.detail)
        return CompilationFailed(f"{short}: the EP took none of this model's nodes; pass --allow-partial to publish it for the CPU EP", exc.detail)

    def graph_pass(self, staging_dir: Path, step: EpStepOutput, workers: Workers, embed: str | None = None,
                   staged: StagedNames | None = None) -> Built:
        """Pass 2: the small graph proto, finished and written on its own, naming its files by content (`staged`: a
        batch's shared files)."""
        clock = time.perf_counter()
        self.reporter.stage("writing graph")
        files, graph = stage_graph(step, staging_dir, self.names.model, embed or self.options.embed, staged)
        if self.compiles and graph.epcontext_nodes == 0:
            starts = None if self.require_compiled else workers.get().call(ep_starts, self.request, doing="starting the EP on a one-node model")
            if self.require_compiled or not starts:
                raise self.explain_nothing_compiled(NothingCompiled("nothing compiled", ep_starts=starts))
            warnings.warn(f"{self.source.path.name}: {self.ep.info.short_name} compiled no nodes (--allow-partial): "
                          "the output runs entirely on the CPU EP", OrtCompileWarning, stacklevel=2)
        self.timings["graph_pass"] = time.perf_counter() - clock
        return Built(self, files, graph, step)

    # ---------------------------------------------------------------- finishing (single model and batches)

    def check(self, staging_dir: Path, workers: Workers) -> dict[str, Any]:
        """The pre-publish check in the worker child; raise when the output would not load or run."""
        mode = effective_check(self.options.check, self.source.weight_bytes)
        if mode != self.options.check and self.options.check != "none":
            self.reporter.detail(f"check: load only: {self.source.weight_bytes >> 20} MiB of weights (--check auto runs up to "
                                 f"{AUTO_RUN_LIMIT >> 20} MiB; --check run to run anyway)")
        outcome = run_check(staging_dir / self.names.model, self.source.path, self.request, self.ep.info.short_name, mode,
                            ep_precision(self.ep, self.source), self.pins.named, self.given_inputs(), workers, self.reporter,
                            self.options.verify_criterion if self.options.verify else None)
        if outcome.report is not None:
            self.timings["check"], self.peaks["check"], self.check_report = outcome.seconds, outcome.peak_rss_bytes, outcome.report
        return outcome.record

    def given_inputs(self) -> dict[str, Any]:
        return given_inputs(self.options)

    def manifest(self, built: Built, digest: InputDigest, check: dict[str, Any] | None, shared: set[str] | None = None) -> Manifest:
        prepare = built.step.prepare.to_record() if built.step.prepare is not None else None
        return Manifest(
            model=self.names.model,
            files=file_entries(built.files, shared),
            input_sha256=digest.combined,
            input_files=digest.input_files,
            versions=versions(self.ep),
            options=self.options.recorded(self.ep.info.short_name, self.require_compiled, self.compiles),
            nodes=node_counts(self.source.op_counts, built.graph),
            initializers={"external": built.step.external_count, "inline": built.step.inline_count},
            prepare=prepare,
            check=check,
            target=self.ep.target_record(),
        )

    def verify(self, model: Path) -> None:
        """Run `verify` on the staged output: a model that computes the wrong thing is never published."""
        from ortcompile.readback.verify import verify_model  # numpy and sessions: only when asked

        self.reporter.stage("verifying against the source")
        clock = time.perf_counter()
        report = verify_model(model, self.source.path, dims=self.pins.named, inputs=self.given_inputs(), time_source=False,
                              **self.options.verify_criterion)
        if not report.ok:
            error = report.exception()
            raise type(error)(f"not published: {error.message}")
        worst = max((o["max_abs"] or 0.0 for run in report.runs for o in run["outputs"]), default=0.0)
        self.reporter.detail(f"verified: outputs match the source on the CPU EP (max abs diff {worst:.3g}; {report.criterion.kind})")
        self.timings["verify"] = time.perf_counter() - clock

    def result(self, built: Built, manifest: Manifest) -> CompileResult:
        compatibility = self.compatibility()
        return CompileResult(
            source=self.source.path,
            output_dir=self.output_dir,
            model=self.names.model,
            ep=self.ep.name,
            ep_version=self.ep.version,
            files=[f.to_json() for f in manifest.files],
            epcontext_nodes=built.graph.epcontext_nodes,
            remaining_ops=built.graph.remaining_ops,
            graph_bytes=built.graph.graph_bytes,
            external_initializers=built.step.external_count,
            inline_initializers=built.step.inline_count,
            timings=self.timings,
            peak_rss_bytes=max(peak_rss_bytes(), self.peaks.get("compile", 0)),
            inputs=[self.source.path, *(self.source.path.parent / location for location in self.source.external_locations)],
            peak_rss_by_stage=dict(self.peaks),
            prepare=dataclasses.asdict(built.step.prepare) if built.step.prepare is not None else None,
            check=self.check_report,
            compiled_ops=manifest.nodes.get("compiled_ops", {}),
            target=manifest.target,
            compatibility=compatibility,
        )

    def compatibility(self) -> dict[str, Any] | None:
        """ONNX Runtime's verdict on the published model here (each EP asked in a child: QNN's check crashes a process
        that compiled). None unless asked (options.compatibility: the CLI's --json), and for a library given with
        --ep-library, which the child cannot find by name."""
        from ortcompile.eps.compat import check_compatibility

        if self.options.ep_library or not self.options.compatibility:
            return None
        clock = time.perf_counter()
        report = check_compatibility(self.output_dir / self.names.model).to_json()
        self.timings["compatibility"] = time.perf_counter() - clock
        return report


def plan_source(source_path: Path, options: CompileOptions) -> tuple[SourceModel, eps.ResolvedEp, Pins, bool]:
    """Read and check the source against the options: the model, its EP, the pinned dims, whether the EP must compile."""
    source = read_source(source_path)
    ep = eps.resolve(options.ep, options.ep_options, target=options.target, library=options.ep_library, validate=True)
    prepares = ep.info.compiles and options.prepare
    # Pins go into the graph (the prepare step, or the pass-through's re-layout); only a compiling EP without
    # the prepare step falls back to ORT's free-dimension overrides, which reach named dims only.
    pins = resolve_pins(source, options.fix_dims, options.fix_shapes, allow_unnamed=prepares or not ep.info.compiles)
    if options.freeze and ep.info.compiles and not options.prepare:
        raise UsageError("--freeze specializes the model in the prepare step: drop --no-prepare")
    if ep.info.compiles and _needs_static_shapes(ep):
        require_static(source, pins, ep.info.short_name, frozen=set(options.freeze))
    require = ep.info.compiles if options.require_compiled is None else options.require_compiled
    _warn_oversized_for_shards(source, options.layout.shard_size)
    return source, ep, pins, require


def _warn_oversized_for_shards(source: SourceModel, shard_size: int | None) -> None:
    """A tensor never straddles data files: one larger than --shard-size gets a file of its own, over the size."""
    oversized = [t for t in source.tensors if shard_size and t.nbytes > shard_size]
    if oversized:
        largest = max(oversized, key=lambda t: t.nbytes)
        warnings.warn(f"--shard-size {shard_size}: {len(oversized)} tensor{'s are' if len(oversized) > 1 else ' is'} larger "
                      f"(largest {largest.name!r}, {largest.nbytes} bytes) and get a data file of their own, over that size",
                      OrtCompileWarning, stacklevel=3)


def given_inputs(options: CompileOptions) -> dict[str, Any]:
    """What the check and --verify feed: the user's inputs, and every frozen input at its frozen value (the
    compiled model ignores it; the source must get the same value to compute the same thing)."""
    from ortcompile.readback.given import Given

    return {**{name: Given(value, f"--freeze {name}={value}") for name, value in options.freeze.items()}, **options.inputs}


def ep_request(options: CompileOptions) -> EpRequest:
    return EpRequest(options.ep, options.ep_options, options.target, options.ep_library)


class Workers:
    """The worker child of a compile (or of a batch that must share one): started early, or when first needed."""

    def __init__(self, verbose: bool, reporter: Reporter, label: str = "the EP") -> None:
        self.verbose, self.reporter, self.label = verbose, reporter, label
        self._worker: Worker | None = None

    def start(self) -> None:
        if self._worker is None:
            self._worker = fresh_worker(self.label, self.reporter, self.verbose)

    def get(self) -> Worker:
        self.start()
        assert self._worker is not None
        self._worker.label = self.label
        return self._worker

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._worker is not None:
            self._worker.__exit__(*exc_info)
            retire_worker(self.verbose)


def ep_precision(ep: eps.ResolvedEp, source: SourceModel | None = None, *, op_counts: dict[str, int] | None = None) -> str:
    """The precision the EP computes in, which decides how its outputs are judged: the catalog's, except that a
    quantized (QDQ / integer-op) model on an EP that does not compute in fp32 is judged as quantized."""
    precision = ep.info.precision or "fp32"
    ops = op_counts if op_counts is not None else (source.op_counts if source is not None else {})
    if precision != "fp32" and ops.keys() & QUANTIZED_OPS:
        return "quantized"
    return precision


def _needs_static_shapes(ep: eps.ResolvedEp) -> bool:
    return bool(ep.info.static_shapes)
