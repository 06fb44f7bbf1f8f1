"""`ortcompile inspect`: what a model contains, from its graph proto alone."""

from __future__ import annotations

import click

from ortcompile.cli.output import current, output_options


@click.command("inspect", short_help="Show what a model contains, from its graph proto alone.")
@click.argument("model", type=click.Path(path_type=str))
@click.option("--check", is_flag=True, help="Hash every file the manifest lists (reads all the data).")
@output_options
def command(model: str, check: bool) -> None:
    """Show what MODEL contains, from its graph proto alone (weights are never read)."""
    from ortcompile.cli.render import inspect_text
    from ortcompile.errors import VerificationFailed
    from ortcompile.readback.inspect import inspect_model

    report = inspect_model(model, check=check).to_json()
    current().result(report, inspect_text(report))
    if check and report["problems"]:  # without --check, problems are reported, not fatal
        raise VerificationFailed("check failed: " + "; ".join(report["problems"]))
