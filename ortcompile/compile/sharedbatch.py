"""A `--share-weights` batch built (sharing.py says what sharing does; driver.py opens each model's job first).

Passes 1 and 2 of every model into one staging directory: one data pass for all of them (shareddata.py: a tensor
whose bytes were written for an earlier model is referenced where it is) and one EP context (`ep.share_ep_contexts`,
the last model also `ep.stop_share_ep_contexts`) in one worker child; then each model's check (on its unshared twin
where this machine cannot load the shared context: twins.py) and one finish, which publishes the batch together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ortcompile.compile.compilejob import CompileJob
from ortcompile.compile.datapass import DataPass, FileSink
from ortcompile.compile.epstep import EpStep, EpStepOutput, run_ep_step, run_relayout
from ortcompile.compile.finish import Built, finish
from ortcompile.compile.graphpass import StagedNames
from ortcompile.compile.ortstep import NothingCompiled
from ortcompile.compile.partpool import CompileOne
from ortcompile.compile.shareddata import SharedDataPass
from ortcompile.compile.twins import checked_on_twins
from ortcompile.errors import UsageError, output_error
from ortcompile.layout import DataLayout
from ortcompile.naming import strip_onnx
from ortcompile.native import peak_rss_bytes
from ortcompile.options import CompileOptions, CompileResult
from ortcompile.output.digest import WrittenFile
from ortcompile.output.publish import Staging, remove_created_dirs
from ortcompile.progress import Reporter
from ortcompile.worker import Workers

# EPs whose outputs this machine cannot load even when they are right: QNN's x86 HTP simulator segfaults
# on a context shared by several models (measured with onnxruntime-qnn 2.7.0).
SHARED_CONTEXT_UNLOADABLE = {"QNNExecutionProvider": "QNN's HTP simulator cannot load shared EP contexts on this machine"}
SHARE_CONTEXTS = "ep.share_ep_contexts"
STOP_SHARING = "ep.stop_share_ep_contexts"
# Options the models of a batch may differ in: the pins (a batch's --fix-dim fits each model) and the inputs its
# check runs on (an LLM's prefill and decode graphs take different ones); neither changes how the EP compiles.
PER_MODEL = ("fix_dims", "fix_shapes", "inputs")


def batch_options(sources: Sequence[Path], chosen: Sequence[CompileOptions]) -> list[CompileOptions]:
    """Each model's options, for a shared blob (never embedded: it belongs to several models); one set but the pins
    and the check's inputs (PER_MODEL). Refused before anything is read: a batch of one, options that differ, --partition."""
    if len(sources) < 2:
        raise UsageError("--share-weights needs at least two models")
    first = chosen[0]
    for source, other in zip(sources[1:], chosen[1:]):
        differing = [f.name for f in dataclasses.fields(CompileOptions) if f.name not in PER_MODEL and getattr(other, f.name) != getattr(first, f.name)]
        if differing:
            raise UsageError(f"--share-weights compiles the batch with one set of options, but {source} gets other settings than "
                             f"{sources[0]} ({', '.join(differing)}); only the pins (fix-dim, fix-shape) and the check's inputs may differ")
    if any(o.partition is not None for o in chosen):  # a batch is compiled whole, as one unit: a part budget would be recorded, not applied
        raise UsageError("--share-weights compiles each model whole: it cannot be combined with --partition or --max-context-size")
    return [dataclasses.replace(o, embed="never", share_weights=True) for o in chosen]


def compile_batch(jobs: list[CompileJob], workers: Workers, compile_one: CompileOne) -> list[CompileResult]:
    """The batch of `jobs` (each model planned, in order) built, checked and published as one, with one worker child
    for all of them (`compile_one`: job.compile_model, what each model's unshared twin is compiled with, twins.py).
    A failure publishes nothing and removes the output directory the first model's plan created."""
    try:
        return _compile_planned(jobs, workers, compile_one)
    except BaseException:
        remove_created_dirs(jobs[0].created_dirs)
        raise


def _compile_planned(jobs: list[CompileJob], workers: Workers, compile_one: CompileOne) -> list[CompileResult]:
    models = [job.plan.names.model for job in jobs]
    if len(set(models)) != len(models):
        raise UsageError(f"--share-weights: two models would both be named {next(m for m in models if models.count(m) > 1)}")
    output_dir = jobs[0].plan.target.directory  # (one directory for the batch)
    workers.label = jobs[0].plan.worker_label
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortcompile-digest") as digester, Staging(output_dir) as staging:
        digests = [digester.submit(j.digest_inputs, j.plan.source.path.absolute(), j.plan.source.external_files) for j in jobs]
        try:
            builds = _build_batch(jobs, staging.path, workers)
        except OSError as exc:  # a staged write failed (the inputs were read and checked before): disk full, quota...
            raise output_error(exc, f"outputs in {output_dir}") from exc
        unchecked = SHARED_CONTEXT_UNLOADABLE.get(jobs[0].plan.ep.name) if jobs[0].plan.compiles else None
        if unchecked:
            workers.renew()  # the batch's worker may hold what the EP kept of both graphs: not beside a twin's compile
        checked = checked_on_twins(jobs, staging.path, unchecked, compile_one) if unchecked else None
        finished = finish(builds, staging, workers, digests, shared=_shared_names(builds), unchecked=unchecked, checked=checked)
        return [job.result(built, done) for job, built, done in zip(jobs, builds, finished)]


def _build_batch(jobs: list[CompileJob], staging_dir: Path, workers: Workers) -> list[Built]:
    """Passes 1 and 2 of every model into the stage: one data pass and one EP context for all of them."""
    shared_name = f"{strip_onnx(jobs[0].plan.source.path.name)}_shared"
    steps = [job.step(staging_dir, _sharing_config(job, last=(i == len(jobs) - 1))) for i, job in enumerate(jobs)]
    if jobs[0].plan.compiles:  # one child for the whole batch: the EP shares its context within one process
        worker = workers.get()
        try:
            outputs, data_files, reused = worker.call(run_shared_steps, steps, shared_name, doing="compiling the batch")
        except NothingCompiled as exc:
            job = next((j for j in jobs if j.plan.source.path.name == exc.model), jobs[0])
            raise job.explain_nothing_compiled(exc) from exc
        peak = worker.peak_rss_bytes
    else:
        outputs, data_files, reused = run_shared_steps(steps, shared_name, jobs[0].reporter)
        peak = peak_rss_bytes()
    for job, output in zip(jobs, outputs):  # each model's own pass-1 time; the batch's one peak (the child compiled them all)
        job.timings.update(output.seconds)
        job.peaks["compile"] = peak
    # Every model's graph pass comes after the last compile: the shared EP context is complete by then.
    staged = StagedNames(staging_dir, data_files)
    builds = [job.graph_pass(staging_dir, out, workers, embed="never", staged=staged) for job, out in zip(jobs, outputs)]
    for line in _what_is_shared(builds, reused):
        jobs[0].reporter.detail(line)
    return builds


def _what_is_shared(builds: list[Built], reused: int) -> list[str]:
    """-v's account of what the batch stores once: the EP context several models name (QNN keeps the weights in it,
    so its models leave no data file to share) and the data-file bytes deduplicated across models."""
    users: dict[str, tuple[int, int]] = {}  # ep_context file -> (size, models naming it)
    for built in builds:
        for written, role in built.files:
            if role == "ep_context":
                users[written.name] = (written.size, users.get(written.name, (0, 0))[1] + 1)
    lines = [f"shared EP context: {name}, {size} bytes, one file for {count} models instead of one each"
             for name, (size, count) in sorted(users.items()) if count > 1]
    if reused or not lines:
        lines.append(f"shared weights: {reused} bytes stored once instead of again")
    return lines


def _sharing_config(job: CompileJob, last: bool) -> dict[str, str]:
    if not job.plan.compiles:
        return {}
    return {SHARE_CONTEXTS: "1", **({STOP_SHARING: "1"} if last else {})}


def run_shared_steps(steps: list[EpStep], shared_name: str, reporter: Reporter) -> tuple[list[EpStepOutput], list[WrittenFile], int]:
    """Pass 1 for every model of the batch through one SharedDataPass (in the worker child for compiling EPs)."""
    first = steps[0]
    shared = SharedDataPass(FileSink(first.staging_dir), shared_name, DataLayout(first.layout))
    try:
        compiles = first.ep.resolve().info.compiles
        outputs = [run_ep_step(step, reporter, shared) if compiles else run_relayout(step, reporter, shared) for step in steps]
    except BaseException:
        DataPass.abandon(shared)
        raise
    return outputs, shared.close(), shared.reused_bytes


def _shared_names(builds: list[Built]) -> set[str]:
    """The files several models of the batch reference (each model's files are those its graph names)."""
    users: dict[str, int] = {}
    for built in builds:
        for written, role in built.files:
            if role != "model":
                users[written.name] = users.get(written.name, 0) + 1
    return {name for name, count in users.items() if count > 1}
