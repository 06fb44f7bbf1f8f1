"""Which execution provider runs which node of a model, what the EP refused, and why where it says so.

ONNX Runtime 1.31 records the assignment when a session is created with `session.record_ep_graph_assignment_info`
set (`InferenceSession.get_provider_graph_assignment_info()`: per EP subgraph, the name, op type and domain of
each node). The pre-publish check keeps it for every compile (parity.py); `ortcompile inspect --placement` opens
a session on the model's EP for it, in a worker child (an EP that crashes while loading cannot take ortcompile down).

What the EP refused: for a compiled model, the nodes its compile left outside the EPContext nodes (the graph's
remaining ops); for a model the EP compiles in the session, the nodes the session put on the CPU EP. Why: the QNN
EP logs a reason per refused node at verbose severity while it partitions a model ("Validation FAILED ...
REASON : ..."); a compiled model is not partitioned again, so only a source model gets reasons.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ortcompile import ortmarkers
from ortcompile.eps.catalog import CPU_EP
from ortcompile.eps.request import EpRequest
from ortcompile.errors import InvalidModel
from ortcompile.jsonedge import JsonObject
from ortcompile.native import DEVNULL, native_output_shown, redirected
from ortcompile.onnxfacts import EPCONTEXT
from ortcompile.onnxfacts import op_counts as graph_op_counts
from ortcompile.plan.source import read_source
from ortcompile.progress import Reporter
from ortcompile.run.load import model_ep
from ortcompile.run.sessions import RECORD_ASSIGNMENT, open_session, session_options
from ortcompile.worker import fresh_worker

_VERBOSE = 0  # ORT log severity at which EPs log their per-node decisions


@dataclass(frozen=True)
class AssignedNode:
    name: str  # as in the graph ORT ran ("" for a node without a name)
    op_type: str
    domain: str = ""

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "op_type": self.op_type, "domain": self.domain}


def assigned_nodes(session: Any) -> dict[str, list[AssignedNode]]:
    """EP name -> its nodes, in ONNX Runtime's order, for a session opened with RECORD_ASSIGNMENT set."""
    nodes: dict[str, list[AssignedNode]] = {}
    for subgraph in session.get_provider_graph_assignment_info():
        nodes.setdefault(subgraph.ep_name, []).extend(AssignedNode(n.name, n.op_type, n.domain) for n in subgraph.get_nodes())
    return dict(sorted(nodes.items()))


def op_counts(nodes: Iterable[AssignedNode]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def counts_by_ep(nodes: dict[str, list[AssignedNode]]) -> dict[str, dict[str, int]]:
    """EP name -> {op type: nodes}: what the pre-publish check records as `placement`."""
    return {ep: op_counts(listed) for ep, listed in nodes.items()}


def nodes_by_ep(nodes: dict[str, list[AssignedNode]]) -> dict[str, list[dict[str, str]]]:
    """EP name -> [{name, op_type, domain}]: the same, node by node, for --json."""
    return {ep: [n.to_json() for n in listed] for ep, listed in nodes.items()}


@dataclass
class PlacementReport:
    model: str
    ep: str  # the EP the session was opened on
    target: str | None  # what it was opened for (the manifest's target, or the EP's default)
    compiled: bool  # the model has EPContext nodes
    nodes: dict[str, list[AssignedNode]]  # EP -> the nodes it runs
    refused: dict[str, int] | None  # op type -> nodes the EP did not take; None for the CPU EP itself
    reasons: list[dict[str, str]] = field(default_factory=list)  # {"op_type", "name", "reason"}, where the EP logged one
    seconds: float = 0.0  # session creation

    @property
    def counts(self) -> dict[str, dict[str, int]]:
        return counts_by_ep(self.nodes)

    @property
    def cpu_nodes(self) -> int:
        return len(self.nodes.get(CPU_EP, []))

    def to_json(self) -> JsonObject:
        return {
            "ep": self.ep,
            "target": self.target,
            "compiled": self.compiled,
            "eps": {ep: {"ops": op_counts(listed), "nodes": [n.to_json() for n in listed]} for ep, listed in self.nodes.items()},
            "cpu_nodes": self.cpu_nodes,
            "refused": self.refused,
            "reasons": self.reasons,
            "session_seconds": round(self.seconds, 3),
        }


def inspect_placement(model_path: str | os.PathLike[str], ep: str | None = None, ep_options: dict[str, str] | None = None,
                      target: str | None = None, ep_library: str | None = None) -> PlacementReport:
    """Open `model_path` on its EP (the manifest's, else the EPContext nodes' source; `ep` overrides) in a worker
    child and report which EP runs which node. Raises InvalidModel (also for a model whose data or EP context paths
    lead outside its directory, as compile refuses it), UsageError/EpUnavailable, CompilationFailed. A recorded
    option that loads a library is left out (run/load.recorded_ep_options)."""
    path = Path(model_path)
    if not path.is_file():
        raise InvalidModel(f"{path}: no such file")
    read_source(path)
    request = model_ep(path, ep, ep_options, target, ep_library)
    with fresh_worker(f"the {request.name} EP", None, native_output_shown()) as worker:
        return worker.call(placement_in_child, path.absolute(), request, doing=f"loading {path.name} to see its placement")


def placement_in_child(model: Path, request: EpRequest, reporter: Reporter) -> PlacementReport:
    """In the worker child: a session on the EP with the assignment recorded (and, for a model the EP partitions
    now, its verbose log read for refusal reasons)."""
    resolved = request.resolve()
    epcontext, remaining = graph_ops(model)
    wants_reasons = resolved.name != CPU_EP and epcontext == 0
    options = session_options(resolved, config={RECORD_ASSIGNMENT: "1"})
    if wants_reasons:
        options.log_severity_level = _VERBOSE
    reporter.stage(f"loading {model.name} on {resolved.name}")
    with _reasons_from_log(wants_reasons) as reasons:
        timed = open_session(model, resolved, options=options, label=f"{model.name} on {resolved.name}", failure="cannot load it",
                             redirect_native=not wants_reasons)
    nodes = assigned_nodes(timed.session)
    refused = None if resolved.name == CPU_EP else (remaining if epcontext else op_counts(nodes.get(CPU_EP, [])))
    target = resolved.target.name if resolved.target is not None else None
    return PlacementReport(str(model), resolved.name, target, epcontext > 0, nodes, refused, reasons, timed.seconds)


def graph_ops(model: Path) -> tuple[int, dict[str, int]]:
    """(EPContext nodes, op type -> the other nodes) of the main graph; weights are not read."""
    import onnx

    proto = onnx.load_model(str(model), load_external_data=False)
    epcontext = sum(1 for n in proto.graph.node if n.op_type == EPCONTEXT)
    return epcontext, graph_op_counts(proto.graph.node, exclude=[EPCONTEXT])


def refusal_reasons(lines: Iterable[str]) -> list[dict[str, str]]:
    """The QNN EP's per-node refusals from its verbose log, once each (it partitions twice):

        ... LogNodeSupport] Validation FAILED for 1 nodes in OrtNodeUnit (Mod) :
            Operator type: Mod Node name: m0 Node index: 2
            REASON : QNN Mod Op only support fmod == 0 for now.
    """
    found: dict[tuple[str, str, str], dict[str, str]] = {}
    pending: list[tuple[str, str]] | None = None  # the operators of the block being read
    for line in lines:
        if ortmarkers.QNN_NODES_REFUSED in line:
            pending = []
        elif pending is not None and (operator := ortmarkers.QNN_REFUSED_OPERATOR.search(line)):
            pending.append((operator["op"], operator["name"].strip()))
        elif pending is not None and (reason := ortmarkers.QNN_REFUSAL_REASON.search(line)):
            for op, name in pending:
                found.setdefault((op, name, reason["reason"]), {"op_type": op, "name": name, "reason": reason["reason"]})
            pending = None
        else:
            pending = None
    return list(found.values())


@contextlib.contextmanager
def _reasons_from_log(wanted: bool) -> Iterator[list[dict[str, str]]]:
    """The refusal reasons the EP logs while the session is made (filled in on exit): fd 2 (ONNX Runtime's log)
    goes to a temporary file and fd 1 (SDK banners) to /dev/null meanwhile.

    A verbose log is large (thousands of lines for a small model), so it goes to a file and is read line by line.
    Its warnings and errors are shown on stderr afterwards under -v, as a normal session's would be."""
    reasons: list[dict[str, str]] = []
    if not wanted:
        yield reasons
        return
    with tempfile.TemporaryFile() as log:
        with redirected(stdout=DEVNULL, stderr=log.fileno()):
            yield reasons
        reasons.extend(refusal_reasons(_lines(log)))
        _show_warnings(log)


def _lines(log: IO[bytes]) -> Iterator[str]:
    log.seek(0)
    for raw in log:
        yield raw.decode("utf-8", errors="replace")


def _show_warnings(log: IO[bytes]) -> None:
    if native_output_shown():
        for line in _lines(log):
            if ortmarkers.any_in(line, ortmarkers.WARNING_OR_WORSE):
                sys.stderr.write(line)
