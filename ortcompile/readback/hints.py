"""What a source graph says about the values its inputs must take.

Read from the **source** model: a compiled model hides the ops inside EPContext nodes. Three facts are
found by following an input through value-preserving ops (Cast, Reshape, Unsqueeze, ...):

- ``indices``: it reaches a Gather (or GatherElements, or an embedding op) as indices into a table with a
  known size N along the gathered axis: values must lie in [0, N), or the model reads past the table; or it is
  one-hot encoded by Equal against a constant 0..N-1 (magika's bytes): classes in [0, N).
- ``constant``: it is compared with Equal against a constant scalar, e.g. a sample rate that selects the
  model's code path: the constant is the value that exercises that path.
- ``values``: it is a Resize's scales or sizes (directly): the values the static shapes around the Resize imply.

Nothing here knows a particular model; name-based guesses (masks, position ids) live in feeds.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import numpy_helper

from ortcompile.onnxfacts import cone, element_count, graph_inputs, input_dims, is_external

# Ops whose output holds (a selection of) their data input's values unchanged: hints flow through them.
# Value: the input positions that carry the data.
PASS_THROUGH = {
    "Cast": (0,), "CastLike": (0,), "Identity": (0,), "Reshape": (0,), "Unsqueeze": (0,), "Squeeze": (0,),
    "Flatten": (0,), "Expand": (0,), "Transpose": (0,), "Slice": (0,), "Tile": (0,), "Split": (0,),
    "Gather": (0,), "GatherElements": (0,), "Concat": None,  # None: every input
}
# (domain, op) -> {indices input position: table input position}; the gathered axis comes from `axis` (default 0).
INDEX_OPS = {
    ("", "Gather"): {1: 0},
    ("", "GatherElements"): {1: 0},
    # ORT's fused BERT embedding: input_ids -> word_embedding, segment_ids -> segment_embedding, position_ids -> position_embedding.
    ("com.microsoft", "EmbedLayerNormalization"): {0: 2, 1: 4, 8: 3},
}
MAX_HOPS = 8  # pass-through ops followed from an input: enough for Cast/Unsqueeze/Reshape chains, cheap on big graphs
SHAPE_INFERENCE_LIMIT = 256 * 2**20  # bytes of graph proto; above this, only shapes already in the proto are used


@dataclass(frozen=True)
class InputHint:
    """Facts about one input's values. `high`: values in [0, high); `value`: the constant it is compared with."""

    high: int | None = None
    value: int | float | None = None
    why: str = ""
    values: tuple[int | float, ...] | None = None  # every element, in order: a Resize's scales or sizes (the shapes around it)


@dataclass
class _Graph:
    consumers: dict[str, list[onnx.NodeProto]]
    constants: dict[str, onnx.TensorProto]  # initializers and Constant outputs, any subgraph
    shapes: dict[str, tuple[int | None, ...]]
    inferred: bool = False  # shape inference ran (once, only when a table's shape is not in the proto)


def read_hints(model: onnx.ModelProto | str | Path) -> dict[str, InputHint]:
    """Hints for every graph input (initializers excluded) the source graph constrains."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)  # dims and small constants only: weights stay on disk
    graph = _index(model)
    hints = {}
    for graph_input in graph_inputs(model.graph):
        if hint := _hint_for(graph_input.name, graph, model):
            hints[graph_input.name] = hint
    return hints


def _hint_for(name: str, graph: _Graph, model: onnx.ModelProto) -> InputHint | None:
    bounds: list[tuple[int, str]] = []
    constants: list[int | float] = []
    for tensor, node in _reached(name, graph):
        if tensor == name and (resize := _resize_hint(node, tensor, graph, model)) is not None:
            return resize
        table = _table_of(node, tensor)
        if table is not None:
            size = _dim(graph, model, table, _axis(node))
            if size:
                bounds.append((size, f"indices into {node.op_type} on {table!r} ({size} along axis {_axis(node)})"))
        elif node.op_type == "Equal" and node.domain in ("", "ai.onnx"):
            other = next((i for i in node.input if i != tensor), None)
            value = _scalar(graph.constants.get(other)) if other else None
            classes = _one_hot_classes(graph.constants.get(other)) if other else None
            if classes:
                bounds.append((classes, f"one-hot against 0..{classes - 1} (Equal on {other!r})"))
            elif value is not None and value not in constants:
                constants.append(value)
    if bounds:
        high, why = min(bounds)  # valid for every table it indexes
        return InputHint(high=high, why=why)
    if constants:
        others = f" (also compared with {', '.join(map(str, constants[1:]))})" if len(constants) > 1 else ""
        return InputHint(value=constants[0], why=f"compared with Equal against {constants[0]}{others}")
    return None


def _resize_hint(node: onnx.NodeProto, tensor: str, graph: _Graph, model: onnx.ModelProto) -> InputHint | None:
    """An input fed as a Resize's `scales` (position 2) or `sizes` (3): random values are no valid scale (ORT refuses
    <= 0), so it gets the ones the shapes around the Resize imply (output / input per axis, or the output's dims), or
    the identity (scales 1, sizes = the input's dims) when the output's shape is not known."""
    if node.op_type != "Resize" or node.domain not in ("", "ai.onnx") or _position(node, tensor) not in (2, 3):
        return None
    _dim(graph, model, node.input[0], 0)  # (shape inference fills in the shapes the proto does not hold)
    rank = len(graph.shapes.get(node.input[0]) or ())
    if not rank:
        return None
    dims_in = [_dim(graph, model, node.input[0], axis) for axis in range(rank)]
    dims_out = [_dim(graph, model, node.output[0], axis) for axis in range(rank)]
    axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), None) or list(range(rank))
    axes = [axis % rank for axis in axes]
    if any(dims_in[axis] is None for axis in axes):
        return None
    known = all(dims_out[axis] is not None for axis in axes)
    if _position(node, tensor) == 2:
        values: tuple[int | float, ...] = tuple(dims_out[a] / dims_in[a] if known else 1.0 for a in axes)  # type: ignore[operator]
    else:
        values = tuple(dims_out[a] if known else dims_in[a] for a in axes)  # type: ignore[misc]
    what = "scales" if _position(node, tensor) == 2 else "sizes"
    shapes = f"output {[dims_out[a] for a in axes]} from input {[dims_in[a] for a in axes]}" if known else "the identity: the output's shape is not known"
    return InputHint(values=values, why=f"the {what} of Resize {node.name or node.output[0]!r}: {shapes}")


def _reached(name: str, graph: _Graph) -> Iterator[tuple[str, onnx.NodeProto]]:
    """(tensor, consuming node) for the input and every tensor it flows into through pass-through ops."""
    frontier, seen = [name], {name}
    for _ in range(MAX_HOPS):
        following = []
        for tensor in frontier:
            for node in graph.consumers.get(tensor, []):
                yield tensor, node
                carriers = PASS_THROUGH.get(node.op_type, ())
                if node.domain in ("", "ai.onnx") and (carriers is None or _position(node, tensor) in carriers):
                    following += [o for o in node.output if o and o not in seen]
                    seen.update(node.output)
        frontier = following
        if not frontier:
            return


def _position(node: onnx.NodeProto, tensor: str) -> int:
    return list(node.input).index(tensor)


def _table_of(node: onnx.NodeProto, tensor: str) -> str | None:
    positions = INDEX_OPS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type), {})
    for index_pos, table_pos in positions.items():
        if index_pos < len(node.input) and node.input[index_pos] == tensor and table_pos < len(node.input) and node.input[table_pos]:
            return node.input[table_pos]
    return None


def _axis(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 0)


def _scalar(tensor: onnx.TensorProto | None) -> int | float | None:
    """The value of a one-element constant (not external: those are never scalars in practice)."""
    if tensor is None or is_external(tensor) or element_count(tensor.dims) != 1:
        return None
    try:
        value = numpy_helper.to_array(tensor).reshape(())
    except Exception:  # an element type numpy cannot hold: no hint
        return None
    return value.item() if value.dtype.kind in "iufb" else None


def _one_hot_classes(tensor: onnx.TensorProto | None) -> int | None:
    """N when an integer constant holds exactly 0..N-1 along its one long axis: Equal against it is a one-hot
    encoding (jax/TF exports of one_hot), so the input's values are classes in [0, N)."""
    if tensor is None or is_external(tensor) or not 1 < element_count(tensor.dims) <= 1 << 16:
        return None
    try:
        values = numpy_helper.to_array(tensor).reshape(-1)
    except Exception:  # an element type numpy cannot hold: no hint
        return None
    if values.dtype.kind not in "iu" or not (values == range(values.size)).all():
        return None
    return int(values.size)


def _dim(graph: _Graph, model: onnx.ModelProto, tensor: str, axis: int) -> int | None:
    shape = graph.shapes.get(tensor)
    if shape is None and not graph.inferred:
        graph.shapes.update(_inferred_shapes(model))
        graph.inferred = True
        shape = graph.shapes.get(tensor)
    if not shape or not -len(shape) <= axis < len(shape):
        return None
    return shape[axis] if shape[axis] and shape[axis] > 0 else None


def _inferred_shapes(model: onnx.ModelProto) -> dict[str, tuple[int | None, ...]]:
    """Shapes from ONNX shape inference, for tables that are computed (not initializers); best effort."""
    if model.ByteSize() > SHAPE_INFERENCE_LIMIT:
        return {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # inference failing on an exotic graph only means fewer hints
        return {}
    return {v.name: _value_shape(v) for v in inferred.graph.value_info}


def _value_shape(value: onnx.ValueInfoProto) -> tuple[int | None, ...]:
    return tuple(d if isinstance(d, int) else None for d in input_dims(value))


def _index(model: onnx.ModelProto) -> _Graph:
    graph = _Graph(defaultdict(list), {}, {})
    for value in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            graph.shapes[value.name] = _value_shape(value)
    _index_graph(model.graph, graph)
    return graph


def _index_graph(body: onnx.GraphProto, graph: _Graph) -> None:
    """Consumers and constants of a graph and its subgraphs (If/Loop bodies read outer names directly)."""
    for tensor in body.initializer:
        graph.constants[tensor.name] = tensor
        graph.shapes[tensor.name] = tuple(tensor.dims)
    for node in body.node:
        for name in node.input:
            if name:
                graph.consumers[name].append(node)
        for attribute in node.attribute:
            if node.op_type == "Constant" and attribute.name == "value":
                graph.constants[node.output[0]] = attribute.t
                graph.shapes[node.output[0]] = tuple(attribute.t.dims)
            for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                _index_graph(sub, graph)


def freeze_suggestion(model: onnx.ModelProto) -> str:
    """'--freeze sr=16000' when an If switches on an input compared with a constant: what to try when pins fail."""
    ifs = [n for n in model.graph.node if n.op_type == "If"]
    if not ifs:
        return ""
    hints = read_hints(model)
    compared = {name: hint.value for name, hint in hints.items() if hint.value is not None}
    readers = {i for node in ifs for n in cone(model.graph, node.input[0]) for i in n.input if i in compared}
    readers |= {node.input[0] for node in ifs if node.input[0] in compared}
    flags = " ".join(f"--freeze {name}={compared[name]}" for name in sorted(readers))
    return f"; the model switches networks on {', '.join(sorted(readers))}: try {flags}" if flags else ""
