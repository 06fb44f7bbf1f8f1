"""`ortcompile split`: a model as parts that compile on their own (on any machine), and a Make fragment that does it."""

from __future__ import annotations

from typing import Any

import click

from ortcompile.cli.output import current, output_options
from ortcompile.cli.sections import SectionedCommand
from ortcompile.cli.shaping import configured, take_shaping
from ortcompile.cli.tableopts import shaping_options
from ortcompile.optiontable import PARTITION_AUTO


@click.command("split", cls=SectionedCommand, short_help="Write a model as parts that compile on their own, with a Make fragment.")
@click.argument("model", type=click.Path(dir_okay=False, path_type=str))
@click.option("-o", "--output-dir", required=True, type=click.Path(path_type=str), help="Directory for the parts, the plan and the Make fragment.")
@shaping_options
@click.option("--stitch-output", default=None, help="Where the Make fragment's stitch writes the compiled model [default: OUTPUT_DIR/stitched].")
@click.option("--force", is_flag=True, help="Replace an earlier split of the same model.")
@output_options
def command(model: str, output_dir: str, stitch_output: str | None, force: bool, **rest: Any) -> None:
    """Split MODEL into parts of at most --partition bytes of weights (auto: the EP's graph limit) in OUTPUT_DIR.

    Each part is a standalone model: compile it with the same options ('ortcompile compile PART -o DIR ...'),
    then join them with 'ortcompile stitch OUTPUT_DIR/<stem>.parts.json --parts DIR -o OUT'. The result is
    byte-identical to 'ortcompile compile MODEL --partition ...'. OUTPUT_DIR/<stem>.parts.mk does all of it:
    'make -f OUTPUT_DIR/<stem>.parts.mk -j N' (into OUTPUT_DIR/stitched unless --stitch-output says otherwise).
    """
    from ortcompile.cli.render import human_size, plural
    from ortcompile.compile.split import plan_file_name, split_to
    from ortcompile.config import compile_options

    out = current()
    values = configured([model], take_shaping(rest))[0][model]
    if values["partition"] is None and values["max_context_size"] is None:
        values["partition"] = PARTITION_AUTO
    options = compile_options(values, force=force)  # partitioned: values["partition"] is set above
    result = split_to(model, output_dir, options, stitch_output, out.reporter())
    parts = [{"model": str(result.directory / name), "weight_bytes": spec.weight_bytes, "inputs": list(spec.inputs), "outputs": list(spec.outputs)}
             for name, spec in zip(result.parts, result.plan.parts)]
    out.result({"plan": str(result.plan_file), "budget_bytes": result.plan.budget, "parts": parts,
                "make_fragment": str(result.directory / f"{result.stem}.parts.mk")},
               [f"{result.directory / plan_file_name(result.stem)}: {plural(len(result.parts), 'part')} of at most "
                f"{human_size(result.plan.budget)} of weights"])
