"""`ortcompile bench`: models as a pipeline through a session residency pool, every output checked every cycle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ortcompile.cli.output import current, output_options
from ortcompile.cli.params import ByteSize, KeyValue, criterion_settings, given_inputs, pairs
from ortcompile.cli.tableopts import criterion_options, input_options, table_option
from ortcompile.errors import UsageError, VerificationFailed
from ortcompile.native import set_ort_log_level


@click.command("bench", short_help="Run compiled models as a pipeline through a memory-budgeted session pool.")
@click.argument("models", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--memory-budget", type=ByteSize(), default=None, help="Keep models resident while they fit this much RSS [default: no limit].")
@click.option("--cycles", type=click.IntRange(min=1), default=3, show_default=True, help="Times the whole pipeline runs.")
@table_option("ep", help="Execution provider to run on.")
@table_option("ep_options", example="enableGraphCapture=1")
@click.option("--graph-capture", is_flag=True, help="Capture and replay each session's graph (webgpu); evictions release it.")
@click.option("--reference", "references", multiple=True, type=click.Path(path_type=str),
              help="Source model for each MODEL, in order: outputs must match it on the CPU EP (repeatable).")
@input_options(with_dims=True)
@click.option("--fix-dim", "fix_dims", multiple=True, type=KeyValue("batch=1", "NAME=VALUE"), hidden=True)  # the old name of --dim
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the generated inputs.")
@click.option("--ort-log-level", type=click.IntRange(0, 4), default=None, help="ONNX Runtime log severity (0 verbose ... 4 fatal).")
@criterion_options
@output_options
def command(models: tuple[str, ...], memory_budget: int | None, cycles: int, ep: str, ep_options: tuple[tuple[str, str], ...], graph_capture: bool,
            references: tuple[str, ...], input_args: tuple[str, ...], inputs_file: str | None, dims: tuple[tuple[str, str], ...],
            fix_dims: tuple[tuple[str, str], ...], seed: int, ort_log_level: int | None, precision: str | None, **criterion: Any) -> None:
    """Run MODELS as a pipeline through a session residency pool; check every output on every cycle (exit 5 on mismatch)."""
    from ortcompile.bench.pipeline import run_pipeline
    from ortcompile.cli.render import bench_text, plural
    from ortcompile.plan.shapes import parse_fix_dims

    out = current()
    set_ort_log_level(out.verbose, ort_log_level)
    if references and len(references) != len(models):
        raise UsageError(f"--reference given {plural(len(references), 'time')} for {plural(len(models), 'model')}: give one per model, in order")
    settings = {**criterion_settings(criterion), **({"precision": precision} if precision else {})}
    report = run_pipeline([Path(m) for m in models], memory_budget, cycles, ep, pairs(ep_options), graph_capture,
                          [Path(r) for r in references] or None, parse_fix_dims((*fix_dims, *dims), "--dim"), seed, settings,
                          given_inputs(input_args, inputs_file))
    document = report.to_json()
    out.result(document, bench_text(document))
    if not report.ok:
        bad = next(m for m in report.models if m.mismatches)
        runs = len({m.run for m in bad.mismatches})  # one entry per output that differed
        raise VerificationFailed(f"{bad.name}: output differs from its reference on {plural(runs, 'run')}")
