"""`ortcompile inspect`: what a model contains, from its graph proto alone; with --placement, where its nodes run."""

from __future__ import annotations

import click

from ortcompile.cli.output import current, output_options
from ortcompile.errors import UsageError, VerificationFailed
from ortcompile.native import set_ort_log_level


@click.command("inspect", short_help="Show what a model contains, from its graph proto alone.")
@click.argument("model", type=click.Path(path_type=str))
@click.option("--check", is_flag=True, help="Hash every file the manifest lists (reads all the data).")
@click.option("--placement", is_flag=True, help="Open MODEL on its EP (in a child process): which EP runs which nodes, what the EP refused.")
@click.option("--lint", is_flag=True, help="fp16 lint: constants and patterns an EP computing in fp16 (QNN HTP) gets wrong, by node.")
@click.option("--ep", default=None, help="With --placement: the EP to open it on [default: the manifest's, else the EPContext nodes' source].")
@output_options
def command(model: str, check: bool, placement: bool, lint: bool, ep: str | None) -> None:
    """Show what MODEL contains, from its graph proto alone (weights are never read)."""
    from ortcompile.cli.render import inspect_text, placement_text
    from ortcompile.readback.inspect import inspect_model
    from ortcompile.readback.lint import lint_path

    if ep is not None and not placement:
        raise UsageError("--ep: only used by --placement; add --placement or drop it")
    out = current()
    report = inspect_model(model, check=check).to_json()
    lines = inspect_text(report)
    if placement:
        report["placement"] = _placement(model, ep, out.verbose)
        lines += placement_text(report["placement"])
    if lint:
        report["lint"] = [f.to_json() for f in lint_path(model)]
        lines += lint_text(report["lint"])
    out.result(report, lines)
    if check and report["problems"]:  # without --check, problems are reported, not fatal
        raise VerificationFailed("check failed: " + "; ".join(report["problems"]))


def lint_text(findings: list[dict[str, object]]) -> list[str]:
    if not findings:
        return ["fp16 lint: nothing found"]
    lines = [f"fp16 lint: {len(findings)} finding{'s' if len(findings) != 1 else ''} (--cpu-nodes NODE keeps one off the EP)"]
    return lines + [f"  {f['severity']}: {f['node']} ({f['op_type']}): {f['message']} [{f['rule']}]" for f in findings]


def _placement(model: str, ep: str | None, verbose: bool) -> dict[str, object]:
    from ortcompile.readback.placement import inspect_placement

    set_ort_log_level(verbose)
    return inspect_placement(model, ep=ep).to_json()
