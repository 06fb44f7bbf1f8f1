"""Random ops in a source graph, and how a comparison can remove their effect.

Two runs of a model with `RandomNormalLike` (VITS-style TTS flows), `RandomUniform[Like]`, `RandomNormal`,
`Multinomial`, `Bernoulli` or a `Dropout` in training mode differ from each other, so no comparison with
the CPU EP can pass (issue 21: the check compared a stochastic model with random noise scales and never said
so). Per random op:

- a `seed` attribute: ORT draws the same values on both sides (the op stays on the CPU EP in the compiled
  model, seeded alike): compared as is;
- its output scaled (`Mul`) by a graph input, or a `Dropout` whose `training_mode` is a graph input: that input
  is fed 0 (false) on both sides — the noise is removed, the rest of the model is compared;
- otherwise the model cannot be verified by comparison: the check loads and runs it, publishes, and warns.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import onnx

from ortcompile.onnxfacts import graph_inputs

RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"})
# Ops that carry a tensor's values to a Mul unchanged in what matters here (scaled noise stays noise).
CARRIERS = frozenset({"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Expand", "Transpose", "Flatten"})
MAX_HOPS = 4


@dataclass
class RandomOps:
    nodes: list[str] = field(default_factory=list)  # "name (Op)" of every random op
    seeded: list[str] = field(default_factory=list)
    zeroed: dict[str, str] = field(default_factory=dict)  # input -> the random op it silences
    unremovable: list[str] = field(default_factory=list)

    @property
    def verifiable(self) -> bool:
        return not self.unremovable

    def notes(self) -> list[str]:
        lines = []
        if self.seeded:
            lines.append(f"random ops with a fixed seed (the same draws on both sides): {', '.join(self.seeded)}")
        lines += [f"{name}: 0 on both sides, to remove the effect of random op {node}" for name, node in self.zeroed.items()]
        return lines

    def unverifiable(self) -> str:
        """One line: why outputs were not compared ("" when they can be)."""
        if not self.unremovable:
            return ""
        shown = ", ".join(self.unremovable[:3]) + (f" and {len(self.unremovable) - 3} more" if len(self.unremovable) > 3 else "")
        return (f"the model draws random numbers ({shown}: no seed, no noise-scale input to zero): two runs differ, so it cannot be "
                "verified by comparison; checked that it loads and runs on the EP only")


def find_random_ops(model: onnx.ModelProto) -> RandomOps:
    graph = model.graph
    inputs = {v.name for v in graph_inputs(graph)}
    producers = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    found = RandomOps()
    for node in graph.node:
        label = f"{node.name or node.output[0]} ({node.op_type})"
        if node.op_type == "Dropout":
            if not _dropout_trains(node, inputs, graph):
                continue
            found.nodes.append(label)
            if _has_seed(node):
                found.seeded.append(label)
            elif len(node.input) > 2 and node.input[2] in inputs:
                found.zeroed[node.input[2]] = label
            else:
                found.unremovable.append(label)
            continue
        if node.op_type not in RANDOM_OPS or node.domain not in ("", "ai.onnx"):
            continue
        found.nodes.append(label)
        if _has_seed(node):
            found.seeded.append(label)
        elif scale := _scale_input(node.output[0], consumers, producers, inputs):
            found.zeroed[scale] = label
        else:
            found.unremovable.append(label)
    return found


def _has_seed(node: onnx.NodeProto) -> bool:
    return any(a.name == "seed" for a in node.attribute)


def _dropout_trains(node: onnx.NodeProto, inputs: set[str], graph: onnx.GraphProto) -> bool:
    """Dropout draws only in training mode: its third input, a graph input or a constant true."""
    if len(node.input) < 3 or not node.input[2]:
        return False
    if node.input[2] in inputs:
        return True
    constant = next((t for t in graph.initializer if t.name == node.input[2]), None)
    return constant is not None and bool(onnx.numpy_helper.to_array(constant).reshape(-1)[:1].any())


def _scale_input(tensor: str, consumers: dict[str, list[onnx.NodeProto]], producers: dict[str, onnx.NodeProto], inputs: set[str]) -> str:
    """The graph input that scales this random tensor (through a Mul), or ""."""
    frontier = [tensor]
    for _ in range(MAX_HOPS):
        following = []
        for name in frontier:
            for node in consumers.get(name, []):
                if node.op_type == "Mul":
                    other = next((i for i in node.input if i != name), "")
                    source = _traced_input(other, producers, inputs)
                    if source:
                        return source
                elif node.op_type in CARRIERS:
                    following += list(node.output)
        frontier = following
    return ""


def _traced_input(tensor: str, producers: dict[str, onnx.NodeProto], inputs: set[str]) -> str:
    for _ in range(MAX_HOPS):
        if tensor in inputs:
            return tensor
        node = producers.get(tensor)
        if node is None or node.op_type not in CARRIERS or not node.input:
            return ""
        tensor = node.input[0]
    return ""
