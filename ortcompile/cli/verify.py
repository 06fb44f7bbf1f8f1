"""`ortcompile verify`: integrity, then outputs against the source (exit 5 on a mismatch)."""

from __future__ import annotations

import click

from ortcompile.cli.compile import tolerance_options
from ortcompile.cli.output import current, output_options
from ortcompile.cli.params import KeyValue


@click.command("verify")
@click.argument("compiled", type=click.Path(path_type=str))
@click.option("--reference", required=True, type=click.Path(path_type=str), help="The source model the compiled one came from.")
@click.option("--ep", default=None, help="EP to run the compiled model on [default: the one in its manifest, else auto].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the generated inputs.")
@click.option("--runs", type=click.IntRange(min=1), default=1, show_default=True, help="Runs, with seeds seed, seed+1, ...")
@click.option("--fix-dim", "fix_dims", multiple=True, type=KeyValue("batch=1", "NAME=VALUE"), help="Value of a symbolic dimension [default: 1].")
@click.option("--time-source/--no-time-source", default=True, show_default=True, help="Also time a session from the source on the same EP.")
@tolerance_options
@output_options
def command(compiled: str, reference: str, ep: str | None, seed: int, runs: int, fix_dims: tuple[tuple[str, str], ...], time_source: bool,
            rtol: float, atol: float) -> None:
    """Check COMPILED against its manifest, then its outputs against the source on the CPU EP (exit 5 on mismatch)."""
    from ortcompile.cli.render import verify_text
    from ortcompile.compile.shapes import parse_fix_dims
    from ortcompile.errors import VerificationFailed
    from ortcompile.native import set_ort_log_level
    from ortcompile.options import Tolerance
    from ortcompile.readback.verify import verify_model

    out = current()
    set_ort_log_level(out.verbose)
    result = verify_model(compiled, reference, ep=ep, tolerance=Tolerance(rtol, atol), seed=seed, runs=runs,
                          fix_dims=parse_fix_dims(fix_dims), time_source=time_source)
    report = result.to_json()
    out.result(report, verify_text(report))
    if not result.ok:
        raise VerificationFailed(result.failure())
