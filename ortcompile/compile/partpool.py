"""The parts of a split compiled, each in its own worker child, several at once when `jobs` and memory allow.

Memory: a QNN compile peaks at ~3.9x what it compiles (+ ~140 MiB of process), measured. A part is started when
`jobs` allows and its estimate fits next to the parts already running, or when nothing runs (a part larger than
the budget still compiles, alone). The EP's memory is returned when each part's worker child exits.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from ortcompile.compile.split import SplitResult
from ortcompile.errors import CompilationFailed, OrtCompileError
from ortcompile.native import available_memory
from ortcompile.options import CompileOptions, CompileResult, PartitionOptions
from ortcompile.progress import Reporter, SilentReporter
from ortcompile.sizes import format_size
from ortcompile.worker import cancel_all, reset_cancel

CompileOne = Callable[[Path, Path, CompileOptions], CompileResult]  # compile_model: a part is compiled as any model

PROCESS_BYTES = 160 << 20  # a worker child before it compiles anything (python, onnxruntime, the EP's libraries)
EP_FACTOR = 4  # peak RSS of a QNN compile over the bytes it compiles (measured 3.9)


def estimate_peak(weight_bytes: int) -> int:
    return PROCESS_BYTES + EP_FACTOR * weight_bytes


def default_jobs() -> int:
    """Parts compiled at once without --jobs: the CPUs this thread may run on (`taskset`, a cpuset), not the machine's."""
    return max(1, len(os.sched_getaffinity(0)))


def compile_parts(split: SplitResult, compiled_dir: Path, options: CompileOptions, partition: PartitionOptions,
                  compile_one: CompileOne, reporter: Reporter | None = None) -> list[CompileResult]:
    """Compile every part with `compile_one`, several at once when `jobs` and the memory budget allow. A failed part
    cancels the others (worker.cancel_all); the cancel is lifted once they have all stopped, so that later compiles
    of this process (a fallback round, a batch's next model, a test) are not cancelled too."""
    reporter = reporter or SilentReporter()
    jobs = partition.jobs or default_jobs()  # PartitionOptions refuses a --jobs below 1
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
