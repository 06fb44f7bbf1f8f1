"""The pre-publish check: the staged output must load on its EP, run, and agree with the source.

Exit 0 must mean a model that loads and runs. Measured on real models (PyPI wheels), outputs that the raw
Compile API and ortcompile 0.1 published often did neither: QNN had taken only shape-computation
partitions ("count of graph inputs should be at least the count of tensor_wrapper" at load), or the
compiled model ran but computed something else (correlation ~0, another output length). So before
publishing, the worker child opens the staged model with the target EP — no CPU fallback anywhere — runs
it once on generated inputs (or the user's), and compares with the source on the CPU EP (parity.py) under
the criterion `verify` applies for the EP's precision, on seeds 0 and 1 (seed 0 only above SMALL_SOURCE bytes:
each set is one more run of both models) and the edge sets the inputs suggest (inputsets.py: silence and tones
for audio, structured images, padded ids; realistic LLM inputs, llm.py), or on the user's samples: a default
compile never publishes what a default `verify` rejects. Random ops are removed or make the model
unverifiable by comparison (randomops.py: it is published after the load and run, with a warning).
With `--verify`, the check applies --verify's criterion options
too (a check stricter than the --verify asked for would refuse what the user accepted). For a source under
SMALL_SOURCE the reference's CPU run goes beside the EP's runs (reference.py); -v and `--json` show each part's time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ortcompile.eps.request import EpRequest
from ortcompile.jsonedge import JsonObject
from ortcompile.options import ALL_REFUSAL_OFFERS, CheckMode
from ortcompile.output.manifest import CheckRecord
from ortcompile.readback.criteria import criterion_for
from ortcompile.readback.given import Given
from ortcompile.readback.parity import ParityReport, ParityRequest, ParityRun

SMALL_SOURCE = 256 * 2**20  # bytes of model and data: below it the check also runs seed 1


def check_request(model: Path, source: Path, ep: EpRequest, mode: CheckMode, precision: str, dims: dict[str, int],
                  given: dict[str, Given] | None = None, overrides: Mapping[str, Any] | None = None,
                  offers: tuple[str, ...] = ALL_REFUSAL_OFFERS) -> ParityRequest:
    """`overrides`: --verify's criterion settings (`precision`, `rtol`, `min_snr_db`, ...), as verify_model takes them;
    `offers`: the options a refusal may suggest (CompileOptions.refusal_offers)."""
    settings = dict(overrides or {})
    criterion = criterion_for(settings.pop("precision", None) or precision, "check", **settings) if mode == "run" else None
    small = source_bytes(source) < SMALL_SOURCE
    # A small source's CPU reference runs beside the compiled model's runs (reference.py): both held at once is cheap
    return ParityRequest(model, source, ep, mode, criterion, dims, check_seeds(source), dict(given or {}), lean=True,
                         publish_anyway=overrides is None,  # with --verify, --check load would not publish it either
                         concurrent_reference=small, offers=offers)


def check_seeds(source: Path) -> tuple[int, ...]:
    """(0, 1) for small models, (0,) for large ones."""
    return (0, 1) if source_bytes(source) < SMALL_SOURCE else (0,)


def source_bytes(source: Path) -> int:
    """The model and its data files beside it, as far as known (SMALL_SOURCE when unreadable: treated as large)."""
    try:
        return source.stat().st_size + sum(p.stat().st_size for p in source.parent.glob(source.name + ".data*"))
    except OSError:
        return SMALL_SOURCE


def failure_detail(report: ParityReport) -> str | None:
    """-v after a refusal: how the inputs were chosen, then every output of every input set."""
    lines = [*report.notes, *(["outputs per input set:", *runs_table(report.runs)] if report.runs else [])]
    return "\n".join(lines) or None


def runs_table(runs: Sequence[ParityRun]) -> list[str]:
    """-v: one line per input set and output, failures marked."""
    lines = []
    for run in runs:
        for out in run.outputs:
            metrics = ", ".join(f"{k} {value:.4g}" for k in ("snr_db", "cosine", "max_abs") if (value := out.metric(k)) is not None)
            verdict = "ok" if out.ok else f"FAIL: {out.reason}"
            lines.append(f"  {run.input_set}: {out.name} {out.shape}: {verdict}" + (f" ({metrics})" if metrics else ""))
    return lines


def record(report: ParityReport, given: bool) -> CheckRecord:
    """For the manifest (its `check` record): what was proven (deterministic: no times, no numbers that vary by
    machine). `given`: the user gave some inputs (make_feeds refuses a name the model lacks, so a passing run fed
    every one of them)."""
    if report.mode != "run":
        return CheckRecord(report.mode, report.ok)
    criterion = report.criterion
    return CheckRecord(report.mode, report.ok, f"{criterion.kind if criterion else None} ({criterion.precision if criterion else None} check)",
                       "given and generated (seeded)" if given else "generated (seeded)", False if report.warning else None)


def to_json(report: ParityReport) -> JsonObject:
    """For the compile result (--json): everything the check measured."""
    return {"mode": report.mode, "ok": report.ok, "error": report.error, "hint": report.hint,
            "seconds": {k: round(v, 3) for k, v in report.seconds.items()},
            "run_seconds": [round(v, 3) for v in report.run_seconds], "cpu_seconds": round(report.cpu_seconds, 3),
            "placement": report.placement,
            "placement_nodes": report.placement_nodes,
            "criterion": report.criterion.to_json() if report.criterion else {},
            "outputs": [o.to_json() for o in report.outputs], "dims": report.dims, "notes": report.notes,
            "input_sets": report.sets, "warning": report.warning}


def describe_ok(report: ParityReport, total: float) -> str:
    """One line for -v after a passing check; `total`: its wall seconds (the worker's call included)."""
    seconds = f"{_seconds(report)}; {total:.2f}s, CPU {report.cpu_seconds:.2f}s"
    if report.mode == "load":
        return f"check: loads on its EP ({total:.2f}s)"
    if report.warning:
        return f"check: loads and runs on its EP, outputs not compared ({seconds})"
    snrs = [snr for o in report.outputs if (snr := o.metric("snr_db")) is not None]
    quality = f", worst SNR {min(snrs):.1f} dB" if snrs else ""
    count = len(report.runs[0].outputs) if report.runs else 0  # outputs of the model, not of every set
    sets = f" on {len(report.sets)} input sets" if len(report.sets) > 1 else ""
    return f"check: loads, runs and agrees with the source on the CPU EP{sets} ({count} output{'s' if count != 1 else ''}{quality}; {seconds})"


def _seconds(report: ParityReport) -> str:
    """Where the check's time went: "load 0.31s, run 9.80s (2.45s a set), source on the CPU 0.52s beside the run"
    (the compiled model runs once per input set: that is the check's cost)."""
    runs = report.run_seconds
    each = f" ({sum(runs) / len(runs):.2f}s a set)" if len(runs) > 1 else ""
    parts = {"load": "compiled", "run": "run", "source on the EP": "source_on_ep"}
    shown = [f"{label} {report.seconds[key]:.2f}s{each if key == 'run' else ''}" for label, key in parts.items() if key in report.seconds]
    source = report.seconds.get("source_on_cpu", 0.0) + report.seconds.get("source_run", 0.0)
    if "source_on_cpu" in report.seconds:
        shown.append(f"source on the CPU {source:.2f}s{' beside the run' if report.concurrent_reference else ''}")
    return ", ".join(shown)
