"""`ortcompile inspect`: what a model contains, from its graph proto alone (weights are never read).

Works on any ONNX model, compiled or not, and on one whose external files are missing. With a
manifest beside the model, each output file is checked by size (and by sha256 with `check=True`).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile.eps.compat import METADATA_PREFIX, decode_info
from ortcompile.errors import InvalidModel, first_line
from ortcompile.jsonedge import JsonObject
from ortcompile.layout import DEFAULT_ALIGN, DEFAULT_ALIGN_THRESHOLD
from ortcompile.onnxfacts import (
    EPCONTEXT,
    dtype_name,
    epcontext_attrs,
    epcontext_nodes,
    graph_inputs,
    input_dims,
    is_external,
    iter_graphs,
    iter_tensors,
    lenient_external_ref,
    op_counts,
    tensor_nbytes,
)
from ortcompile.output.publish import pending_publishes
from ortcompile.paths import UnsafePath, model_dir, not_a_model_file, resolve_inside
from ortcompile.plan.source import PROTOBUF_LIMIT
from ortcompile.readback.integrity import ManifestStatus, check_manifest

INSPECT_FORMAT = "ortcompile-inspect/1"


@dataclass
class DataFileUse:
    name: str
    tensors: int = 0
    referenced_bytes: int = 0  # sum of tensor lengths
    end: int = 0  # highest offset + length referenced
    size: int | None = None  # on disk; None when missing or unsafe
    safe: bool = True
    shared: bool = False  # listed as shared with other models in the manifest

    def to_json(self) -> JsonObject:
        return {
            "name": self.name,
            "tensors": self.tensors,
            "referenced_bytes": self.referenced_bytes,
            "size": self.size,
            "missing": self.safe and self.size is None,
            "unsafe_path": not self.safe,
            "short": self.size is not None and self.size < self.end,
            "shared": self.shared,
        }


@dataclass(frozen=True)
class TensorInfo:
    """A graph input or output: its element type and shape (an int per fixed dim, a name per symbolic one, '?' unknown)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]

    @property
    def dynamic(self) -> bool:
        return any(isinstance(d, str) for d in self.shape)

    def to_json(self) -> JsonObject:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "dynamic": self.dynamic}


@dataclass(frozen=True)
class BlobFile:
    """The EP context file an EPContext node points to (embed_mode 0)."""

    location: str
    size: int | None  # on disk; None when missing or unsafe
    safe: bool = True
    shared: bool = False  # listed as shared with other models in the manifest

    def to_json(self) -> JsonObject:
        return {"location": self.location, "size": self.size, "missing": self.safe and self.size is None,
                "unsafe_path": not self.safe, "shared": self.shared}


@dataclass(frozen=True)
class EpContextEntry:
    name: str
    source: str | None  # the EP that wrote it
    partition_name: str | None
    main_context: int  # -1: unreadable
    embed_mode: int  # -1: unreadable
    ep_sdk_version: str | None
    blob: BlobFile | None
    embedded_bytes: int

    def to_json(self) -> JsonObject:
        return {"name": self.name, "source": self.source, "partition_name": self.partition_name, "main_context": self.main_context,
                "embed_mode": self.embed_mode, "ep_sdk_version": self.ep_sdk_version,
                "blob": self.blob.to_json() if self.blob else None, "embedded_bytes": self.embedded_bytes}


@dataclass(frozen=True)
class UnalignedTensor:
    name: str
    file: str
    offset: int
    length: int

    def to_json(self) -> JsonObject:
        return {"name": self.name, "file": self.file, "offset": self.offset, "length": self.length}


@dataclass(frozen=True)
class Alignment:
    """External tensors of at least `threshold` bytes, and which of them do not start at a multiple of `align`."""

    align: int
    threshold: int
    large_tensors: int
    unaligned: tuple[UnalignedTensor, ...]

    def to_json(self) -> JsonObject:
        return {"align": self.align, "threshold": self.threshold, "large_tensors": self.large_tensors,
                "aligned": self.large_tensors - len(self.unaligned), "unaligned": [u.to_json() for u in self.unaligned]}


@dataclass(frozen=True)
class CompiledFor:
    """What one EP wrote about the hardware it compiled for (ORT metadata `ep_compatibility_info.<EP>`)."""

    info: str
    decoded: JsonObject | None  # eps.compat.decode_info: the fields of a format we know (OpenVINO's is its own JSON)

    def to_json(self) -> JsonObject:
        return {"info": self.info, "decoded": self.decoded}


@dataclass
class InspectReport:
    model: Path
    graph_bytes: int
    opsets: dict[str, int]  # the domains some node (or model function) is in; the default domain always
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    epcontext: list[EpContextEntry]
    compiled_ops: dict[str, int] | None  # op types the EPContext nodes replaced (from the manifest; None: unknown)
    epcontext_by_source: dict[str, int]
    remaining_ops: dict[str, int]
    inline_initializers: int
    inline_bytes: int
    data_files: list[DataFileUse]
    alignment: Alignment
    manifest: ManifestStatus | None = None
    problems: list[str] = field(default_factory=list)
    target: JsonObject | None = None  # what the EP compiled for: the manifest's record, shown as recorded
    parts: list[JsonObject] | None = None  # a stitched model (--partition, stitch): its parts, the manifest's records as recorded
    compatibility: dict[str, CompiledFor] = field(default_factory=dict)  # by EP name
    unused_opsets: list[str] = field(default_factory=list)  # domains the model imports that nothing uses (ORT's compiler adds ~9)

    def to_json(self) -> JsonObject:
        external = sum(f.tensors for f in self.data_files)
        return {
            "format": INSPECT_FORMAT,
            "model": str(self.model),
            "graph_bytes": self.graph_bytes,
            "protobuf_headroom_bytes": PROTOBUF_LIMIT - self.graph_bytes,
            "opsets": self.opsets,
            "unused_opsets": self.unused_opsets,
            "inputs": [i.to_json() for i in self.inputs],
            "outputs": [o.to_json() for o in self.outputs],
            "epcontext_nodes": [e.to_json() for e in self.epcontext],
            "nodes": {
                "epcontext": len(self.epcontext),
                "epcontext_by_source": self.epcontext_by_source,
                "compiled_ops": self.compiled_ops,
                "remaining_ops": self.remaining_ops,
            },
            "initializers": {
                "inline": self.inline_initializers,
                "inline_bytes": self.inline_bytes,
                "external": external,
                "files": [f.to_json() for f in self.data_files],
            },
            "alignment": self.alignment.to_json(),
            "manifest": self.manifest.to_json() if self.manifest else None,
            "target": self.target,
            "parts": self.parts,
            "compatibility": {ep: c.to_json() for ep, c in self.compatibility.items()},
            "problems": self.problems,
        }


def inspect_model(model_path: str | Path, check: bool = False) -> InspectReport:
    import onnx

    path = Path(model_path)
    problem = not_a_model_file(path)
    if problem:
        raise InvalidModel(problem)
    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except Exception as exc:
        raise InvalidModel(f"{path}: not a valid ONNX model ({first_line(exc)})") from exc
    if not model.HasField("graph"):
        raise InvalidModel(f"{path}: parses as protobuf but is not an ONNX model with a graph")
    try:
        return _report(path, model, check)
    except (ValueError, TypeError, OSError, RuntimeError, AttributeError, OverflowError, KeyError) as exc:
        # A field so malformed that even reporting it fails: one line, invalid input, never a traceback.
        raise InvalidModel(f"{path}: cannot inspect this model ({type(exc).__name__}: {first_line(exc, 160)})") from exc


def _used_opsets(model: Any) -> dict[str, int]:
    """The opset imports some node is in (any graph or model function), and the default domain's: ONNX Runtime's
    compiler imports every domain it knows into its output, which would list ten where one or two are used."""
    nodes = [n for site in iter_graphs(model) for n in site.graph.node] + [n for f in model.functions for n in f.node]
    used = {n.domain or "ai.onnx" for n in nodes} | {f.domain or "ai.onnx" for f in model.functions} | {"ai.onnx"}
    return {(o.domain or "ai.onnx"): o.version for o in model.opset_import if (o.domain or "ai.onnx") in used}


def _report(path: Path, model: Any, check: bool) -> InspectReport:
    manifest = check_manifest(path, hash_files=check)
    align, threshold = _recorded_alignment(manifest)
    directory = model_dir(path)
    data_files, alignment, field_problems = _initializer_layout(model, directory, align, threshold)
    shared = manifest.manifest.shared_names if manifest.manifest else set()
    epcontext = [_epcontext_entry(n, directory, shared, field_problems) for n in epcontext_nodes(model)]
    for use in data_files:
        use.shared = use.name in shared
    inline = [t for t in model.graph.initializer if not is_external(t)]
    opsets = _used_opsets(model)
    report = InspectReport(
        model=path,
        graph_bytes=path.stat().st_size,
        opsets=opsets,
        unused_opsets=sorted({o.domain or "ai.onnx" for o in model.opset_import} - set(opsets)),
        inputs=[_value_info(v) for v in graph_inputs(model.graph)],
        outputs=[_value_info(v) for v in model.graph.output],
        epcontext=epcontext,
        compiled_ops=_compiled_ops(manifest, epcontext),
        epcontext_by_source=_epcontext_by_source(epcontext),
        remaining_ops=op_counts(model.graph.node, exclude=[EPCONTEXT]),
        inline_initializers=len(inline),
        inline_bytes=sum(len(t.raw_data) for t in inline),
        data_files=data_files,
        alignment=alignment,
        manifest=manifest if manifest.found else None,
    )
    report.target = manifest.manifest.target if manifest.manifest else None
    report.parts = list(manifest.manifest.parts) if manifest.manifest and manifest.manifest.parts else None
    report.compatibility = _compatibility(model)
    report.problems = field_problems + _problems(report)
    for stage in pending_publishes(path.parent):
        report.problems.append(f"an interrupted publish is pending in {path.parent} ({stage}): files may mix two outputs; "
                               "run the compile again to finish it")
    return report


def _compatibility(model: Any) -> dict[str, CompiledFor]:
    """What each EP wrote about the hardware it compiled for (ORT metadata `ep_compatibility_info.<EP>`), decoded."""
    infos = {p.key[len(METADATA_PREFIX):]: p.value for p in model.metadata_props if p.key.startswith(METADATA_PREFIX)}
    return {ep: CompiledFor(info, decode_info(ep, info)) for ep, info in sorted(infos.items())}


def _recorded_alignment(manifest: ManifestStatus) -> tuple[int, int]:
    layout = manifest.manifest.layout if manifest.manifest else {}
    return int(layout.get("align", DEFAULT_ALIGN)), int(layout.get("align_threshold", DEFAULT_ALIGN_THRESHOLD))


def _initializer_layout(model: Any, directory: Path, align: int, threshold: int) -> tuple[list[DataFileUse], Alignment, list[str]]:
    """Data files by every external tensor (subgraphs' and Constant values too), alignment, and unreadable fields."""
    files: dict[str, DataFileUse] = {}
    large, problems = 0, []
    unaligned: list[UnalignedTensor] = []
    for site in iter_tensors(model):
        ref, unreadable = lenient_external_ref(site.tensor)
        if ref is None:
            continue
        problems += [f"tensor {site.name!r} {problem}" for problem in unreadable]
        location, offset, length = ref.location, ref.offset, ref.length_or(_own_size(site.tensor)) or 0
        use = files.setdefault(location, _data_file(directory, location))
        use.tensors += 1
        use.referenced_bytes += length
        use.end = max(use.end, offset + length)
        if length >= threshold:
            large += 1
            if offset % align:
                unaligned.append(UnalignedTensor(site.name, location, offset, length))
    return sorted(files.values(), key=lambda f: f.name), Alignment(align, threshold, large, tuple(unaligned)), problems


def _own_size(tensor: Any) -> int | None:
    """What a reference without a length covers: the tensor's own size (None when its type or shape does not say)."""
    try:
        return tensor_nbytes(tensor.data_type, tensor.dims)
    except ValueError:
        return None


def _data_file(directory: Path, location: str) -> DataFileUse:
    use = DataFileUse(location)
    try:
        target = resolve_inside(directory, location)
        if target.is_file():
            use.size = target.stat().st_size
    except (UnsafePath, OSError):  # OSError: a name the filesystem refuses to stat is not a usable path either
        use.safe = False
    return use


def _epcontext_entry(node: Any, directory: Path, shared: set[str], problems: list[str]) -> EpContextEntry:
    attrs = epcontext_attrs(node)
    problems += [f"EPContext node {node.name!r}: {problem}" for problem in attrs.problems]
    blob = None
    if attrs.blob_location is not None:
        use = _data_file(directory, attrs.blob_location)
        blob = BlobFile(use.name, use.size, use.safe, use.name in shared)  # shared: --share-weights, other models use it too
    return EpContextEntry(
        name=node.name,
        source=attrs.source,
        partition_name=attrs.partition_name,
        main_context=-1 if attrs.main_context is None else attrs.main_context,
        embed_mode=-1 if attrs.embed_mode is None else attrs.embed_mode,
        ep_sdk_version=attrs.ep_sdk_version,
        blob=blob,
        embedded_bytes=attrs.embedded_bytes,
    )


def _compiled_ops(manifest: ManifestStatus, epcontext: list[EpContextEntry]) -> dict[str, int] | None:
    """Op types the EPContext nodes replaced: none without such nodes; from the manifest, else unknown (None)."""
    if not epcontext:
        return {}
    return manifest.manifest.nodes.compiled_ops if manifest.manifest else None


def _epcontext_by_source(epcontext: list[EpContextEntry]) -> dict[str, int]:
    """EPContext nodes per EP that produced them."""
    return dict(sorted(collections.Counter(entry.source or "unknown" for entry in epcontext).items()))


def _value_info(value_info: Any) -> TensorInfo:
    tensor_type = value_info.type.tensor_type
    dims = tuple("?" if d is None else d for d in input_dims(value_info))
    elem = dtype_name(tensor_type.elem_type) or f"unknown({tensor_type.elem_type})"
    return TensorInfo(value_info.name, elem.lower(), dims)


def _problems(report: InspectReport) -> list[str]:
    problems = []
    for use in report.data_files:
        if not use.safe:
            problems.append(f"external data path {use.name!r} is absolute or leaves the model's directory")
        elif use.size is None:
            problems.append(f"external data file {use.name!r} is missing")
        elif use.size < use.end:
            problems.append(f"external data file {use.name!r} has {use.size} bytes, tensors need {use.end}")
    for node in report.epcontext:
        blob = node.blob
        if blob and blob.safe and blob.size is None:
            problems.append(f"EP context file {blob.location!r} (node {node.name!r}) is missing")
        if blob and not blob.safe:
            problems.append(f"EP context path {blob.location!r} (node {node.name!r}) leaves the model's directory")
    if report.manifest is not None:
        problems += report.manifest.problems
    return problems
