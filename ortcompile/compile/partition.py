"""Where to cut a model into parts that compile one at a time (the plan of `--partition` and `ortcompile split`).

Memory, not protobuf, sets the ceiling of a whole-model compile: QNN peaks at ~3.9x what it compiles, and one HTP
graph over ~2 GB fails to finalize. So the main graph's nodes (already in topological order) are cut into
contiguous parts whose weights stay under a budget. Each cut is placed where the fewest activations cross it
(between transformer layers: one or two tensors), looking back from the point where the budget is reached over
the last half of the part. A node whose weights alone exceed the budget gets a part of its own.

A part reads graph inputs and tensors of earlier parts (its inputs), the initializers its nodes (and their
subgraphs) read, and hands on what later parts or the graph outputs need (its outputs). Weights read by two parts
are listed in both: each part must compile on its own; the stitched model stores them once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ortcompile.errors import UsageError

MIN_FILL = 0.5  # a cut is looked for once a part holds this share of the budget


@dataclass(frozen=True)
class PartSpec:
    index: int
    start: int  # first main-graph node (index in graph order)
    stop: int  # one past the last
    inputs: tuple[str, ...]  # graph inputs and earlier parts' tensors it reads, in first-read order
    outputs: tuple[str, ...]  # tensors later parts or the graph outputs need, in production order
    initializers: tuple[str, ...]  # weights its nodes read
    weight_bytes: int


@dataclass(frozen=True)
class PartitionPlan:
    budget: int
    parts: tuple[PartSpec, ...]
    nodes: int  # the main graph's nodes, which the parts cover


def plan_partition(model: Any, weight_bytes: dict[str, int], budget: int) -> PartitionPlan:
    """Cut `model`'s main graph into parts of at most `budget` bytes of weights each (see the module docstring)."""
    if budget <= 0:
        raise UsageError("the partition budget must be a positive size")
    graph = model.graph
    initializers, reads, node_weights = _reads(graph)
    live = _live_counts(graph, reads, initializers)
    cuts, start, held = [], 0, set()
    for index, weights in enumerate(node_weights):
        if index > start and _bytes(held | weights, weight_bytes) > budget:
            cut = _best_cut(start, index, node_weights, weight_bytes, budget, live)
            cuts.append(cut)
            start, held = cut, set().union(*node_weights[cut : index])
        held |= weights
    return _plan_at(graph, cuts, budget, reads, node_weights, weight_bytes, initializers)


def plan_split(model: Any, weight_bytes: dict[str, int], budget: int, cuts: Iterable[int] | None = None) -> PartitionPlan:
    """The parts of a split: cut where `budget` says, and before each node index in `cuts` too (None: by the budget only)."""
    plan = plan_partition(model, weight_bytes, budget)
    if cuts is None:
        return plan
    return plan_cuts(model, weight_bytes, [*cuts, *(part.start for part in plan.parts)], budget)


def plan_cuts(model: Any, weight_bytes: dict[str, int], cuts: Iterable[int], budget: int) -> PartitionPlan:
    """`model`'s main graph cut before each node index in `cuts` (compile/nodecut.py: nodes kept off the EP become
    parts of their own); the budget recorded is `budget`, or the largest part's weights when that is smaller."""
    graph = model.graph
    initializers, reads, node_weights = _reads(graph)
    cuts = sorted({c for c in cuts if 0 < c < len(graph.node)})
    plan = _plan_at(graph, cuts, 1, reads, node_weights, weight_bytes, initializers)
    return PartitionPlan(min(budget, max(1, *(p.weight_bytes for p in plan.parts))), plan.parts, plan.nodes)


def _reads(graph: Any) -> tuple[set[str], list[list[str]], list[set[str]]]:
    """The graph's initializer names, what each node reads, and which of those are initializers."""
    initializers = {t.name for t in graph.initializer}
    reads = [sorted(node_reads(n) - {""}) for n in graph.node]
    return initializers, reads, [{name for name in r if name in initializers} for r in reads]


def _plan_at(graph: Any, cuts: list[int], budget: int, reads: list[list[str]], node_weights: list[set[str]], weight_bytes: dict[str, int],
             initializers: set[str]) -> PartitionPlan:
    bounds = list(zip([0, *cuts], [*cuts, len(graph.node)]))
    return PartitionPlan(budget, tuple(_part(k, a, b, graph, reads, node_weights, weight_bytes, initializers) for k, (a, b) in enumerate(bounds)),
                         len(graph.node))


def node_reads(node: Any) -> set[str]:
    """Everything a node reads: its inputs, and the outer-scope names its subgraphs read."""
    names = set(node.input)
    for attribute in node.attribute:
        for subgraph in [attribute.g] if attribute.type == attribute.GRAPH else list(attribute.graphs):
            names |= _outer_reads(subgraph)
    return names


def _outer_reads(graph: Any) -> set[str]:
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
    return set().union(*(node_reads(n) for n in graph.node)) - defined if graph.node else set()


def _bytes(names: Iterable[str], weight_bytes: dict[str, int]) -> int:
    return sum(weight_bytes.get(n, 0) for n in names)


def _live_counts(graph: Any, reads: list[list[str]], initializers: set[str]) -> list[int]:
    """live[i]: activations crossing a cut placed before node i (produced before it, read at or after it)."""
    produced_at = {o: i for i, n in enumerate(graph.node) for o in n.output}
    produced_at.update({g.name: -1 for g in graph.input if g.name not in initializers})
    last_read: dict[str, int] = {}
    for i, names in enumerate(reads):
        for name in names:
            if name in produced_at:
                last_read[name] = i
    delta = [0] * (len(graph.node) + 2)
    for name, last in last_read.items():
        first = produced_at[name] + 1
        if first <= last:
            delta[first] += 1
            delta[last + 1] -= 1
    live, running = [], 0
    for i in range(len(graph.node) + 1):
        running += delta[i]
        live.append(running)
    return live


def _best_cut(start: int, end: int, node_weights: list[set[str]], weight_bytes: dict[str, int], budget: int, live: list[int]) -> int:
    """The cut in (start, end] with the fewest crossing activations, among those leaving the part at least MIN_FILL
    full (the latest on a tie, so parts stay as large as the budget allows)."""
    held: set[str] = set()
    candidates = []
    for cut in range(start + 1, end + 1):
        held |= node_weights[cut - 1]
        if _bytes(held, weight_bytes) >= MIN_FILL * budget or cut == end:
            candidates.append(cut)
    return min(candidates, key=lambda c: (live[c], -c))


def _part(index: int, start: int, stop: int, graph: Any, reads: list[list[str]], node_weights: list[set[str]],
          weight_bytes: dict[str, int], initializers: set[str]) -> PartSpec:
    produced_here = [o for n in graph.node[start:stop] for o in n.output if o]
    produced_set = set(produced_here)
    inputs: list[str] = []
    for names in reads[start:stop]:
        for name in names:
            if name not in produced_set and name not in initializers and name not in inputs:
                inputs.append(name)
    needed_later = {name for names in reads[stop:] for name in names} | {o.name for o in graph.output}
    outputs = [o for o in produced_here if o in needed_later]
    weights = sorted(set().union(*node_weights[start:stop])) if stop > start else []
    return PartSpec(index, start, stop, tuple(inputs), tuple(outputs), tuple(weights), _bytes(weights, weight_bytes))
