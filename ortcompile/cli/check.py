"""`ortcompile check`: does a compiled model fit the devices present? (what a runtime installer asks)."""

from __future__ import annotations

import click

from ortcompile.cli.output import current, output_options
from ortcompile.errors import VerificationFailed
from ortcompile.jsonedge import JsonObject
from ortcompile.native import set_ort_log_level


@click.command("check", short_help="Ask ONNX Runtime whether a compiled model fits the devices here.")
@click.argument("model", type=click.Path(path_type=str))
@output_options
def command(model: str) -> None:
    """Ask ONNX Runtime whether compiled MODEL fits the devices present: optimal, prefer recompiling, not supported
    or unknown, per EP (exit 0 when usable, 5 when not supported or unknown: use the source model instead)."""
    from ortcompile.eps import check_compatibility

    out = current()
    set_ort_log_level(out.verbose)
    report = check_compatibility(model)
    document = report.to_json()
    lines = [f"{e['ep_name']:<32}{e['verdict']:<20}{e['reason']}" for e in document["eps"]]
    for entry in document["eps"]:
        if entry.get("decoded"):
            lines.append(f"  compiled for: {describe_decoded(entry['decoded'])}")
    lines.append(f"verdict    {report.verdict} ({'usable' if report.usable else 'fall back to the source model'})")
    out.result(document, lines)
    if not report.usable:
        raise VerificationFailed(f"{model}: {report.verdict} on this machine: {'; '.join(e.reason for e in report.eps) or 'no EPContext node'}")


def describe_decoded(decoded: JsonObject) -> str:
    """QNN's `v2:` or OpenVINO's compatibility string, as a reader wants it."""
    targets = ", ".join(decoded.get("targets") or [])
    details = ", ".join(f"{k} {decoded[k]}" for k in ("soc_model", "htp_arch", "qnn_sdk", "device", "version") if decoded.get(k))
    return f"{targets} ({details})" if targets else details or str(decoded)
