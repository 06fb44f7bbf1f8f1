"""`--cpu-nodes PATTERN`: keep nodes off the NPU, on the CPU EP, in one compile.

How (measured with onnxruntime 1.31.1 and onnxruntime-qnn 2.7.0 on the HTP simulator):

- QNN's `op_affinity` provider option (a JSON file `{"op_type": {"Log": "cpu"}}`) makes the EP refuse every node
  of those op types; ONNX Runtime then runs them on the CPU EP between the EP's subgraphs: `Add, Log` pinned in
  `Mul -> Add -> Log -> ... -> MatMul` gave `EPContext, Add, Log, EPContext`, and the output loads and runs.
  Its granularity is the op type: a pattern naming one node moves every node of that node's op type.
- ORT's own per-node control, `session.layer_assignment_settings` with a `layer_ann` metadata entry on the node,
  reaches the QNN plugin but makes its partitioner fail (`CreateSupportedPartitionNodeGroups ... Processed 1 nodes.
  Expected to process 8`); `cpu(...)` even maps to QNN, whose simulator device is a CPU. Not used.
- Model-local functions (inlined before QNN sees them) and float64 islands (QNN takes them) do not hide a node.

So a pattern resolves to nodes of the model, their op types go into `op_affinity`, and what really ran where is
read back from the compiled graph (`cpu_placement`): the manifest records the nodes on the CPU EP, not a wish.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ortcompile.compile.epfixes import PINS_FILE
from ortcompile.eps.catalog import CPU_PINNING_EPS
from ortcompile.eps.request import EpRequest
from ortcompile.errors import UsageError
from ortcompile.jsonedge import JsonObject
from ortcompile.onnxfacts import EPCONTEXT
from ortcompile.readback.lint import node_label

OP_PREFIX = "op:"
AFFINITY_OPTION = "op_affinity"
AFFINITY_FILE = PINS_FILE  # in the staging directory: never published; the prepare step's EP fixes merge into it


@dataclass(frozen=True)
class CpuPins:
    """Patterns resolved against a model: the nodes they name and the op types the EP is told to refuse."""

    patterns: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()  # the nodes the patterns named (node labels)
    op_types: tuple[str, ...] = ()  # sorted

    def __bool__(self) -> bool:
        return bool(self.op_types)

    def adding(self, op_types: Iterable[str], nodes: Iterable[str] = ()) -> CpuPins:
        return CpuPins(self.patterns, tuple(dict.fromkeys((*self.nodes, *nodes))), tuple(sorted({*self.op_types, *op_types})))


def resolve_cpu_nodes(model: Any, patterns: Iterable[str], model_name: str = "the model") -> CpuPins:
    """Each pattern (a node name, `op:TYPE`, or an fnmatch glob over node names) against the main graph; one that
    names no node is a usage error (a typo would otherwise leave the node on the NPU)."""
    patterns = tuple(patterns)
    nodes: dict[str, str] = {}
    for pattern in patterns:
        matched = matching_nodes(model, pattern)
        if not matched:
            raise UsageError(f"--cpu-nodes {pattern}: no node of {model_name} matches (give a node name, op:TYPE or a glob; "
                             "'ortcompile inspect --lint' names the fragile ones)")
        nodes.update(matched)
    return CpuPins(patterns, tuple(nodes), tuple(sorted(set(nodes.values()))))


def matching_nodes(model: Any, pattern: str) -> dict[str, str]:
    """node label -> op type, for the nodes `pattern` names."""
    graph_nodes = [n for n in model.graph.node if n.op_type != EPCONTEXT]
    if pattern.startswith(OP_PREFIX):
        wanted = pattern[len(OP_PREFIX):]
        return {node_label(n): n.op_type for n in graph_nodes if n.op_type == wanted}
    exact = {node_label(n): n.op_type for n in graph_nodes if node_label(n) == pattern}
    return exact or {node_label(n): n.op_type for n in graph_nodes if fnmatch.fnmatchcase(node_label(n), pattern)}


def require_supported(ep_name: str, ep_options: dict[str, str], pins: CpuPins | tuple[str, ...], what: str = "--cpu-nodes") -> None:
    """Only QNN offers the control this needs; the CPU EP runs everything on the CPU anyway."""
    if not pins or ep_name in ("CPUExecutionProvider",):
        return
    if ep_name not in CPU_PINNING_EPS:
        raise UsageError(f"{what}: {ep_name} offers no way to keep nodes off it (only QNN's op_affinity does); drop {what}")
    if AFFINITY_OPTION in ep_options:
        raise UsageError(f"{what} writes QNN's op_affinity itself: drop --ep-option {AFFINITY_OPTION}=... or {what}")


def pinned_request(request: EpRequest, pins: CpuPins, staging_dir: Path) -> EpRequest:
    """The EP request with QNN's op_affinity file (written into the stage) refusing the pinned op types."""
    if not pins:
        return request
    path = staging_dir / AFFINITY_FILE
    path.write_text(json.dumps({"op_type": {op: "cpu" for op in pins.op_types}}, sort_keys=True))
    return replace(request, options={**request.options, AFFINITY_OPTION: str(path.absolute())})


def cpu_placement(model_path: Path) -> JsonObject:
    """What the compiled graph runs on the CPU EP: its nodes outside EPContext nodes, and in how many runs
    (partitions) between the EP's subgraphs, in graph order."""
    import onnx

    graph = onnx.load_model(str(model_path), load_external_data=False).graph
    nodes, partitions, previous_on_cpu = [], 0, False
    for node in graph.node:
        on_cpu = node.op_type != EPCONTEXT
        if on_cpu:
            nodes.append({"name": node_label(node), "op_type": node.op_type})
            partitions += not previous_on_cpu
        previous_on_cpu = on_cpu
    return {"nodes": nodes, "partitions": partitions}
