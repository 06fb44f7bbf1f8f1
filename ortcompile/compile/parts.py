"""`--partition`: split, compile the parts (each in its own worker child, in parallel within a memory budget), stitch.

The steps are the ones `ortcompile split`, `ortcompile compile <part>` and `ortcompile stitch` run as separate
commands (a build system spreads them over machines): here they run in one staging directory, the parts compiled
by the very same `compile_model`, so both ways give the same bytes.

Memory: a QNN compile peaks at ~3.9x what it compiles (+ ~140 MiB of process), measured. A part is started when
`jobs` allows and its estimate fits next to the parts already running, or when nothing runs (a part larger than
the budget still compiles, alone). The EP's memory is returned when each part's worker child exits.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from ortcompile.compile.finish import given_inputs
from ortcompile.compile.split import SplitResult, plan_record, split_model
from ortcompile.compile.stitch import StitchJob
from ortcompile.errors import CompilationFailed, OrtCompileError
from ortcompile.native import available_memory
from ortcompile.options import CompileOptions, CompileResult, PartitionOptions
from ortcompile.plan.planner import CompilePlan
from ortcompile.progress import Reporter, SilentReporter
from ortcompile.sizes import format_size
from ortcompile.worker import cancel_all, reset_cancel

CompileOne = Callable[[Path, Path, CompileOptions], CompileResult]  # compile_model: a part is compiled as any model

PROCESS_BYTES = 160 << 20  # a worker child before it compiles anything (python, onnxruntime, the EP's libraries)
EP_FACTOR = 4  # peak RSS of a QNN compile over the bytes it compiles (measured 3.9)
PARTS_DIR, COMPILED_DIR = ".parts", ".parts_out"


def estimate_peak(weight_bytes: int) -> int:
    return PROCESS_BYTES + EP_FACTOR * weight_bytes


def partitioned_stitch(plan: CompilePlan, staging_dir: Path, reporter: Reporter, timings: dict[str, float], created_dirs: list[Path],
                       compile_one: CompileOne) -> StitchJob:
    """`--partition`: split into `staging_dir/.parts`, compile each part into `.parts_out` (with `compile_one`: the very
    `compile_model` of a whole model), and the StitchJob that joins them into `staging_dir`."""
    options = plan.options
    assert options.partition is not None
    parts_dir, compiled_dir = staging_dir / PARTS_DIR, staging_dir / COMPILED_DIR
    parts_dir.mkdir()
    compiled_dir.mkdir()
    clock = time.perf_counter()
    reporter.stage(f"splitting {plan.source.path.name}")
    record = plan_record(plan, None, parts_dir)
    given = given_inputs(options.freeze, options.inputs) if options.inputs else None
    split = split_model(plan.source, parts_dir, plan.part_budget, plan.pins, options.layout, options.freeze, record, link_sources=True, given=given)
    timings["split"] = time.perf_counter() - clock
    reporter.detail(f"split into {len(split.parts)} part{'s' if len(split.parts) > 1 else ''} of at most {format_size(split.plan.budget)} of weights: "
                    + ", ".join(format_size(p.weight_bytes) for p in split.plan.parts))
    clock = time.perf_counter()
    results = compile_parts(split, compiled_dir, plan.part_options, options.partition, compile_one, reporter)
    timings["compile"] = time.perf_counter() - clock
    return StitchJob(split.parts_plan, compiled_dir, plan.target, options, plan.ep, plan.source.path,
                     reporter, plan.inputs, stamp_source=plan.source.path, created_dirs=created_dirs, timings=timings, part_results=results,
                     offers=options.refusal_offers())


def compile_parts(split: SplitResult, compiled_dir: Path, options: CompileOptions, partition: PartitionOptions,
                  compile_one: CompileOne, reporter: Reporter | None = None) -> list[CompileResult]:
    """Compile every part with `compile_one`, several at once when `jobs` and the memory budget allow. A failed part
    cancels the others (worker.cancel_all); the cancel is lifted once they have all stopped, so that later compiles
    of this process (a fallback round, a batch's next model, a test) are not cancelled too."""
    reporter = reporter or SilentReporter()
    jobs = max(1, partition.jobs or os.cpu_count() or 1)
    memory = partition.memory_budget or int(0.9 * available_memory())
    pending = list(zip(split.plan.parts, split.parts))
    running: dict[Future[CompileResult], int] = {}
    results: dict[int, CompileResult] = {}
    try:
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="ortcompile-part") as pool:
            try:
                while pending or running:
                    while pending and len(running) < jobs and (not running or sum(running.values()) + estimate_peak(pending[0][0].weight_bytes) <= memory):
                        part, name = pending.pop(0)
                        reporter.stage(f"compiling part {part.index + 1}/{len(split.parts)} ({format_size(part.weight_bytes)} of weights)")
                        future = pool.submit(compile_one, split.directory / name, compiled_dir, options)
                        running[future] = estimate_peak(part.weight_bytes)
                        future.part = (part.index, name)  # type: ignore[attr-defined]
                    done, _ = wait(running, timeout=0.1, return_when=FIRST_COMPLETED)
                    reporter.tick()
                    for future in done:
                        running.pop(future)
                        index, name = future.part  # type: ignore[attr-defined]
                        results[index] = _result_of(future, name)
            except BaseException:
                cancel_all()  # the other parts' workers stop at once; their stage directories go with the whole stage
                raise
    finally:
        reset_cancel()  # the pool has waited for every part's thread by now
    return [results[i] for i in sorted(results)]


def _result_of(future: Future[CompileResult], name: str) -> CompileResult:
    try:
        return future.result()
    except OrtCompileError as exc:
        raise type(exc)(f"part {name}: {exc.message}", exc.detail) from exc
    except Exception as exc:
        raise CompilationFailed(f"part {name}: {type(exc).__name__}: {exc}") from exc
