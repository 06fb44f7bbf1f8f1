"""`ortcompile eps`: the execution providers installed here, the devices they claim, whether they compile; targets."""

from __future__ import annotations

import click

from ortcompile import eps
from ortcompile.cli.output import current, output_options
from ortcompile.cli.tableopts import complete_ep
from ortcompile.native import set_ort_log_level


@click.command("eps", short_help="List execution providers, devices and compile targets.")
@click.option("--targets", is_flag=True, help="List what each EP can compile for (real and virtual devices, SoC generations).")
@click.option("--ep", "ep_name", default=None, shell_complete=complete_ep, help="Only this EP (short or full name).")
@output_options
def command(targets: bool, ep_name: str | None) -> None:
    """List execution providers, the devices they claim here, and whether they produce EPContext; with --targets,
    what each can compile for."""
    out = current()
    set_ort_log_level(out.verbose)
    if targets:
        listings = eps.list_targets(ep_name)
        out.result({"targets": [t.to_json() for t in listings]}, _targets_text(listings))
        return
    wanted = eps.lookup(ep_name) if ep_name is not None else None  # a typo is a usage error, not an empty table
    found = [e for e in eps.list_eps() if wanted is None or e.ep_name == wanted.ep_name]
    width = max([len(e.short_name) for e in found] + [4]) + 2
    lines = [f"{'NAME':<{width}}{'EP':<32}{'AVAILABLE':<11}{'EPCONTEXT':<11}DEVICES / NOTE"]
    for entry in found:
        info = entry.to_json()
        devices = ", ".join(f"{d.type} ({d.vendor})" for d in entry.devices)
        lines.append(f"{entry.short_name:<{width}}{entry.ep_name:<32}{'yes' if info['available'] else 'no':<11}"
                     f"{'yes' if entry.compiles else 'no':<11}{devices or entry.note}")
    out.result({"eps": [e.to_json() for e in found]}, lines)


def _targets_text(listings: list) -> list[str]:
    lines = []
    for listing in listings:
        doc = listing.to_json()
        usable = "" if doc.get("usable", True) else f"  not usable here: {doc.get('note') or 'no device'}"
        lines.append(f"{doc['ep']} ({doc['ep_name']}){usable}")
        for target in doc["targets"]:
            flags = " ".join(f for f in ("default" if target.get("default") else "", "virtual" if target.get("virtual") else "") if f)
            options = " ".join(f"{k}={v}" for k, v in target.get("options", {}).items())
            lines.append(f"  {target['name']:<12}{flags:<16}{options:<36}{target.get('description', '')}")
    return lines
