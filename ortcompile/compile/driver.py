"""The compile driver: the one way from the entry points (job.py) into the compile pipeline.

What it compiles is a unit: one model, or a `--share-weights` batch, which is built and published as one. Every model
of the unit is planned and its output directory opened first (`CompileJob.open`, in order); then the one model runs
alone (`CompileJob.run`: its passes, fallback rounds or --partition's parts, then finish) or the batch is built as one
(sharedbatch.py). `compile_one` is job.compile_model, handed in so that nothing here imports the entry points back:
what --partition compiles each part with, and a batch each model's unshared twin.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ortcompile.compile.compilejob import CompileJob
from ortcompile.compile.partpool import CompileOne
from ortcompile.compile.sharedbatch import batch_options, compile_batch
from ortcompile.naming import OutputTarget
from ortcompile.native import native_output_shown
from ortcompile.options import CompileOptions, CompileResult
from ortcompile.output.publish import remove_created_dirs
from ortcompile.progress import Reporter
from ortcompile.worker import Workers, expect_more_workers


def compile_now(sources: Sequence[Path], targets: Sequence[OutputTarget], options: Sequence[CompileOptions], reporter: Reporter,
                compile_one: CompileOne, shared: bool = False, more_follow: bool = False) -> list[CompileResult]:
    """Compile one unit, each source into its target with its options: one model with a worker child of its own, or
    (`shared`) a weight-sharing batch with one for all of them. `more_follow`: a batch of single models has models left."""
    if shared:
        options = batch_options(sources, options)  # what a batch cannot be is refused before anything is read
    if more_follow:
        expect_more_workers()
    with Workers(native_output_shown(), reporter) as workers:
        if not shared and options[0].partition is None:  # (parts get workers of their own; a batch asks for one when it compiles)
            workers.start()  # its imports overlap with reading the model and resolving the EP
        jobs = _open(sources, targets, options, reporter)
        return compile_batch(jobs, workers, compile_one) if shared else [jobs[0].run(workers, compile_one)]


def _open(sources: Sequence[Path], targets: Sequence[OutputTarget], options: Sequence[CompileOptions], reporter: Reporter) -> list[CompileJob]:
    """Each model's job, planned and its destination opened, in order; a failure removes the output directory the first
    one created (a model's own failure leaves none: its destination is opened last)."""
    jobs: list[CompileJob] = []
    try:
        for index, target in enumerate(targets):
            jobs.append(CompileJob.open(sources[index], target, options[index], reporter))
    except BaseException:
        if jobs:
            remove_created_dirs(jobs[0].created_dirs)
        raise
    return jobs
