"""One model's compile job: plan -> pass 1 (EP step) -> pass 2 (graph) -> finish (check, manifest, verify, publish).

`plan_compile` (plan/planner.py) makes every decision that can fail before work starts, as one frozen
`CompilePlan`; `CompileJob` drives the passes from it into a staging directory (pass 1 in the worker child
for EPs that compile; `--partition`: parts.py) and hands what they built to `finish`, which works from data:
nothing reaches the output directory unless every step before publishing passed. Opened by driver.py, which
runs it alone (`CompileJob.run`) or hands it to a `--share-weights` batch (sharedbatch.py) with the others.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile.compile.cpunodes import cpu_placement
from ortcompile.compile.defaults import constants_warning
from ortcompile.compile.epstep import EpStep, EpStepOutput, ep_starts, run_ep_step, run_relayout
from ortcompile.compile.fallback import FallbackState, run_rounds
from ortcompile.compile.finish import Built, Finished, FinishPlan, ManifestPlan, finish, open_destination, stage_graph, versions
from ortcompile.compile.fragmentation import judge_fragmentation
from ortcompile.compile.graphpass import StagedNames
from ortcompile.compile.ortstep import NothingCompiled
from ortcompile.compile.parts import partitioned_stitch
from ortcompile.eps.compat import check_compatibility
from ortcompile.eps.request import EpRequest
from ortcompile.errors import CompilationFailed, OrtCompileWarning, output_error
from ortcompile.jsonedge import JsonObject
from ortcompile.naming import OutputTarget
from ortcompile.native import peak_rss_bytes
from ortcompile.options import CompileOptions, CompileResult
from ortcompile.output.digest import InputDigest, digest_inputs, digest_inputs_in_background
from ortcompile.output.publish import Staging, remove_created_dirs
from ortcompile.plan.planner import CompilePlan, plan_compile
from ortcompile.plan.shapes import dynamic_inputs_hint
from ortcompile.progress import Reporter
from ortcompile.worker import Workers

# ORT's layout transformer (NHWC for QNN and the other layout-sensitive EPs) refuses older models:
# "QNNExecutionProvider cannot be used with this model due to its ONNX opset not being supported by the layout transformer"
MIN_LAYOUT_OPSET = 7


@dataclass
class CompileJob:
    """One model's compile, driven from its frozen plan: the passes into a staging directory, then finish."""

    plan: CompilePlan
    reporter: Reporter
    created_dirs: list[Path] = field(default_factory=list)  # by prepare_output_dir: removed again on failure
    timings: dict[str, float] = field(default_factory=dict)
    peaks: dict[str, int] = field(default_factory=dict)  # peak RSS by stage: compile, check
    fallback: FallbackState | None = None  # --cpu-nodes / --fallback: what runs on the CPU EP and why (fallback.py)
    request_override: EpRequest | None = None  # fallback.py: the plan's request with the pinned nodes kept off the EP

    @property
    def request(self) -> EpRequest:
        return self.request_override or self.plan.request

    @classmethod
    def open(cls, source_path: Path, target: OutputTarget, options: CompileOptions, reporter: Reporter) -> CompileJob:
        """The plan (every check that can fail before work starts: input, EP, shapes), then the destination."""
        clock = time.perf_counter()
        reporter.stage("reading model")
        plan = plan_compile(source_path, target, options)
        created = open_destination(plan.target, options.force, plan.inputs, reporter)
        reporter.detail(f"{plan.source.path.name}: {len(plan.source.initializers)} initializers, {plan.source.weight_bytes} bytes of weights; "
                        f"EP {plan.ep.name} {plan.ep.version}")
        job = cls(plan, reporter, created)
        job.timings["read"] = time.perf_counter() - clock
        return job

    def run(self, workers: Workers, compile_part: Callable[..., CompileResult]) -> CompileResult:
        plan = self.plan
        digester = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortcompile-digest")
        workers.label = plan.worker_label
        try:
            digest = digester.submit(self.digest_inputs, plan.source.path.absolute(), plan.source.external_files)
            if plan.options.partition is not None and not plan.options.cpu_nodes:  # split, compile the parts, stitch: the stitch is what finish publishes
                with Staging(plan.output_dir) as staging:
                    stitch = self._guarded(lambda: partitioned_stitch(plan, staging.path, self.reporter, self.timings, self.created_dirs, compile_part))
                    built = self._guarded(lambda: stitch.build(staging.path))
                    return stitch.result(built, finish([built], staging, workers, [digest])[0])
            return run_rounds(self, workers, digest, compile_part)  # build -> finish, again with nodes moved off the EP (--fallback auto)
        except BaseException:
            remove_created_dirs(self.created_dirs)  # a failed run leaves no empty output directory behind
            raise
        finally:
            digester.shutdown(wait=False, cancel_futures=True)  # on Ctrl-C, do not wait for a hash of gigabytes

    @property
    def digest_inputs(self) -> Callable[[Path, tuple[Path, ...]], InputDigest]:
        """The inputs' sha256 beside the passes: at idle priority while an EP compiles in the worker (it fills the gaps),
        at normal priority when the passes are this process's own data pass (pass-through): finish waits for both, so
        on two cores the two hashes share them instead of the input's finishing alone after the copy (measured in
        docs/performance.md)."""
        in_process = not self.plan.compiles and self.plan.options.partition is None
        return digest_inputs if in_process else digest_inputs_in_background

    def _guarded(self, build: Callable[[], Any]) -> Any:
        """Passes 1 and 2 into the staging directory: a staged write that fails is an output problem."""
        try:
            return build()
        except OSError as exc:  # a staged write failed (the input was read and checked before): disk full, quota...
            raise output_error(exc, f"outputs in {self.plan.output_dir}") from exc
        finally:
            self.reporter.close()

    def build(self, staging_dir: Path, workers: Workers) -> Built:
        """Passes 1 and 2 into the staging directory (one round of fallback.run_rounds)."""
        return self._guarded(lambda: self.graph_pass(staging_dir, self.ep_step(self.step(staging_dir), workers), workers))

    def step(self, staging_dir: Path, session_config: dict[str, str] | None = None) -> EpStep:
        plan = self.plan
        # Absolute here: the worker child resolves nothing against a working directory (it may have started in
        # another one, as a warm spare, and ORT's compile runs from the model's own directory).
        source = dataclasses.replace(plan.source, path=plan.source.path.absolute())
        return EpStep(source, self.request, staging_dir.absolute(), plan.names.model, plan.options.layout, plan.pins,
                      plan.compiles and plan.options.prepare, plan.require_compiled, session_config or {}, dict(plan.options.freeze))

    def ep_step(self, step: EpStep, workers: Workers) -> EpStepOutput:
        """Pass 1: the EP's compile in the worker child, or the re-layout here for EPs that compile nothing."""
        clock = time.perf_counter()
        if not self.plan.compiles:
            output = run_relayout(step, self.reporter)
            self.peaks["compile"] = peak_rss_bytes()
        else:
            worker = workers.get()
            try:
                output = worker.call(run_ep_step, step, doing=f"compiling {self.plan.source.path.name}")
            except NothingCompiled as exc:
                raise self.explain_nothing_compiled(exc) from exc
            self.peaks["compile"] = worker.peak_rss_bytes
        self.timings.update(output.seconds)
        self.timings["compile"] = time.perf_counter() - clock  # the whole pass 1, prepare included
        return output

    def explain_nothing_compiled(self, exc: NothingCompiled) -> CompilationFailed:
        """Say why nothing compiled: dynamic shapes, an EP that cannot start, or ops the EP does not take."""
        plan = self.plan
        short = plan.ep.info.short_name
        hint = dynamic_inputs_hint(plan.source, plan.pins.named) if not plan.options.prepare else ""
        if hint:
            return CompilationFailed(f"{short}: the EP compiled no nodes{hint}; or pass --allow-partial", exc.detail)
        if exc.ep_starts is False:
            return CompilationFailed(f"{short}: the EP compiled nothing, not even a one-node test model: it failed to start "
                                     "with these options (check --ep-option values; -v shows its log)", exc.detail)
        if plan.source.opset is not None and plan.source.opset < MIN_LAYOUT_OPSET:
            return CompilationFailed(f"{short}: the EP took none of this model's nodes: the model is opset {plan.source.opset}, and ONNX "
                                     f"Runtime supports opset {MIN_LAYOUT_OPSET} and above (EPs that change the layout, like QNN, refuse "
                                     "older models); convert it (onnx.version_converter.convert_version(model, 17)), or pass "
                                     "--allow-partial to publish it for the CPU EP", exc.detail)
        floats = [i for i in plan.source.inputs if i.dtype in ("FLOAT", "FLOAT16", "BFLOAT16", "DOUBLE")]
        if floats and all(i.dtype == "DOUBLE" for i in floats):
            names = f"input{'s' if len(floats) > 1 else ''} {', '.join(i.name for i in floats)}"
            return CompilationFailed(f"{short}: the EP took none of this model's nodes: the model computes in float64 ({names}), which "
                                     f"{short} does not take; export or convert it to float32, or pass --allow-partial to publish it for "
                                     "the CPU EP", exc.detail)
        return CompilationFailed(f"{short}: the EP took none of this model's nodes; pass --allow-partial to publish it for the CPU EP", exc.detail)

    def graph_pass(self, staging_dir: Path, step: EpStepOutput, workers: Workers, embed: str | None = None,
                   staged: StagedNames | None = None) -> Built:
        """Pass 2: the small graph proto, finished and written on its own, naming its files by content (`staged`: a
        batch's shared files)."""
        plan = self.plan
        clock = time.perf_counter()
        self.reporter.stage("writing graph")
        files, graph = stage_graph(step, staging_dir, plan.names.model, embed or plan.options.embed, staged)
        if plan.compiles and graph.epcontext_nodes == 0:
            starts = None if plan.require_compiled else workers.get().call(ep_starts, plan.request, doing="starting the EP on a one-node model")
            if plan.require_compiled or not starts:
                raise self.explain_nothing_compiled(NothingCompiled("nothing compiled", ep_starts=starts))
            warnings.warn(f"{plan.source.path.name}: {plan.ep.info.short_name} compiled no nodes (--allow-partial): "
                          "the output runs entirely on the CPU EP", OrtCompileWarning, stacklevel=2)
        if plan.compiles:
            pinned = frozenset(self.fallback.pins.op_types) if self.fallback is not None else frozenset()
            judge_fragmentation(step.graph_proto, plan.source.path.name, plan.ep.info.short_name, plan.ep.name, plan.options.prepare,
                                plan.options.require_full, pinned)
        if step.prepare is not None and step.prepare.constants:
            warnings.warn(constants_warning(plan.source.path.name, step.prepare.constants), OrtCompileWarning, stacklevel=2)
        if self.fallback is not None and self.fallback.pins:  # what now runs on the CPU EP, for the manifest's cpu_nodes
            self.fallback.placement = cpu_placement(staging_dir / plan.names.model)
        self.timings["graph_pass"] = time.perf_counter() - clock
        return Built(self.finish_plan(), files, graph, step)

    def finish_plan(self) -> FinishPlan:
        """What finish needs of this compile, as data."""
        plan = self.plan
        cpu_nodes = self.fallback.record(None) if self.fallback else None  # (finish adds the check's worst SNR after)
        record = ManifestPlan(versions(plan.ep), plan.recorded_options(), plan.source.op_counts, plan.ep.target_record(), cpu_nodes=cpu_nodes)
        return FinishPlan(plan.target, plan.inputs, plan.options.force, plan.check, plan.verify,
                          record, self.reporter)

    def result(self, built: Built, finished: Finished) -> CompileResult:
        plan, manifest, check = self.plan, finished.manifest, finished.check
        if check.report is not None:
            self.timings["check"], self.peaks["check"] = check.seconds, check.peak_rss_bytes
        self.timings.update(finished.timings)
        compatibility = self.compatibility()
        return CompileResult(
            source=plan.source.path,
            output_dir=plan.output_dir,
            model=plan.names.model,
            ep=plan.ep.name,
            ep_version=plan.ep.version,
            files=[f.to_json() for f in manifest.files],
            epcontext_nodes=built.graph.epcontext_nodes,
            remaining_ops=built.graph.remaining_ops,
            graph_bytes=built.graph.graph_bytes,
            external_initializers=built.step.external_count,
            inline_initializers=built.step.inline_count,
            timings=self.timings,
            peak_rss_bytes=max(peak_rss_bytes(), self.peaks.get("compile", 0)),
            inputs=[plan.source.path, *(plan.source.path.parent / location for location in plan.source.external_locations)],
            peak_rss_by_stage=dict(self.peaks),
            prepare=dataclasses.asdict(built.step.prepare) if built.step.prepare is not None else None,
            check=check.report,
            compiled_ops=manifest.nodes.compiled_ops or {},
            target=manifest.target,
            compatibility=compatibility,
            fallback=self.fallback.to_result(check.report) if self.fallback else None,
        )

    def compatibility(self) -> JsonObject | None:
        """ONNX Runtime's verdict on the published model here (each EP asked in a child: QNN's check crashes a process
        that compiled; from the command line a fork of this one, whose EP work ran in worker children). None unless
        asked (options.compatibility: the CLI's --json), and for a library given with --ep-library, which the child
        cannot find by name."""
        options = self.plan.options
        if options.ep_library or not options.compatibility:
            return None
        clock = time.perf_counter()
        report = check_compatibility(self.plan.target.model_path, fork=True).to_json()  # (this process only planned)
        self.timings["compatibility"] = time.perf_counter() - clock
        return report
