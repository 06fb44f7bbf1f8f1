"""What to do next when outputs differ: every refusal names the failing output and input set (parity.py) and
says how to go on — realistic inputs, publishing anyway, the table — so a refusal is never a dead end."""

from __future__ import annotations

from ortcompile.options import ALL_REFUSAL_OFFERS

_PLACEMENT_STEPS = {"cpu_nodes": "--cpu-nodes NODES to keep the diverging nodes on the CPU EP",
                    "fallback": "--fallback auto to move diverging nodes to the CPU EP"}


def next_steps(purpose: str, first: str | None = None, can_pin: bool = True, offers: tuple[str, ...] = ALL_REFUSAL_OFFERS) -> str:
    """One clause for the end of a refusal ("check") or a failed verify ("verify"). `first`: a step that names the
    diverging nodes (compile/fallback.py, once it localized them), in place of the generic placement options;
    `can_pin`: the EP can keep nodes off it (eps.catalog.CPU_PINNING_EPS), else those options are not offered;
    `offers`: the options the failed command takes (CompileOptions.refusal_offers): no step names another's."""
    steps = [first] if first else [_PLACEMENT_STEPS[name] for name in offers if name in _PLACEMENT_STEPS and can_pin]
    if "inputs" in offers:
        steps.append("--inputs DIR to judge on realistic inputs (NAME.npy per input, or one .npz per sample)")
    if purpose == "check" and "check" in offers:
        steps.append("--check load to publish without comparing")
    steps.append("-v for the table of every output and input set")
    return "next: " + "; ".join(steps)


def placement_step(nodes: list[str], command: str = "", offers: tuple[str, ...] = ALL_REFUSAL_OFFERS) -> str | None:
    """The step that keeps the diverging NODES off the EP: `--fallback auto`, or `--cpu-nodes` naming them, as far
    as `offers` (the failed command's placement options) has them; None when it has neither (COMMAND: "compile with "
    when the options belong to another command than the one that failed)."""
    pins = " ".join(f"--cpu-nodes {n}" for n in nodes[:4]) if "cpu_nodes" in offers else ""
    if "fallback" not in offers:
        return f"{command}{pins} to keep {'it' if len(nodes) == 1 else 'them'} on the CPU EP" if nodes and pins else None
    if not nodes:
        return f"{command}--fallback auto to try moving the fp16-fragile nodes to the CPU EP"
    return f"{command}--fallback auto to move {'it' if len(nodes) == 1 else 'them'} to the CPU EP" + (f", or {pins}" if pins else "")
