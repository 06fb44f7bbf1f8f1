"""`ortcompile verify`: integrity, then outputs against the source (exit 5 on a mismatch)."""

from __future__ import annotations

from typing import Any

import click

from ortcompile.cli.output import current, output_options
from ortcompile.cli.params import KeyValue, criterion_settings, given_inputs
from ortcompile.cli.tableopts import criterion_options, input_options, table_option
from ortcompile.native import set_ort_log_level


@click.command("verify", short_help="Check a compiled model's files and outputs against its source.")
@click.argument("compiled", type=click.Path(path_type=str))
@click.option("--reference", required=True, type=click.Path(path_type=str), help="The source model the compiled one came from.")
@table_option("ep", default=None, show_default=False, help="EP to run the compiled model on [default: the one in its manifest, else auto].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the generated inputs.")
@click.option("--runs", type=click.IntRange(min=1), default=1, show_default=True, help="Runs, with seeds seed, seed+1, ...")
@input_options(with_dims=True)
@click.option("--fix-dim", "fix_dims", multiple=True, type=KeyValue("batch=1", "NAME=VALUE"), hidden=True)  # the old name of --dim
@click.option("--time-source/--no-time-source", default=True, show_default=True, help="Also time a session from the source on the same EP.")
@criterion_options
@output_options
def command(compiled: str, reference: str, ep: str | None, seed: int, runs: int, input_args: tuple[str, ...], inputs_file: str | None,
            dims: tuple[tuple[str, str], ...], fix_dims: tuple[tuple[str, str], ...], time_source: bool, precision: str | None, **criterion: Any) -> None:
    """Check COMPILED against its manifest, then its outputs against the source on the CPU EP (exit 5 on mismatch).

    Outputs are judged by the criterion for the EP's precision (fp32: element by element; fp16 and quantized:
    SNR, cosine, top-1); every threshold can be tightened. Inputs are generated from what the source graph says
    unless given with --input/--inputs.
    """
    from ortcompile.cli.render import verify_text
    from ortcompile.plan.shapes import parse_fix_dims
    from ortcompile.readback.verify import verify_model

    out = current()
    set_ort_log_level(out.verbose)
    result = verify_model(compiled, reference, ep=ep, seed=seed, runs=runs, dims=parse_fix_dims((*fix_dims, *dims), "--dim"),
                          inputs=given_inputs(input_args, inputs_file), time_source=time_source, precision=precision,
                          **criterion_settings(criterion))
    report = result.to_json()
    lines = verify_text(report)
    if out.verbose:  # the node-by-node table of a localized divergence, before the result line
        lines[-1:-1] = result.divergence_lines()
    out.result(report, lines)
    if not result.ok:
        raise result.exception()
