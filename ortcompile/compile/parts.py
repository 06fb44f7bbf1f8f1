"""`--partition`: split, compile the parts (each in its own worker child, in parallel within a memory budget), stitch.

The steps are the ones `ortcompile split`, `ortcompile compile <part>` and `ortcompile stitch` run as separate
commands (a build system spreads them over machines): here they run in one staging directory, the parts compiled
by the very same `compile_model`, so both ways give the same bytes. Each step is called once, in order, and hands
its data to the next: split.py's parts (with the plan it wrote, kept in memory), partpool.py's compiled parts, the
StitchJob that joins them.
"""

from __future__ import annotations

import time
from pathlib import Path

from ortcompile.compile.finish import given_inputs
from ortcompile.compile.partpool import CompileOne, compile_parts
from ortcompile.compile.split import split_model
from ortcompile.compile.stitch import StitchJob
from ortcompile.plan.planner import CompilePlan
from ortcompile.progress import Reporter
from ortcompile.sizes import format_size

PARTS_DIR, COMPILED_DIR = ".parts", ".parts_out"


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
    given = given_inputs(options.freeze, options.inputs) if options.inputs else None
    split = split_model(plan, parts_dir, plan.part_budget, link_sources=True, given=given)
    timings["split"] = time.perf_counter() - clock
    reporter.detail(f"split into {len(split.parts)} part{'s' if len(split.parts) > 1 else ''} of at most {format_size(split.plan.budget)} of weights: "
                    + ", ".join(format_size(p.weight_bytes) for p in split.plan.parts))
    clock = time.perf_counter()
    results = compile_parts(split, compiled_dir, plan.part_options, options.partition, compile_one, reporter)
    timings["compile"] = time.perf_counter() - clock
    return StitchJob(split.parts_plan, compiled_dir, plan.target, options, plan.ep, plan.source.path,
                     reporter, plan.inputs, created_dirs=created_dirs, timings=timings, part_results=results,
                     offers=options.refusal_offers())
