"""Compile the real-model corpus (tests/corpus.py) with QNN and with --ep cpu, as a user would; print the table of
docs/real-models.md (model, EP, command, outcome, time, peak RSS).

    python bench/real_models.py [--only SUBSTRING] [--json]

Each command runs as its own process (`python -m ortcompile compile ... --json`), timed as a whole; peak RSS is
the highest of ortcompile's process and its worker child (the JSON's `peak_rss_by_stage`). The outcome column is
what tests/test_real_models.py checks against a fresh run; times and memory are from the machine that ran this.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import corpus  # noqa: E402

EPS = ("qnn", "cpu")


@dataclass(frozen=True)
class Row:
    model: str  # corpus id
    ep: str
    extra: tuple[str, ...] = ()  # options beyond the pins (e.g. --freeze sr=16000)

    def args(self, model: corpus.CorpusModel) -> list[str]:
        return ["--ep", self.ep, *model.cli_pins(), *self.extra]  # one flag set for both EPs: pins fit pass-through too

    def command(self, model: corpus.CorpusModel) -> str:
        return " ".join(["ortcompile compile", f"{model.name}.onnx", "-o out/", *self.args(model)])


def rows() -> list[Row]:
    """Every corpus model with both EPs, plus the commands the error messages suggest where they do."""
    found = []
    for model in corpus.models():
        for ep in EPS:
            found.append(Row(model.id, ep))
            if model.constants:  # silero's sr: what the compile error suggests where the plain command fails
                found.append(Row(model.id, ep, tuple(a for name, value in model.constants.items() for a in ("--freeze", f"{name}={value}"))))
        found += [Row(model.id, "qnn", extra) for extra in model.qnn_extra]  # realistic --inputs, --fallback auto
    return found


def run(row: Row, model: corpus.CorpusModel, out: Path) -> dict[str, object]:
    realistic = out.parent / corpus.REALISTIC_FILE  # the realistic inputs as a user's sample file
    np.savez(realistic, **corpus.make_inputs(model, "realistic"))
    args = [str(realistic) if a == corpus.REALISTIC_FILE else a for a in row.args(model)]
    command = [sys.executable, "-m", "ortcompile", "compile", str(model.path), "-o", str(out), "--json", *args]
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - start
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ortcompile: error: ")]
    result = json.loads(proc.stdout)["outputs"][0] if proc.returncode == 0 else None
    peak = max((result or {}).get("peak_rss_by_stage", {}).values(), default=0)
    return {"model": row.model, "ep": row.ep, "command": row.command(model), "exit": proc.returncode, "seconds": round(seconds, 1),
            "peak_rss_mib": peak >> 20 if peak else None, "error": errors[-1][len("ortcompile: error: "):] if errors else "",
            "epcontext": result["epcontext_nodes"] if result else None, "remaining_ops": sum(result["remaining_ops"].values()) if result else None}


def outcome(measured: dict[str, object]) -> str:
    if measured["exit"] == 0:
        cpu = f" + {measured['remaining_ops']} CPU nodes" if measured["remaining_ops"] else ""
        return f"compiled: {measured['epcontext']} EPContext{cpu}" if measured["ep"] != "cpu" else "re-laid out"
    return f"exit {measured['exit']}: {measured['error']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="only rows whose model id contains this")
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON lines")
    args = parser.parse_args()
    models = {m.id: m for m in corpus.ensure_corpus()}
    print("| model | EP | command | outcome | time | peak RSS |")
    print("|---|---|---|---|---|---|")
    for row in rows():
        if args.only not in row.model:
            continue
        with tempfile.TemporaryDirectory(prefix="ortcompile-real-") as tmp:
            measured = run(row, models[row.model], Path(tmp) / "out")
        if args.json:
            print(json.dumps(measured), file=sys.stderr)
        rss = f"{measured['peak_rss_mib']} MiB" if measured["peak_rss_mib"] else "—"
        print(f"| {row.model} | {row.ep} | `{measured['command']}` | {outcome(measured)} | {measured['seconds']} s | {rss} |", flush=True)


if __name__ == "__main__":
    main()
