"""Is the compiled graph fragmented: several EPContext nodes with CPU nodes between them?

Each CPU node between two EP partitions is a device round trip on every run (an LLM decoder left that way hopped
CPU<->NPU 48 times per token). Such an output runs, so it is published with a warning that says which ops
stayed on the CPU and what would fix them; `--require-full` makes it an error (exit 1) for CI.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ortcompile.compile.epfixes import fixable_ops
from ortcompile.errors import CompilationFailed, OrtCompileWarning
from ortcompile.onnxfacts import EPCONTEXT


@dataclass(frozen=True)
class Fragmentation:
    epcontext_nodes: int
    between: dict[str, int] = field(default_factory=dict)  # op type -> CPU nodes between two EPContext nodes

    @property
    def fragmented(self) -> bool:
        return self.epcontext_nodes > 1 and bool(self.between)

    def message(self, model: str, ep_short: str, ep_name: str, prepared: bool, pinned: frozenset[str] = frozenset()) -> str:
        """`pinned`: op types moved to the CPU on purpose (--cpu-nodes, --fallback auto), not refused by the EP."""
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(self.between.items(), key=lambda kv: (-kv[1], kv[0])))
        total = sum(self.between.values())
        on_purpose = sorted(set(self.between) & pinned)
        causes = [f"{', '.join(on_purpose)} {'were' if len(on_purpose) > 1 else 'was'} pinned to the CPU (--cpu-nodes / --fallback)"] if on_purpose else []
        refused = set(self.between) - pinned
        if refused:
            causes.append(_refusal_fix(refused, ep_short, ep_name, prepared))
        return (f"{model}: the {ep_short} graph is fragmented: {self.epcontext_nodes} EPContext nodes with {total} CPU node"
                f"{'s' if total != 1 else ''} between them ({ops}), a device round trip each per run; {'; '.join(causes)}; "
                f"--require-full makes this an error")


def _refusal_fix(refused: set[str], ep_short: str, ep_name: str, prepared: bool) -> str:
    """What would bring the ops the EP refused onto it."""
    unfixed = sorted(refused - fixable_ops(ep_name))
    if not prepared:
        return "drop --no-prepare: the prepare step rewrites the ops it knows for this EP"
    if unfixed:
        them = "them" if len(unfixed) > 1 else "it"
        return (f"{ep_short} does not take {', '.join(unfixed)} and ortcompile knows no rewrite for {them}: replace {them} in the "
                f"model with ops {ep_short} takes (-v lists the EP's reasons)")
    return "these ops have fixes that did not apply to this form (-v shows the prepare step's EP fixes)"


def fragmentation(model: Any) -> Fragmentation:
    """The CPU nodes both downstream of one EPContext node and upstream of another (top-level graph)."""
    nodes = list(model.graph.node)
    contexts = [i for i, n in enumerate(nodes) if n.op_type == EPCONTEXT]
    if len(contexts) < 2:
        return Fragmentation(len(contexts))
    producer = {out: i for i, n in enumerate(nodes) for out in n.output if out}
    consumers: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            if name in producer:
                consumers.setdefault(producer[name], []).append(i)
    downstream = _reach(contexts, lambda i: consumers.get(i, []))
    upstream = _reach(contexts, lambda i: [producer[name] for name in nodes[i].input if name in producer])
    between = Counter(nodes[i].op_type for i in downstream & upstream if nodes[i].op_type != EPCONTEXT)
    return Fragmentation(len(contexts), dict(between))


def _reach(starts: list[int], step: Any) -> set[int]:
    """Nodes reachable from `starts` (not counting the starts themselves unless reached again)."""
    seen: set[int] = set()
    frontier = [j for s in starts for j in step(s)]
    while frontier:
        i = frontier.pop()
        if i not in seen:
            seen.add(i)
            frontier.extend(step(i))
    return seen


def judge_fragmentation(graph_proto: bytes, model: str, ep_short: str, ep_name: str, prepared: bool, require_full: bool,
                        pinned: frozenset[str] = frozenset()) -> None:
    """Warn when CPU nodes sit between the EP's partitions of a compiled graph; with `require_full`, fail instead."""
    import onnx  # loaded already: the graph pass parsed this proto

    found = fragmentation(onnx.ModelProto.FromString(graph_proto))
    if not found.fragmented:
        return
    message = found.message(model, ep_short, ep_name, prepared, pinned)
    if require_full:
        raise CompilationFailed(f"not published: {message.replace('; --require-full makes this an error', '')} (--require-full)")
    warnings.warn(message, OrtCompileWarning, stacklevel=3)
