"""fp16 lint: constants and patterns of a float model that cannot survive an EP computing in fp16 (QNN HTP).

Read from the graph proto alone (constants: inline initializers and Constant nodes; weights in external files are
never read), so it runs before the long compile. Each finding names the node, its op type and why, e.g.

    log: Log of (x*x + 1e-10): 1e-10 is below fp16's smallest normal 6.1e-05 (flushed to 0: Log(0) = -inf)

What fp16 can hold (IEEE binary16): largest finite 65504, smallest normal 6.1e-5, smallest subnormal 6e-8 (HTP
flushes subnormals), ~3 significant digits. The patterns below were the ones that made real models published by
ortcompile wrong or refused on the HTP simulator (issue 21): `Log(x² + 1e-10)` audio front ends, GeM pooling
(`Pow(x, 3)` -> mean -> `Pow(1/3)`), reductions of squares, unguarded `Exp`, -1e9 / float-min attention masks.

Findings are the fallback's first candidates for the CPU EP (compile/fallback.py); `ortcompile inspect --lint`
lists them, and a compile for an fp16 EP warns about the `warning` ones before it starts (the notes under -v): only
the patterns measured to break outputs warn, the others depend on the values (a 1e30 divisor of a Mod the EP
does not take at all is no problem).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ortcompile.jsonedge import JsonObject

if TYPE_CHECKING:
    import numpy as np  # annotations only: numpy comes with onnx's numpy_helper when a constant is decoded

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 6.103515625e-05
LARGE_EXPONENT = 3.0  # x**3 overflows fp16 above |x| = 40 and underflows below |x| = 4e-3 (HTP flushes subnormals)
MANY_ELEMENTS = 1024  # a sum of that many squares of values ~8 passes 65504
MAX_CONSTANT_BYTES = 16 << 20  # constants decoded at most (masks of a 2048-token attention: 16 MiB)
_GUARDED = {"Log", "Sqrt", "Reciprocal", "Div", "Pow", "Rsqrt"}  # ops an epsilon protects from 0 / overflow
_PASS_THROUGH = {"Identity", "Cast", "Reshape", "Unsqueeze", "Squeeze", "Transpose", "Flatten", "Expand"}
_REDUCE_MEANS = {"ReduceMean", "ReduceSum", "GlobalAveragePool", "AveragePool", "GlobalLpPool"}


@dataclass(frozen=True)
class Finding:
    rule: str  # tiny-epsilon, gem-pooling, large-exponent, unguarded-exp, unguarded-log, sum-of-squares, fp16-overflow-constant, isnan-inf
    node: str  # the node's name (its first output when it has none)
    op_type: str
    message: str
    # "warning": patterns measured to make an fp16 EP's outputs wrong (tiny-epsilon, gem-pooling), shown before an fp16
    # compile; "note": patterns that can (inf, overflow), depending on the values: `compile -v` and `inspect --lint`
    severity: str = "warning"
    nodes: tuple[str, ...] = ()  # every node of the pattern (the fallback moves them together), `node` first

    def describe(self) -> str:
        return f"{self.node} ({self.op_type}): {self.message} [{self.rule}]"

    def to_json(self) -> JsonObject:
        return {"rule": self.rule, "node": self.node, "op_type": self.op_type, "message": self.message,
                "severity": self.severity, "nodes": list(self.nodes or (self.node,))}


def node_label(node: Any) -> str:
    """How findings and --cpu-nodes name a node: its name, else its first output."""
    return node.name or (node.output[0] if node.output else node.op_type)


class _Graph:
    """The main graph's producers, consumers, constants and (inferred) shapes."""

    def __init__(self, model: Any) -> None:
        graph = model.graph
        self.nodes = list(graph.node)
        self.producer = {o: n for n in self.nodes for o in n.output if o}
        self.consumers: dict[str, list[Any]] = {}
        for n in self.nodes:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.constants = {t.name: t for t in graph.initializer if not _is_external(t)}
        for n in self.nodes:
            if n.op_type == "Constant" and n.output:
                value = next((a.t for a in n.attribute if a.name == "value"), None)
                if value is not None:
                    self.constants[n.output[0]] = value
        self.shapes = _shapes(model)
        self._values: dict[str, np.ndarray | None] = {}  # decoded constants (None: not decoded)

    def constant(self, name: str) -> Any:
        """The numpy value of a constant input (None when it is computed, stored outside the graph proto, or larger
        than MAX_CONSTANT_BYTES: weights inline in a big model are not decoded for a lint)."""
        from onnx import numpy_helper

        if name in self._values:
            return self._values[name]
        tensor = self.constants.get(name)
        if tensor is None and name in self.producer and self.producer[name].op_type in _PASS_THROUGH:
            value = self.constant(self.producer[name].input[0])
        else:
            value = None if tensor is None or tensor.ByteSize() > MAX_CONSTANT_BYTES else numpy_helper.to_array(tensor)
        self._values[name] = value
        return value

    def scalar(self, name: str) -> float | None:
        value = self.constant(name)
        if value is None or value.size != 1 or value.dtype.kind not in "fiu":
            return None
        return float(value.reshape(-1)[0])

    def source(self, name: str) -> Any:
        """The node computing `name`, looking through reshapes and casts."""
        node = self.producer.get(name)
        while node is not None and node.op_type in _PASS_THROUGH and node.input:
            node = self.producer.get(node.input[0])
        return node

    def users(self, name: str) -> list[Any]:
        """The nodes reading `name`, looking through reshapes and casts."""
        found = []
        for node in self.consumers.get(name, []):
            found.extend(self.users(node.output[0]) if node.op_type in _PASS_THROUGH and node.output else [node])
        return found


def lint_model(model: Any) -> list[Finding]:
    """Every fp16 finding of `model`'s main graph, in graph order, one per node and rule."""
    graph = _Graph(model)
    findings: list[Finding] = []
    for node in graph.nodes:
        for rule in _RULES:
            findings.extend(rule(graph, node))
    seen: set[tuple[str, str]] = set()
    unique = []
    for finding in findings:
        if (finding.rule, finding.node) not in seen:
            seen.add((finding.rule, finding.node))
            unique.append(finding)
    return unique


def lint_path(path: str) -> list[Finding]:
    import onnx

    return lint_model(onnx.load_model(path, load_external_data=False))


def _tiny_epsilon(graph: _Graph, node: Any) -> Iterable[Finding]:
    """`Add(x, eps)` / `Max(x, eps)` / `Clip(x, eps)` with 0 < eps < fp16's smallest normal, before Log/Sqrt/Div/..."""
    if node.op_type not in ("Add", "Max", "Clip") or not node.output:
        return
    operands = node.input[1:3] if node.op_type == "Clip" else node.input
    for name in operands:
        eps = graph.scalar(name) if name else None
        if eps is None or not 0 < abs(eps) < FP16_MIN_NORMAL:
            continue
        # eps + a mean over many elements (a variance: LayerNorm, RMSNorm) is rarely near 0; eps + an element (x*x of
        # silence) often is. Measured: PP-OCRv4's Sqrt(var + 1e-5) LayerNorms are right on the HTP; Log(x*x + 1e-10) is not.
        reduced = any(getattr(graph.source(i), "op_type", "").startswith("Reduce") for i in node.input if i != name)
        for user in graph.users(node.output[0]):
            if user.op_type in _GUARDED and _guards(graph, user, node.output[0]):
                yield Finding("tiny-epsilon", node_label(user), user.op_type,
                              f"{user.op_type} of ({node.op_type} {eps:.3g}): {eps:.3g} is below fp16's smallest normal {FP16_MIN_NORMAL:.2g} "
                              f"(flushed to 0 on an fp16 EP: the guard is gone{' where the mean is 0' if reduced else ''})",
                              severity="note" if reduced else "warning", nodes=_chain(graph, node, user))


def _guards(graph: _Graph, user: Any, name: str) -> bool:
    """Whether an epsilon in `name` protects `user`: a divisor, a Pow's base under an exponent below 1, any other's input."""
    if user.op_type == "Div":
        return len(user.input) > 1 and (user.input[1] == name or graph.source(user.input[1]) is graph.producer.get(name))
    if user.op_type == "Pow":
        exponent = graph.scalar(user.input[1]) if len(user.input) > 1 else None
        return exponent is None or exponent < 1
    return True


def _chain(graph: _Graph, start: Any, end: Any) -> tuple[str, ...]:
    """The pattern's nodes, from the epsilon's producer (and a square feeding it) to the guarded op: moved together."""
    labels = [node_label(end), node_label(start)]
    squared = next((graph.source(i) for i in start.input if graph.source(i) is not None), None)
    if squared is not None and _is_square(graph, squared):
        labels.append(node_label(squared))
    return tuple(labels)


def _is_square(graph: _Graph, node: Any) -> bool:
    if node.op_type == "Mul" and len(node.input) == 2 and node.input[0] == node.input[1]:
        return True
    return node.op_type == "Pow" and len(node.input) > 1 and graph.scalar(node.input[1]) == 2.0


def _pow(graph: _Graph, node: Any) -> Iterable[Finding]:
    """GeM pooling (`Pow(e)` -> mean -> `Pow(1/e)`), else a constant exponent >= 3 on its own."""
    if node.op_type != "Pow" or len(node.input) < 2:
        return
    exponent = graph.scalar(node.input[1])
    if exponent is None or abs(exponent) < LARGE_EXPONENT:
        return
    for reduce in graph.users(node.output[0]):
        if reduce.op_type in _REDUCE_MEANS:
            root = next((u for u in graph.users(reduce.output[0]) if u.op_type == "Pow" and len(u.input) > 1
                         and _close(graph.scalar(u.input[1]), 1.0 / exponent)), None)
            if root is not None:
                yield Finding("gem-pooling", node_label(node), "Pow",
                              f"GeM pooling: Pow {exponent:g} -> {reduce.op_type} -> Pow 1/{exponent:g}: x**{exponent:g} leaves fp16's range "
                              f"below |x| = {FP16_MIN_NORMAL ** (1 / exponent):.2g} and above {FP16_MAX ** (1 / exponent):.3g}",
                              nodes=(node_label(node), node_label(reduce), node_label(root)))
                return
    yield Finding("large-exponent", node_label(node), "Pow",
                  f"Pow with exponent {exponent:g}: overflows fp16 above |x| = {FP16_MAX ** (1 / abs(exponent)):.3g}", severity="note")


def _close(value: float | None, target: float) -> bool:
    return value is not None and math.isclose(value, target, rel_tol=1e-3)


def _unguarded_exp(graph: _Graph, node: Any) -> Iterable[Finding]:
    """Exp overflows fp16 above 11.09: fine after `x - max(x)` or a clip, not on its own."""
    if node.op_type != "Exp" or not node.input:
        return
    source = graph.source(node.input[0])
    if source is not None and (source.op_type in ("Clip", "Min", "Neg", "LogSoftmax", "Softplus", "Relu")
                               or (source.op_type == "Sub" and any(getattr(graph.source(i), "op_type", "") == "ReduceMax" for i in source.input))):
        return
    yield Finding("unguarded-exp", node_label(node), "Exp", "Exp of an unbounded input: overflows fp16 (inf) above 11.09", severity="note")


def _unguarded_log(graph: _Graph, node: Any) -> Iterable[Finding]:
    """Log of something that may be 0 or below fp16's smallest normal (an epsilon too small is tiny-epsilon's)."""
    if node.op_type != "Log" or not node.input:
        return
    source = graph.source(node.input[0])
    if source is None:
        yield Finding("unguarded-log", node_label(node), "Log", "Log of a graph input: -inf where it is 0 or below 6.1e-05 in fp16",
                      severity="note")
        return
    if source.op_type in ("Softmax", "Sigmoid", "Exp", "Softplus"):
        return
    guards = [graph.scalar(i) for i in source.input[1:3] if i] if source.op_type in ("Add", "Max", "Clip") else []
    if any(g is not None and g != 0 for g in guards):
        return  # guarded (tiny-epsilon reports a guard fp16 cannot hold)
    yield Finding("unguarded-log", node_label(node), "Log",
                  f"Log of {source.op_type}'s output with no epsilon: -inf where it is 0 or below 6.1e-05 in fp16", severity="note")


def _sum_of_squares(graph: _Graph, node: Any) -> Iterable[Finding]:
    """ReduceSumSquare / ReduceL2, or a square into ReduceSum/ReduceMean, over many elements: the sum passes 65504."""
    if node.op_type in ("ReduceSumSquare", "ReduceL2"):
        squared = node
    elif node.op_type in ("ReduceSum", "ReduceMean") and node.input and graph.source(node.input[0]) is not None \
            and _is_square(graph, graph.source(node.input[0])):
        squared = graph.source(node.input[0])
    else:
        return
    count = _reduced_count(graph, node)
    if count is not None and count < MANY_ELEMENTS:
        return
    over = f"{count} elements" if count is not None else "an unknown number of elements"
    yield Finding("sum-of-squares", node_label(node), node.op_type,
                  f"sum of squares over {over}: passes fp16's 65504 once the values reach ~{math.sqrt(FP16_MAX / (count or MANY_ELEMENTS)):.2g}",
                  nodes=tuple(dict.fromkeys((node_label(node), node_label(squared)))), severity="note")


def _reduced_count(graph: _Graph, node: Any) -> int | None:
    shape = graph.shapes.get(node.input[0])
    if shape is None or any(d is None for d in shape):
        return None
    axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
    if axes is None and len(node.input) > 1 and node.input[1]:
        value = graph.constant(node.input[1])
        axes = None if value is None else [int(a) for a in value.reshape(-1)]
    axes = axes if axes else list(range(len(shape)))
    return math.prod(shape[a] for a in axes if -len(shape) <= a < len(shape))


def _overflowing_constant(graph: _Graph, node: Any) -> Iterable[Finding]:
    """A constant input beyond ±65504 becomes ±inf in fp16 (-1e9 attention masks: -inf * 0 = NaN)."""
    for name in node.input:
        value = graph.constant(name) if name in graph.constants or name in graph.producer else None
        if value is None or value.dtype.kind != "f" or value.size == 0:
            continue
        finite = value[abs(value) < float("inf")]
        if finite.size and float(abs(finite).max()) > FP16_MAX:
            worst = float(finite.reshape(-1)[abs(finite).reshape(-1).argmax()])
            yield Finding("fp16-overflow-constant", node_label(node), node.op_type,
                          f"constant {name!r} holds {worst:.3g}, beyond fp16's ±65504 (becomes ±inf)", severity="note")
            return


def _isnan_counts_inf(graph: _Graph, node: Any) -> Iterable[Finding]:
    """QNN's HTP answers IsNaN true for ±inf as well (onnxruntime-qnn 2.7.0, tests/test_lint.py measures it): a NaN
    guard there also catches what overflowed fp16, where the CPU EP lets the inf through."""
    if node.op_type == "IsNaN":
        yield Finding("isnan-inf", node_label(node), "IsNaN", "IsNaN on QNN's HTP is true for ±inf too (and fp16 overflows to inf sooner)",
                      severity="note")


_RULES = (_tiny_epsilon, _pow, _unguarded_exp, _unguarded_log, _sum_of_squares, _overflowing_constant, _isnan_counts_inf)


def _is_external(tensor: Any) -> bool:
    return tensor.data_location == 1  # TensorProto.EXTERNAL: never read here


def _shapes(model: Any) -> dict[str, tuple[int | None, ...]]:
    """Tensor name -> static dims (None where unknown), from ONNX shape inference (best effort)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
    except Exception:
        inferred = model
    shapes = {}
    graph = inferred.graph
    for value in (*graph.input, *graph.value_info, *graph.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            shapes[value.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim)
    return shapes
