"""What to do next when outputs differ: every refusal names the failing output and input set (parity.py) and
says how to go on — realistic inputs, publishing anyway, the table — so a refusal is never a dead end."""

from __future__ import annotations

import dataclasses
from typing import Any

from ortcompile.options import CompileOptions

# Options other parts of ortcompile may offer (issue 21): mentioned only when this build has them.
_PLACEMENT_OPTIONS = (("cpu_nodes", "--cpu-nodes NODES to keep the diverging nodes on the CPU EP"),
                      ("fallback", "--fallback auto to move diverging nodes to the CPU EP"))


def next_steps(purpose: str, first: str | None = None, can_pin: bool = True) -> str:
    """One clause for the end of a refusal ("check") or a failed verify ("verify"). `first`: a step that names the
    diverging nodes (compile/fallback.py, once it localized them), in place of the generic placement options;
    `can_pin`: the EP can keep nodes off it (eps.catalog.CPU_PINNING_EPS), else those options are not offered."""
    fields = {f.name for f in dataclasses.fields(CompileOptions)}
    steps = [first] if first else [text for name, text in _PLACEMENT_OPTIONS if name in fields and can_pin]
    steps.append("--inputs DIR to judge on realistic inputs (NAME.npy per input, or one .npz per sample)")
    if purpose == "check":
        steps.append("--check load to publish without comparing")
    steps.append("-v for the table of every output and input set")
    return "next: " + "; ".join(steps)


def runs_table(runs: list[dict[str, Any]]) -> list[str]:
    """-v: one line per input set and output, failures marked."""
    lines = []
    for run in runs:
        for out in run["outputs"]:
            metrics = ", ".join(f"{k} {out[k]:.4g}" for k in ("snr_db", "cosine", "max_abs") if isinstance(out.get(k), (int, float)))
            verdict = "ok" if out["ok"] else f"FAIL: {out['reason']}"
            lines.append(f"  {run.get('set', 'seed ' + str(run.get('seed')))}: {out['name']} {out['shape']}: {verdict}" + (f" ({metrics})" if metrics else ""))
    return lines
