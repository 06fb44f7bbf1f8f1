"""Facts about ONNX protos: external-data references, tensor byte sizes, subgraphs, EPContext nodes, input shapes.

Every reader asks here instead of parsing fields by hand, so each rule is written once: what a missing
`length` means, how INT4 packs, which attribute says a blob is embedded, what a dim of -1 is. Nothing here
opens a file; `ortcompile.paths.resolve_inside` decides whether a location may be opened.

Readers come in two kinds: the compile path refuses a malformed model (`MalformedTensor`, a ValueError),
while `inspect` reports what it can (`lenient_external_ref`, `EpContextAttrs.problems`).

Importing this module does not import onnx (200 ms): modules on the CLI's light paths (`--help`,
`--if-changed`: graphpass, datapass, publish) may use it at top level. Functions that take a proto need
no import (the caller has onnx loaded); the few that need onnx's own code import it when called.
"""

from __future__ import annotations

import collections
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    import onnx
    from onnx import AttributeProto, TensorProto

EPCONTEXT = "EPContext"
INT64_MAX = 2**63 - 1

# ONNX data types with a fixed size: (name, TensorProto.DataType number, bits per element). The numbers are
# fixed by the protobuf schema (tests check them against onnx). Sub-byte types are packed, so n elements
# take ceil(n * bits / 8) bytes (the ONNX IR spec; onnx.helper.make_tensor checks raw data by this rule).
# STRING and UNDEFINED have no size; a type onnx adds later counts as unknown (size None) until it is
# listed here, and tests/test_onnxfacts.py fails to say so.
DATA_TYPES = (
    ("FLOAT", 1, 32), ("UINT8", 2, 8), ("INT8", 3, 8), ("UINT16", 4, 16), ("INT16", 5, 16), ("INT32", 6, 32),
    ("INT64", 7, 64), ("BOOL", 9, 8), ("FLOAT16", 10, 16), ("DOUBLE", 11, 64), ("UINT32", 12, 32),
    ("UINT64", 13, 64), ("COMPLEX64", 14, 64), ("COMPLEX128", 15, 128), ("BFLOAT16", 16, 16),
    ("FLOAT8E4M3FN", 17, 8), ("FLOAT8E4M3FNUZ", 18, 8), ("FLOAT8E5M2", 19, 8), ("FLOAT8E5M2FNUZ", 20, 8),
    ("UINT4", 21, 4), ("INT4", 22, 4), ("FLOAT4E2M1", 23, 4), ("FLOAT8E8M0", 24, 8), ("UINT2", 25, 2),
    ("INT2", 26, 2), ("FLOAT6E2M3", 27, 6), ("FLOAT6E3M2", 28, 6),
)
_BITS = {number: bits for _, number, bits in DATA_TYPES}

# Enum numbers of the protobuf schema (checked against onnx in the tests), so no `import onnx` is needed.
EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
STRING = 8  # TensorProto.DataType.STRING: no fixed size; ORT never moves such a tensor out of the proto
ATTR_INT, ATTR_STRING, ATTR_TENSOR, ATTR_GRAPH = 2, 3, 4, 5  # AttributeProto.AttributeType
ATTR_TENSORS, ATTR_GRAPHS, ATTR_SPARSE_TENSOR, ATTR_SPARSE_TENSORS = 9, 10, 11, 12

# The external-data keys ORT reads; it refuses a model with any other key except its own "prepacked*" ones
# (onnx also defines "basepath", which ORT refuses).
_ORT_KEYS = frozenset({"location", "offset", "length", "checksum"})
# What ORT (strtoll, base 10) and onnx (int()) both read as the same number: no "0x", "1_000", "٣" or "5 ".
_DECIMAL = re.compile(r"[ \t\n\v\f\r]*[+-]?([0-9]+)")
_SHOWN_DIGITS = 40  # a number this long is still quoted in a message (int64 has 19 digits)


class MalformedTensor(ValueError):
    """A tensor field that cannot be read as ONNX defines it; `problem` completes "tensor 'W' ...".

    For an external offset or length beyond the int64 range, `field` names it and `number` is its value, so a
    reader can say what it would have meant (e.g. how far into the file it points).
    """

    def __init__(self, tensor: str | bytes, problem: str, field: str = "", number: int | None = None) -> None:
        self.tensor = tensor
        self.problem = problem
        self.field = field
        self.number = number
        super().__init__(f"tensor {tensor!r} {problem}")


# ---------------------------------------------------------------- sizes

def dtype_name(data_type: int) -> str | None:
    """ONNX's name for a data type ("FLOAT", "INT4"), or None for a number this onnx does not define."""
    from onnx import TensorProto

    try:
        return TensorProto.DataType.Name(data_type)
    except ValueError:
        return None


def element_bits(data_type: int) -> int | None:
    """Bits one element takes when packed; None for STRING, UNDEFINED and unknown types."""
    return _BITS.get(data_type)


def element_size(data_type: int) -> int | None:
    """Bytes per element rounded up to a whole byte (1 for packed sub-byte types): the alignment a tensor needs."""
    bits = element_bits(data_type)
    return None if bits is None else -(-bits // 8)


def element_count(shape: Iterable[int]) -> int:
    """Elements in a tensor of this shape (1 for a scalar)."""
    return math.prod(int(d) for d in shape)


def tensor_nbytes(data_type: int, shape: Iterable[int]) -> int | None:
    """Exact bytes of a tensor's data as ONNX stores it (raw or external); None when the type has no fixed size.

    Raises ValueError for a negative dimension.
    """
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimension in shape {dims}")
    bits = element_bits(data_type)
    if bits is None:
        return None
    return -(-math.prod(dims) * bits // 8)


def inline_nbytes(tensor: TensorProto) -> int:
    """Bytes a tensor holds in the proto itself: raw_data, else what its typed fields stand for, else its strings."""
    if tensor.raw_data:
        return len(tensor.raw_data)
    expected = _shape_nbytes(tensor)
    if expected is not None:
        return expected
    return sum(len(s) for s in tensor.string_data)


def stored_nbytes(tensor: TensorProto) -> int | None:
    """Bytes of a tensor's data wherever it is stored: its external length (missing: its own size), else inline.

    Raises MalformedTensor for unreadable external fields, a negative dimension, or an external length that
    disagrees with the type and shape. None only for an external tensor of a type without a fixed size
    (STRING, unknown) whose length is not written.
    """
    ref = external_ref(tensor)
    if ref is None:
        return inline_nbytes(tensor)
    expected = _shape_nbytes(tensor)
    if ref.length is None:
        return expected
    if expected is not None and ref.length != expected:
        raise MalformedTensor(tensor.name, f"has external length {ref.length} but its shape {list(tensor.dims)} of "
                                           f"{dtype_name(tensor.data_type)} needs {expected} bytes")
    return ref.length


def _shape_nbytes(tensor: TensorProto) -> int | None:
    try:
        return tensor_nbytes(tensor.data_type, tensor.dims)
    except ValueError:
        raise MalformedTensor(tensor.name, f"has a negative dimension in its shape {list(tensor.dims)}") from None


# ---------------------------------------------------------------- external data

@dataclass(frozen=True)
class ExternalRef:
    """An external-data reference as written in the model (location relative to the model's directory)."""

    location: str
    offset: int = 0
    length: int | None = None  # None: not written, which ONNX defines as the tensor's own size
    checksum: str | None = None
    unknown_keys: tuple[str, ...] = ()  # keys ORT does not read: it refuses to load such a model

    def length_or(self, own_size: int | None) -> int | None:
        """The bytes this reference covers, given the tensor's own size for a reference without a length."""
        return self.length if self.length is not None else own_size


def is_external(tensor: TensorProto) -> bool:
    """ORT reads `external_data` only when `data_location` says EXTERNAL; otherwise it is ignored."""
    return tensor.data_location == EXTERNAL


def external_ref(tensor: TensorProto) -> ExternalRef | None:
    """The tensor's external-data reference, None when its data is inline; MalformedTensor when unreadable."""
    if not is_external(tensor):
        return None
    ref, problems = _parse_external(tensor)
    if problems:
        raise MalformedTensor(tensor.name, *problems[0])
    return ref


def lenient_external_ref(tensor: TensorProto) -> tuple[ExternalRef | None, tuple[str, ...]]:
    """For readers that report: (reference with each unreadable field at its default, the problems found).

    Problems complete "tensor 'W' ..." like MalformedTensor.problem. The location is "" when missing.
    """
    if not is_external(tensor):
        return None, ()
    ref, problems = _parse_external(tensor)
    return ref, tuple(p.text for p in problems)


class _Problem(NamedTuple):
    text: str
    field: str = ""
    number: int | None = None  # an offset or length beyond the int64 range


def _parse_external(tensor: TensorProto) -> tuple[ExternalRef, list[_Problem]]:
    from onnx.external_data_helper import ExternalDataInfo

    problems: list[_Problem] = []
    fields: dict[str, str] = {}
    unknown: list[str] = []
    for entry in tensor.external_data:
        key, value = entry.key, entry.value
        if isinstance(key, bytes) or isinstance(value, bytes):  # protobuf's answer to a string that is not UTF-8
            problems.append(_Problem("has external data fields that are not valid UTF-8"))
        elif key not in _ORT_KEYS:
            if not key.startswith("prepacked"):
                unknown.append(key)
        elif value:  # ORT skips an empty value: it means "not written"; the last written one wins
            fields[key] = value
    for key in ("offset", "length"):
        if key in fields:
            number, problem = _read_number(key, fields.pop(key))
            if problem:
                problems.append(_Problem(problem, key, number if number > INT64_MAX else None))
            else:
                fields[key] = str(number)  # canonical digits: onnx's int() then reads what ORT's strtoll reads
    info = ExternalDataInfo(_external_view(fields))  # onnx's own reading of the fields, now known to be sound
    if not info.location:
        problems.append(_Problem("is external but has no location"))
    ref = ExternalRef(info.location, info.offset or 0, info.length, info.checksum, tuple(unknown))
    return ref, problems


def _read_number(key: str, value: str) -> tuple[int, str]:
    """(value, "") or (value or 0, the problem): an offset or length as ORT reads it, within int64 and not negative."""
    match = _DECIMAL.fullmatch(value)
    if not match:
        return 0, f"has a non-numeric external {key} {value[:40]!r}"
    digits = match.group(1).lstrip("0") or "0"
    if len(digits) > _SHOWN_DIGITS:  # beyond int64 whatever the digits; int() of thousands of them is refused
        return 0, f"has an external {key} of {len(digits)} digits, beyond the int64 range"
    number = -int(digits) if value.lstrip().startswith("-") else int(digits)
    if number < 0:
        return number, f"has a negative external {key} {number}"
    if number > INT64_MAX:
        return number, f"has an external {key} {number} beyond the int64 range"
    return number, ""


def _external_view(fields: dict[str, str]) -> TensorProto:
    """A tensor holding only the given external-data fields (no data): what ExternalDataInfo parses."""
    from onnx import TensorProto

    view = TensorProto(data_location=EXTERNAL)
    for key, value in fields.items():
        view.external_data.add(key=key, value=value)
    return view


def external_locations(model: onnx.ModelProto) -> list[str]:
    """Every external-data location the model's tensors name (all graphs), each once, sorted."""
    return sorted({ref.location for site in iter_tensors(model) if (ref := external_ref(site.tensor))})


# ---------------------------------------------------------------- graphs and tensors

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
    return dict(sorted(collections.Counter(_text(n.op_type) for n in nodes if n.op_type not in skip).items()))


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
    return _text(node.name) or f"{_text(node.op_type)}#{index}"


def _function_path(function: onnx.FunctionProto) -> str:
    return f"function:{_text(function.domain)}:{_text(function.name)}"


# ---------------------------------------------------------------- EPContext nodes

@dataclass(frozen=True)
class EpContextAttrs:
    """An EPContext node's attributes (com.microsoft schema defaults when absent).

    An attribute present with the wrong type reads as None (ints) or "" / b"" and is named in `problems`:
    ORT itself refuses such a node, readers decide whether to refuse or report.
    """

    embed_mode: int | None = 1  # 1: `cache` is the context itself; 0: `cache` names a file beside the model
    main_context: int | None = 1  # QNN: the one node holding the shared context; others have no cache
    cache: bytes = field(default=b"", repr=False)  # ep_cache_context: the context itself, or a file name
    source: str = ""  # the EP (or SDK tool) that produced it
    partition_name: str = ""
    ep_sdk_version: str = ""
    hardware_architecture: str = ""
    onnx_model_filename: str = ""
    notes: str = ""
    max_size: int | None = 0
    problems: tuple[str, ...] = ()

    @property
    def blob_location(self) -> str | None:
        """The file the node names: embed_mode not 1 (0, or unreadable: checked rather than trusted) and a cache.

        Decoded with U+FFFD for bytes that are not UTF-8 (printable; such a name is then simply not found).
        """
        if self.embed_mode == 1 or not self.cache:
            return None
        return self.cache.decode("utf-8", errors="replace")

    @property
    def embedded_bytes(self) -> int:
        return len(self.cache) if self.embed_mode == 1 else 0


_INT_ATTRS = {"embed_mode", "main_context", "max_size"}
_STR_ATTRS = {"source", "partition_name", "ep_sdk_version", "hardware_architecture", "onnx_model_filename", "notes"}


def is_epcontext(node: onnx.NodeProto) -> bool:
    """By op type, as every reader has checked it (ORT also wants domain com.microsoft, and refuses others)."""
    return node.op_type == EPCONTEXT


def epcontext_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """EPContext nodes of the main graph (ORT writes them nowhere else)."""
    return [n for n in model.graph.node if is_epcontext(n)]


def attribute(node: onnx.NodeProto, name: str) -> AttributeProto | None:
    """The node's first attribute called `name` (the proto itself, for callers that edit it)."""
    return next((a for a in node.attribute if a.name == name), None)


def epcontext_attrs(node: onnx.NodeProto) -> EpContextAttrs:
    """Read every attribute once; never raises on odd types (see EpContextAttrs.problems)."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for attr in node.attribute:
        name = attr.name
        if name in values or not (name in _INT_ATTRS or name in _STR_ATTRS or name == "ep_cache_context"):
            continue  # the first of repeated attributes, as attribute() reads them; unknown ones are not ours
        wanted = ATTR_INT if name in _INT_ATTRS else ATTR_STRING
        if attr.type != wanted:
            problems.append(f"attribute {name!r} is {_attr_type(attr.type)}, not {_attr_type(wanted)}")
            values[name] = None if name in _INT_ATTRS else (b"" if name == "ep_cache_context" else "")
        elif name in _INT_ATTRS:
            values[name] = int(attr.i)
        else:
            values[name] = attr.s if name == "ep_cache_context" else _text(attr.s)
    cache = values.pop("ep_cache_context", b"")
    return EpContextAttrs(cache=cache, problems=tuple(problems), **values)


def _attr_type(kind: int) -> str:
    from onnx import AttributeProto

    try:
        return AttributeProto.AttributeType.Name(kind)
    except ValueError:
        return f"type {kind}"


def blob_location(node: onnx.NodeProto) -> str | None:
    """The EP context file an EPContext node names (embed_mode 0), relative to the model's directory; else None."""
    return epcontext_attrs(node).blob_location if is_epcontext(node) else None


def blob_files(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str]]:
    """(node, file) for every EPContext node that names its context file rather than holding it."""
    return [(node, location) for node in epcontext_nodes(model) if (location := blob_location(node)) is not None]


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
        name = _text(dim.dim_param)
        return None if name in ("", "?") else name  # "?" is how some exporters write "unknown": not a shared symbol
    return None


def _text(value: str | bytes) -> str:
    """A protobuf string field as text: non-UTF-8 bytes come back as bytes, shown with U+FFFD."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value
