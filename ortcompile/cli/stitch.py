"""`ortcompile stitch`: the compiled parts of a split model joined into one EPContext model."""

from __future__ import annotations

import click

from ortcompile.cli.compile import summary_line
from ortcompile.cli.output import current, output_options
from ortcompile.native import set_ort_log_level


@click.command("stitch", short_help="Join the compiled parts of a split model into one EPContext model.")
@click.argument("plan", type=click.Path(dir_okay=False, path_type=str))
@click.option("--parts", "parts_dir", required=True, type=click.Path(file_okay=False, path_type=str), help="Directory the parts were compiled into.")
@click.option("-o", "--output-dir", required=True, type=click.Path(path_type=str), help="Directory for the stitched model and its files.")
@click.option("--check", "check_mode", type=click.Choice(["auto", "none", "load", "run"]), default="auto", show_default=True,
              help="Before publishing, open the output on its EP: load it, or load, run and compare with the source when it is still there "
                   "(auto: run up to 1 GiB of weights).")
@click.option("--ep-library", default=None, type=click.Path(dir_okay=False, path_type=str), help="The plugin EP library the parts were compiled with.")
@click.option("--force", is_flag=True, help="Replace an earlier output of the same model.")
@click.option("--replace-stitched", is_flag=True, help="Replace an earlier stitched output of the same model (as make does); refuse any other.")
@click.option("--verify", is_flag=True, help="Compare with the source before publishing; on mismatch publish nothing (exit 5).")
@output_options
def command(plan: str, parts_dir: str, output_dir: str, check_mode: str, ep_library: str | None, force: bool, replace_stitched: bool,
            verify: bool) -> None:
    """Join the parts PLAN (a <stem>.parts.json written by split) lists, compiled into --parts, into OUTPUT_DIR."""
    from ortcompile.compile.stitch import stitch_model

    out = current()
    set_ort_log_level(out.verbose)
    result = stitch_model(plan, parts_dir, output_dir, check_mode, force, verify, ep_library, out.reporter(), replace_stitched)
    out.result({"outputs": [result.to_json()]}, [summary_line(result)])
