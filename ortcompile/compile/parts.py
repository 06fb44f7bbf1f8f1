"""`--partition`: split, compile the parts (each in its own worker child, in parallel within a memory budget), stitch.

The steps are the ones `ortcompile split`, `ortcompile compile <part>` and `ortcompile stitch` run as separate
commands (a build system spreads them over machines): here they run in one staging directory, the parts compiled
by the very same `compile_model`, so both ways give the same bytes.

Memory: a QNN compile peaks at ~3.9x what it compiles (+ ~140 MiB of process), measured. A part is started when
`jobs` allows and its estimate fits next to the parts already running, or when nothing runs (a part larger than
the budget still compiles, alone). The EP's memory is returned when each part's worker child exits.
"""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortcompile.compile.split import SplitJob, SplitResult, part_cli_args, split_model
from ortcompile.errors import CompilationFailed, OrtCompileError
from ortcompile.native import proc_kib_field
from ortcompile.options import CompileOptions, PartitionOptions
from ortcompile.progress import Reporter, SilentReporter
from ortcompile.worker import reset_cancel

if TYPE_CHECKING:
    from ortcompile.compile.finish import Built
    from ortcompile.compile.job import CompileJob
    from ortcompile.options import CompileResult
    from ortcompile.output.digest import InputDigest

PROCESS_BYTES = 160 << 20  # a worker child before it compiles anything (python, onnxruntime, the EP's libraries)
EP_FACTOR = 4  # peak RSS of a QNN compile over the bytes it compiles (measured 3.9)
DEFAULT_CONTEXT_SIZE = 1 << 30  # HTP: one graph over ~2 GB fails to finalize; ~1 GB ones compile
PARTS_DIR, COMPILED_DIR = ".parts", ".parts_out"


def estimate_peak(weight_bytes: int) -> int:
    return PROCESS_BYTES + EP_FACTOR * weight_bytes


def available_memory() -> int:
    """MemAvailable (Linux), else the physical memory: what parts may use by default."""
    available = proc_kib_field("/proc/meminfo", "MemAvailable")
    return available if available is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def partitioned_build(job: CompileJob, staging_dir: Path) -> Built:
    """`--partition`: split into `staging_dir/.parts`, compile each part into `.parts_out`, stitch into `staging_dir`."""
    from ortcompile.compile.job import given_inputs
    from ortcompile.compile.partsplan import PartsPlan
    from ortcompile.compile.stitch import StitchJob

    options = job.options
    assert options.partition is not None
    parts_dir, compiled_dir = staging_dir / PARTS_DIR, staging_dir / COMPILED_DIR
    parts_dir.mkdir()
    compiled_dir.mkdir()
    clock = time.perf_counter()
    job.reporter.stage(f"splitting {job.source.path.name}")
    split = split_model(job.source, parts_dir, part_budget(options), job.pins, options.layout, options.freeze,
                        plan_record(job, None, parts_dir), link_sources=True, given=given_inputs(options) if options.inputs else None)
    job.timings["split"] = time.perf_counter() - clock
    job.reporter.detail(f"split into {len(split.parts)} part{'s' if len(split.parts) > 1 else ''} of at most {split.plan.budget >> 20} MiB of weights: "
                        + ", ".join(f"{p.weight_bytes >> 20} MiB" for p in split.plan.parts))
    clock = time.perf_counter()
    try:
        results = compile_parts(split, compiled_dir, part_options(job.options), options.partition, job.reporter)
    finally:
        reset_cancel()
    job.timings["compile"] = time.perf_counter() - clock
    stitch = StitchJob(PartsPlan.load(split.plan_file, internal=True), compiled_dir, job.output_dir, job.names, options, job.ep, job.source.path, job.reporter,
                       job.inputs, stamp_source=job.source.path, created_dirs=job.created_dirs, timings=job.timings, part_results=results)
    return stitch.build(staging_dir)


def part_budget(options: CompileOptions) -> int:
    """Bytes of weights per part: --partition SIZE, else --max-context-size, else the EP's graph limit."""
    assert options.partition is not None
    return options.partition.budget or options.max_context_size or DEFAULT_CONTEXT_SIZE


def plan_record(job: CompileJob | SplitJob, digest: InputDigest | None, parts_dir: Path) -> dict[str, Any]:
    """What the plan file records for `stitch`: the options that shape the output, the source's digest, its op counts
    (the manifest's compiled ops) and where it is (the check runs against it when it is still there). --partition
    records no digest (None): its own, computed meanwhile, goes into the manifest; the split must not wait for it."""
    return {"options": job.options.recorded(job.ep.info.short_name, job.require_compiled, job.ep.info.compiles),
            "input": None if digest is None else {"sha256": digest.combined,
                                                  "files": [{"name": n, "size": s, "sha256": h} for n, s, h in digest.files]},
            "source_ops": job.source.op_counts,
            "source_weight_bytes": job.source.weight_bytes,
            "source_path": Path(os.path.relpath(job.source.path.absolute(), parts_dir.absolute())).as_posix(),
            "compile_args": part_cli_args(part_options(job.options))}


def part_options(options: CompileOptions) -> CompileOptions:
    """Each part: the same EP, options, target and layout; no pins (a part's shapes are static), nothing frozen
    (the split applied it), no --verify (the stitched model is verified), replaced if a stage is retried. A part the
    EP takes nothing of stays on the CPU EP, as those nodes would in a whole compile ('nothing compiled' is judged
    on the stitched model)."""
    return dataclasses.replace(options, fix_dims={}, fix_shapes={}, freeze={}, partition=None, max_context_size=None,
                               force=True, if_changed=False, verify=False, inputs={}, require_compiled=False,
                               output_name=None, compatibility=False)


def compile_parts(split: SplitResult, compiled_dir: Path, options: Any, partition: PartitionOptions,
                  reporter: Reporter | None = None) -> list[CompileResult]:
    """Compile every part with `compile_model`, several at once when `jobs` and the memory budget allow."""
    from ortcompile.worker import cancel_all

    reporter = reporter or SilentReporter()
    jobs = max(1, partition.jobs or os.cpu_count() or 1)
    memory = partition.memory_budget or int(0.9 * available_memory())
    pending = list(zip(split.plan.parts, split.parts))
    running: dict[Future[CompileResult], int] = {}
    results: dict[int, CompileResult] = {}
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="ortcompile-part") as pool:
        try:
            while pending or running:
                while pending and len(running) < jobs and (not running or sum(running.values()) + estimate_peak(pending[0][0].weight_bytes) <= memory):
                    part, name = pending.pop(0)
                    reporter.stage(f"compiling part {part.index + 1}/{len(split.parts)} ({part.weight_bytes >> 20} MiB of weights)")
                    future = pool.submit(_compile_one, split.directory / name, compiled_dir, options)
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
    return [results[i] for i in sorted(results)]


def _compile_one(part: Path, compiled_dir: Path, options: Any) -> CompileResult:
    from ortcompile.compile.job import compile_model

    return compile_model(part, compiled_dir, options)


def _result_of(future: Future[CompileResult], name: str) -> CompileResult:
    try:
        return future.result()
    except OrtCompileError as exc:
        raise type(exc)(f"part {name}: {exc.message}", exc.detail) from exc
    except Exception as exc:
        raise CompilationFailed(f"part {name}: {type(exc).__name__}: {exc}") from exc

