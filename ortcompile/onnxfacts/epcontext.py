"""EPContext node facts: the attributes of ONNX Runtime's com.microsoft EPContext nodes, and where a node's
context blob lives (embedded, or a file next to the model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ortcompile.onnxfacts.tensors import ATTR_INT, ATTR_STRING, EPCONTEXT, proto_text

if TYPE_CHECKING:
    import onnx
    from onnx import AttributeProto


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
    values: dict[str, int | str | bytes | None] = {}  # EpContextAttrs' fields, each of its attribute's type
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
            values[name] = attr.s if name == "ep_cache_context" else proto_text(attr.s)
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
