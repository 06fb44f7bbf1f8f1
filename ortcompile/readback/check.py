"""The pre-publish check: the staged output must load on its EP, run, and agree with the source.

Exit 0 must mean a model that loads and runs. Measured on real models (PyPI wheels), outputs that the raw
Compile API and ortcompile 0.1 published often did neither: QNN had taken only shape-computation
partitions ("count of graph inputs should be at least the count of tensor_wrapper" at load), or the
compiled model ran but computed something else (correlation ~0, another output length). So before
publishing, the worker child opens the staged model with the target EP — no CPU fallback anywhere — runs
it once on generated inputs (or the user's), and compares with the source on the CPU EP (parity.py) under
the criterion `verify` applies for the EP's precision, on the same seed-0 inputs: a default compile never
publishes what a default `verify` rejects. With `--verify`, the check applies --verify's criterion options
too (a check stricter than the --verify asked for would refuse what the user accepted).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ortcompile.eps.request import EpRequest
from ortcompile.options import CheckMode
from ortcompile.readback.criteria import criterion_for
from ortcompile.readback.given import Given
from ortcompile.readback.parity import ParityReport, ParityRequest


def check_request(model: Path, source: Path, ep: EpRequest, mode: CheckMode, precision: str, dims: dict[str, int],
                  given: dict[str, Given] | None = None, overrides: Mapping[str, Any] | None = None) -> ParityRequest:
    """`overrides`: --verify's criterion settings (`precision`, `rtol`, `min_snr_db`, ...), as verify_model takes them."""
    settings = dict(overrides or {})
    criterion = criterion_for(settings.pop("precision", None) or precision, "check", **settings) if mode == "run" else None
    return ParityRequest(model, source, ep, mode, criterion, dims, (0,), dict(given or {}), lean=True)


def record(report: ParityReport, given: bool) -> dict[str, Any]:
    """For the manifest: what was proven (deterministic: no times, no numbers that vary by machine). `given`: the
    user gave some inputs (make_feeds refuses a name the model lacks, so a passing run fed every one of them)."""
    result: dict[str, Any] = {"mode": report.mode, "passed": report.ok}
    if report.mode == "run":
        result["criterion"] = f"{report.criterion.get('kind')} ({report.criterion.get('precision')} check)"
        result["inputs"] = "given and generated (seeded)" if given else "generated (seeded)"
    return result


def to_json(report: ParityReport) -> dict[str, Any]:
    """For the compile result (--json): everything the check measured."""
    return {"mode": report.mode, "ok": report.ok, "error": report.error, "hint": report.hint,
            "seconds": {k: round(v, 3) for k, v in report.seconds.items()}, "placement": report.placement,
            "placement_nodes": report.placement_nodes,
            "criterion": report.criterion, "outputs": report.outputs, "dims": report.dims, "notes": report.notes}


def describe_ok(report: ParityReport) -> str:
    """One line for -v after a passing check."""
    seconds = sum(report.seconds.values())
    if report.mode == "load":
        return f"check: loads on its EP ({seconds:.2f}s)"
    snrs = [o["snr_db"] for o in report.outputs if o.get("snr_db") is not None]
    quality = f", worst SNR {min(snrs):.1f} dB" if snrs else ""
    count = len(report.outputs)
    return f"check: loads, runs and agrees with the source on the CPU EP ({count} output{'s' if count != 1 else ''}{quality}; {seconds:.2f}s)"
