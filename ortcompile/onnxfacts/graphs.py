"""Graph facts: walking the main graph, subgraphs (If/Loop/Scan) and model functions; their tensors, inputs
and op counts. Importing this module does not import onnx (see the package docstring)."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Literal, NamedTuple

from ortcompile.onnxfacts.tensors import (
    ATTR_GRAPH,
    ATTR_GRAPHS,
    ATTR_SPARSE_TENSOR,
    ATTR_SPARSE_TENSORS,
    ATTR_TENSOR,
    ATTR_TENSORS,
    external_ref,
    proto_text,
)

if TYPE_CHECKING:
    import onnx
    from onnx import AttributeProto, TensorProto


class GraphSite(NamedTuple):
    path: str  # "" for the main graph; "If_0/then_branch", "Loop_3/body/If_1/else_branch", "function:dom:f/If_0/..."
    graph: onnx.GraphProto


TensorKind = Literal["initializer", "sparse_initializer", "attribute"]


class TensorSite(NamedTuple):
    graph: str  # the GraphSite path holding it ("function:<domain>:<name>" for a function body)
    name: str  # initializer name; for a Constant node, its output (the initializer ORT makes of it)
    tensor: TensorProto
    kind: TensorKind


def iter_graphs(model: onnx.ModelProto) -> Iterator[GraphSite]:
    """The main graph, then every subgraph (If/Loop/Scan bodies, nested), those inside model functions too."""
    yield GraphSite("", model.graph)
    yield from _subgraphs(model.graph.node, "")
    for function in model.functions:
        yield from _subgraphs(function.node, _function_path(function))


def iter_initializers(model: onnx.ModelProto) -> Iterator[TensorSite]:
    """Every graph's initializers (subgraphs' too), in graph order."""
    for site in iter_graphs(model):
        for tensor in site.graph.initializer:
            yield TensorSite(site.path, tensor.name, tensor, "initializer")


def iter_tensors(model: onnx.ModelProto) -> Iterator[TensorSite]:
    """Every TensorProto in the model: initializers, sparse initializers (values and indices), and tensor
    attributes (Constant values included) in every graph and model function. Each can carry external data."""
    for site in iter_graphs(model):
        for tensor in site.graph.initializer:
            yield TensorSite(site.path, tensor.name, tensor, "initializer")
        for sparse in site.graph.sparse_initializer:
            for tensor in (sparse.values, sparse.indices):
                yield TensorSite(site.path, sparse.values.name, tensor, "sparse_initializer")
        yield from _attribute_tensors(site.graph.node, site.path)
    for function in model.functions:
        yield from _attribute_tensors(function.node, _function_path(function))


def graph_tensor_names(graph: onnx.GraphProto) -> set[str]:
    """Names of one graph's own tensors: initializers and Constant outputs (ORT makes those initializers)."""
    return {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}


def graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """The inputs a caller feeds: graph inputs that are not also initializers (IR < 4 models list both)."""
    initializers = {t.name for t in graph.initializer}
    return [v for v in graph.input if v.name not in initializers]


def op_counts(nodes: Iterable[onnx.NodeProto], exclude: Iterable[str] = ()) -> dict[str, int]:
    """Op type -> number of nodes, sorted by op type."""
    skip = set(exclude)
    return dict(sorted(collections.Counter(proto_text(n.op_type) for n in nodes if n.op_type not in skip).items()))


def _subgraphs(nodes: Iterable[onnx.NodeProto], path: str) -> Iterator[GraphSite]:
    for index, node in enumerate(nodes):
        for attribute in node.attribute:
            for suffix, graph in _attribute_graphs(attribute):
                sub_path = "/".join(p for p in (path, _node_label(node, index), attribute.name + suffix) if p)
                yield GraphSite(sub_path, graph)
                yield from _subgraphs(graph.node, sub_path)


def _attribute_graphs(attribute: AttributeProto) -> list[tuple[str, onnx.GraphProto]]:
    """Graphs an attribute holds, by its declared type (ORT ignores fields the type does not name)."""
    if attribute.type == ATTR_GRAPH:
        return [("", attribute.g)]
    if attribute.type == ATTR_GRAPHS:
        return [(f"[{i}]", g) for i, g in enumerate(attribute.graphs)]
    return []


def _attribute_tensors(nodes: Iterable[onnx.NodeProto], path: str) -> Iterator[TensorSite]:
    for index, node in enumerate(nodes):
        for attribute in node.attribute:
            name = node.output[0] if node.op_type == "Constant" and node.output else f"{_node_label(node, index)}/{attribute.name}"
            for tensor in _attribute_tensor_protos(attribute):
                yield TensorSite(path, name, tensor, "attribute")


def _attribute_tensor_protos(attribute: AttributeProto) -> list[TensorProto]:
    kind = attribute.type
    if kind == ATTR_TENSOR:
        return [attribute.t]
    if kind == ATTR_TENSORS:
        return list(attribute.tensors)
    if kind == ATTR_SPARSE_TENSOR:
        return [attribute.sparse_tensor.values, attribute.sparse_tensor.indices]
    if kind == ATTR_SPARSE_TENSORS:
        return [t for s in attribute.sparse_tensors for t in (s.values, s.indices)]
    return []


def _node_label(node: onnx.NodeProto, index: int) -> str:
    return proto_text(node.name) or f"{proto_text(node.op_type)}#{index}"


def _function_path(function: onnx.FunctionProto) -> str:
    return f"function:{proto_text(function.domain)}:{proto_text(function.name)}"


def external_locations(model: onnx.ModelProto) -> list[str]:
    """Every external-data location the model's tensors name (all graphs), each once, sorted."""
    return sorted({ref.location for site in iter_tensors(model) if (ref := external_ref(site.tensor))})


# ---------------------------------------------------------------- inputs

def input_dims(value_info: onnx.ValueInfoProto) -> tuple[int | str | None, ...]:
    """Each dimension: int when fixed, the dim_param when symbolic, None when unknown (a negative dim_value
    such as -1 too). A tensor without a shape (or not a tensor) gives ()."""
    tensor_type = value_info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return ()
    return tuple(_dim(d) for d in tensor_type.shape.dim)


def _dim(dim: onnx.TensorShapeProto.Dimension) -> int | str | None:
    kind = dim.WhichOneof("value")
    if kind == "dim_value":
        return int(dim.dim_value) if dim.dim_value >= 0 else None
    if kind == "dim_param":
        name = proto_text(dim.dim_param)
        return None if name in ("", "?") else name  # "?" is how some exporters write "unknown": not a shared symbol
    return None


def cone(graph: onnx.GraphProto, target: str) -> list[onnx.NodeProto]:
    """The nodes `target` is computed from, in graph order."""
    producer = {o: n for n in graph.node for o in n.output}
    needed, stack, seen = [], [target], set()
    while stack:
        name = stack.pop()
        if name in seen or name not in producer:
            continue
        seen.add(name)
        node = producer[name]
        needed.append(node)
        stack.extend(i for i in node.input if i)
    order = {id(n): k for k, n in enumerate(graph.node)}
    return sorted({id(n): n for n in needed}.values(), key=lambda n: order[id(n)])


def tiny_static_model() -> onnx.ModelProto:
    """y = x + x on float[1, 8]: every EP takes it. Used to probe and to warm up EPs."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model
