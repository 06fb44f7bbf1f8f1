"""Where the EP starts computing something else: the first nodes whose results diverge from the CPU EP's.

When the pre-publish check finds an output outside its criterion, a diagnostic copy of the graph the EP compiled
(the prepared model), with every intermediate float tensor made a graph output, is run on the EP (compiled in the
session, with the same CPU pins) and on the CPU EP, on the inputs of the set that failed (the same seed, edge set or
sample, the same given inputs). `verify` does the same on the source it is given, when its comparison fails.
Each node's outputs are judged by the check's criterion, in graph order; a node *diverges first* when one of its
outputs fails while every tensor it reads passes (or is an input or a constant). Runs in the worker child.
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile.eps.catalog import CPU_EP
from ortcompile.eps.request import EpRequest
from ortcompile.jsonedge import JsonObject
from ortcompile.progress import Reporter
from ortcompile.readback.compare import compare_output
from ortcompile.readback.criteria import Criterion
from ortcompile.readback.feeds import Arrays, InputSpec, specs_from_session
from ortcompile.readback.given import Given
from ortcompile.readback.lint import node_label
from ortcompile.readback.placement import assigned_nodes
from ortcompile.readback.setfeeds import set_feeds
from ortcompile.run.sessions import RECORD_ASSIGNMENT, open_session, run_session

DIAGNOSTIC_SUFFIX = ".diagnostic.onnx"
_FLOAT_TYPES = {1, 10, 11, 16}  # float, float16, double, bfloat16
EXPOSED_BYTES = 1 << 30  # intermediates kept as outputs at most (each session holds them all at once, 2x with both)
INTERMEDIATE_SNR_DB = 40.0  # tolerance criteria (fp32 EPs) name no SNR: an fp32 EP's intermediates sit far above this


@dataclass(frozen=True)
class LocalizeRequest:
    model: Path  # the graph the EP compiled (the prepared model, or the source)
    source: Path  # for input hints
    ep: EpRequest  # with the CPU pins of the compile (op_affinity) in its options
    criterion: Criterion
    dims: dict[str, int] = field(default_factory=dict)
    seed: int = 0
    given: dict[str, Given] = field(default_factory=dict)
    input_set: str = ""  # the failing input set ("seed 0", "silence", "sample a.npz"): its inputs are the ones run


@dataclass(frozen=True)
class DivergenceRow:
    """One node output of the diagnostic run: where the node ran and how far it is from the CPU EP's."""

    node: str  # lint.node_label
    op_type: str
    ep: str  # where the node ran
    tensor: str
    ok: bool
    snr_db: float | None  # to 0.01 dB; None: not finite or not known
    max_abs: float | None  # None: not finite (`nonfinite` counts it) or not comparable
    nonfinite: int
    reason: str
    reads: tuple[str, ...]  # the nodes whose outputs it reads

    def to_json(self) -> JsonObject:
        return {"node": self.node, "op_type": self.op_type, "ep": self.ep, "tensor": self.tensor, "ok": self.ok, "snr_db": self.snr_db,
                "max_abs": self.max_abs, "nonfinite": self.nonfinite, "reason": self.reason, "reads": list(self.reads)}


@dataclass
class Divergence:
    rows: list[DivergenceRow] = field(default_factory=list)  # per node output, in graph order
    first: list[DivergenceRow] = field(default_factory=list)  # the rows of the nodes that diverge first
    error: str = ""  # why nothing could be localized

    def summary(self) -> str:
        """One line: the first diverging node(s), op types and the error measured."""
        if self.error:
            return f"could not localize the divergence: {self.error}"
        if self.agrees:
            return ("every node agrees on the EP with the CPU EP when the graph runs in a session: what differs is the "
                    "compiled model, not how the EP computes this graph")
        if not self.first:
            return "no single node diverges beyond the criterion: the error builds up over many nodes"
        shown = ", ".join(f"{r.node!r} ({r.op_type} on {_short(r.ep)}: {describe_error(r)})" for r in self.first[:3])
        more = f" and {len(self.first) - 3} more" if len(self.first) > 3 else ""
        return f"first diverging node{'s' if len(self.first) > 1 else ''}: {shown}{more}"

    @property
    def agrees(self) -> bool:
        """Every node's outputs (the graph's outputs too) agree: the EP computes this graph right."""
        return bool(self.rows) and all(r.ok for r in self.rows)

    def to_json(self) -> JsonObject:
        return {"first": [r.to_json() for r in self.first], "rows": [r.to_json() for r in self.rows], "error": self.error}


def describe_error(row: DivergenceRow) -> str:
    parts = [f"SNR {row.snr_db:.1f} dB" if row.snr_db is not None else "", f"max abs diff {row.max_abs:.3g}" if row.max_abs is not None else "",
             f"{row.nonfinite} non-finite" if row.nonfinite else ""]
    return ", ".join(p for p in parts if p) or row.reason


def _short(ep: str) -> str:
    return "CPU" if ep == CPU_EP else ep.removesuffix("ExecutionProvider")


def localize_in_child(request: LocalizeRequest, reporter: Reporter) -> Divergence:
    """In the worker child: run the diagnostic copy on the EP and on the CPU EP and compare node by node."""
    import onnx


    reporter.stage(f"localizing the divergence in {request.model.name}")
    model = onnx.load_model(str(request.model), load_external_data=False)
    producers = _expose_intermediates(model, request.dims)
    diagnostic = request.model.with_name(request.model.name + DIAGNOSTIC_SUFFIX)
    onnx.save_model(model, str(diagnostic))  # beside the model: its external data resolves as the model's does
    try:
        cpu = open_session(diagnostic, None, request.dims, label="the diagnostic copy on the CPU EP")
        feeds = _feeds_of_set(request, specs_from_session(cpu.session))
        want = run_session(cpu.session, feeds, "the diagnostic copy")
        del cpu
        gc.collect()
        ep = request.ep.resolve()
        timed = open_session(diagnostic, ep, request.dims, config={RECORD_ASSIGNMENT: "1"}, label=f"the diagnostic copy on {ep.name}")
        placed = {n.name: ep_name for ep_name, nodes in assigned_nodes(timed.session).items() for n in nodes}
        got = run_session(timed.session, feeds, "the diagnostic copy", ep)
        del timed
        gc.collect()
    finally:
        diagnostic.unlink(missing_ok=True)
    rows = []
    failing: set[str] = set()
    for node in model.graph.node:
        for tensor in node.output:
            if tensor not in got or tensor not in want:
                continue
            comparison = compare_output(tensor, got[tensor], want[tensor], request.criterion)
            ok = _agrees(comparison, request.criterion)
            rows.append(DivergenceRow(node_label(node), node.op_type, placed.get(node.name, ep.name), tensor, ok, _round(comparison.snr_db),
                                      _finite(comparison.max_abs), comparison.nonfinite, comparison.reason,
                                      tuple(producers[i] for i in node.input if i in producers)))
            if not ok:
                failing.add(tensor)
    first = [r for r in rows if not r.ok and not any(t in failing for t in _inputs_of(model, r.tensor))]
    return Divergence(rows, _one_per_node(first))


def _feeds_of_set(request: LocalizeRequest, specs: list[InputSpec]) -> Arrays:
    """The inputs of the set that failed, made as the check and verify make them (else the first set's)."""
    chosen = set_feeds(request.source, specs, (request.seed,), request.dims, request.given)
    names = [s.name for s in chosen.sets]
    return chosen.arrays[names.index(request.input_set)] if request.input_set in names else chosen.arrays[0]


def divergence_table(divergence: Divergence, limit: int = 40) -> list[str]:
    """-v: node by node, where it ran and how far its output is from the CPU EP's."""
    rows = divergence.rows
    lines = [f"  {'ok' if r.ok else 'DIFF':4} {r.node} ({r.op_type}, {_short(r.ep)}): {describe_error(r)}" for r in rows[:limit]]
    if len(rows) > limit:
        lines.append(f"  ... {len(rows) - limit} more in --json")
    return lines


def _agrees(comparison: Any, criterion: Criterion) -> bool:
    """An intermediate tensor agrees when its SNR reaches the criterion's (or it is exact) and it has no inf/NaN the
    reference lacks. Not by the elementwise tolerance: an intermediate's scale is arbitrary (GeM's cubes are ~1e-6,
    all within atol 5e-3 of 0 when fp16 flushes them)."""
    if comparison.max_abs is None:  # not comparable element by element (another shape or type)
        return comparison.ok
    if comparison.exact or comparison.dtype[:5] not in ("float", "bfloa"):
        return comparison.ok
    if comparison.nonfinite:
        return False
    floor = criterion.min_snr_db if criterion.min_snr_db is not None else INTERMEDIATE_SNR_DB
    return comparison.snr_db is None or comparison.snr_db >= floor


def _expose_intermediates(model: Any, dims: dict[str, int]) -> dict[str, str]:
    """Every float tensor a main-graph node computes becomes a graph output (types from shape inference, where
    known); returns tensor -> the label of the node producing it."""
    import onnx
    from onnx import helper

    _pin_input_dims(model, dims)  # else inference invents dims of unknown size, and the size budget guesses them large
    types: dict[str, Any] = {}  # tensor name -> onnx.ValueInfoProto (onnx is imported in the function)
    for data_prop in (True, False):  # data propagation carries a pinned dim through Shape -> Reshape (magika's batch)
        try:
            inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=data_prop)
            types = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output)}
            break
        except Exception:
            continue
    outputs = {o.name for o in model.graph.output}
    producers, exposed = {}, 0
    for node in model.graph.node:
        for tensor in node.output:
            if not tensor:
                continue
            producers[tensor] = node_label(node)
            info = types.get(tensor)
            if tensor in outputs or info is None or info.type.tensor_type.elem_type not in _FLOAT_TYPES:
                continue
            size = _nbytes(info, dims)
            if exposed + size > EXPOSED_BYTES:  # the earliest tensors that fit are kept (one huge tensor skips only itself)
                continue
            exposed += size
            model.graph.output.append(helper.make_value_info(tensor, info.type))
            outputs.add(tensor)
    return producers


def _pin_input_dims(model: Any, dims: dict[str, int]) -> None:
    """The symbolic dims of the graph's inputs at the values run (the session pins them the same way)."""
    for graph_input in model.graph.input:
        for dim in graph_input.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in dims:
                dim.dim_value = dims[dim.dim_param]


def _nbytes(info: Any, dims: dict[str, int]) -> int:
    """An intermediate's size from its inferred shape, symbolic dims at the values run (a source given to verify
    keeps them); other unknown dims count as 1024, a guess on the large side."""
    sizes = [d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, 1024) for d in info.type.tensor_type.shape.dim]
    return 4 * math.prod(sizes)


def _inputs_of(model: Any, tensor: str) -> list[str]:
    for node in model.graph.node:
        if tensor in node.output:
            return list(node.input)
    return []


def _one_per_node(rows: list[DivergenceRow]) -> list[DivergenceRow]:
    seen: set[str] = set()
    unique = []
    for row in rows:
        if row.node not in seen:
            seen.add(row.node)
            unique.append(row)
    return unique


def _round(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 2)


def _finite(value: float | None) -> float | None:
    """JSON has no inf/NaN (--json is strict): an infinite difference is reported as unknown (`nonfinite` counts it)."""
    return None if value is None or not math.isfinite(value) else value
