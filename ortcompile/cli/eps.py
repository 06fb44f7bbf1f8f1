"""`ortcompile eps`: the execution providers installed here, the devices they claim, whether they compile."""

from __future__ import annotations

import click

from ortcompile.cli.output import current, output_options


@click.command("eps")
@output_options
def command() -> None:
    """List execution providers, the devices they claim here, and whether they produce EPContext."""
    from ortcompile.eps import list_eps
    from ortcompile.native import set_ort_log_level

    out = current()
    set_ort_log_level(out.verbose)
    listings = list_eps()
    lines = [f"{'NAME':<10} {'EP':<28} {'AVAILABLE':<10} {'EPCONTEXT':<10} DEVICES / NOTE"]
    for entry in listings:
        info = entry.to_json()
        devices = ", ".join(f"{d['type']} ({d['vendor']})" for d in entry.devices)
        lines.append(f"{entry.short_name:<10} {entry.ep_name:<28} {'yes' if info['available'] else 'no':<10} "
                     f"{'yes' if entry.compiles else 'no':<10} {devices or entry.note}")
    out.result({"eps": [e.to_json() for e in listings]}, lines)
