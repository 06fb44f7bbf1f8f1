"""Compile to memory and load from memory: for hosts without a writable disk (browsers, workers, services).

    from ortcompile import compile_to_buffers, open_session
    art = compile_to_buffers("model.onnx", ep="cpu", align=4096)   # graph bytes + named aligned buffers
    sess = open_session(art)                                       # zero-copy: ORT uses the buffers as they are

Pass 1 writes initializers into anonymous memory maps at aligned offsets (the same policy as files).
Each map is sized once from a plan over the source's initializers, before compilation: the initializers
ORT leaves in the output are a subset, placed in the same order, so they always fit; untouched pages of
an anonymous map cost no memory, so planning for the whole model is free. Nothing is grown and copied.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ortcompile import eps
from ortcompile.compile.datapass import DataPass, Target, WrittenFile
from ortcompile.compile.graphpass import embed_blobs, referenced_blobs
from ortcompile.compile.ortstep import OrtCompile, compile_with_ort
from ortcompile.compile.relayout import relayout
from ortcompile.errors import CompilationFailed
from ortcompile.layout import DEFAULT_ALIGN, DEFAULT_ALIGN_THRESHOLD, DEFAULT_INLINE_THRESHOLD, DataLayout, LayoutPolicy
from ortcompile.naming import OutputNames
from ortcompile.onnxfacts import STRING, element_size, epcontext_nodes, graph_tensor_names, iter_tensors, stored_nbytes
from ortcompile.plan.shapes import dimension_overrides
from ortcompile.plan.source import PROTOBUF_LIMIT, SourceModel, read_source
from ortcompile.run import sessions

BlobFallback = Literal["error", "tempdir"]


class EpContextNotInMemory(CompilationFailed):
    """The EP can only write its context blob to files, and the caller did not allow a temporary directory."""


class MemoryTarget:
    """A data 'file' in an anonymous memory map, written front to back."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.position = 0
        self.map = mmap.mmap(-1, max(capacity, mmap.PAGESIZE))

    def pad_to(self, offset: int) -> None:
        self._reserve(offset)
        self.position = offset  # a fresh anonymous map is already zero-filled

    def write(self, data: memoryview | bytes, origin: tuple[int, int] | None = None) -> None:
        view = memoryview(data).cast("B")
        self._reserve(self.position + len(view))
        self.map[self.position : self.position + len(view)] = view
        self.position += len(view)

    def _reserve(self, end: int) -> None:
        if end > len(self.map):  # the plan is an upper bound; this only guards against an EP adding tensors
            raise CompilationFailed(f"in-memory data buffer {self.name!r} outgrew its planned {len(self.map)} bytes")

    def close(self) -> WrittenFile:
        return WrittenFile(self.name, self.position, "")

    def abandon(self) -> None:
        self.map.close()


class MemorySink:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.targets: dict[str, MemoryTarget] = {}

    def open(self, name: str) -> Target:
        self.targets[name] = MemoryTarget(name, self.capacity)
        return self.targets[name]

    def shutdown(self) -> None:
        pass


@dataclass
class CompiledArtifact:
    """A compiled model held in memory: the graph proto and the external data buffers it names."""

    graph: bytes
    buffers: dict[str, memoryview]  # relative location in the graph -> exactly that file's bytes
    ep: str  # short EP name it was compiled for
    epcontext_nodes: int
    blob_fallback_used: bool = False  # the EP wrote its blob to a temporary directory (now removed)
    _maps: list[mmap.mmap] = field(default_factory=list, repr=False)

    @property
    def total_bytes(self) -> int:
        return len(self.graph) + sum(len(b) for b in self.buffers.values())


def planned_capacity(source: SourceModel, policy: LayoutPolicy, model: Any = None) -> int:
    """An upper bound on the bytes pass 1 can write: every tensor ORT may hand over, each padded at most once.

    ORT asks about main-graph initializers, but also about Constant nodes (it turns them into initializers)
    and subgraph initializers (If/Loop/Scan bodies); every tensor of the model is counted.
    """
    layout = DataLayout(LayoutPolicy(policy.inline_threshold, policy.align, policy.align_threshold, None))
    total = 0
    for site in iter_tensors(model if model is not None else _graph_only(source.path)):
        nbytes = stored_nbytes(site.tensor)  # read_source has refused a model where this raises
        if nbytes is None or site.tensor.data_type == STRING or layout.is_inline(nbytes):
            continue
        total += nbytes + policy.alignment_for(nbytes, element_size(site.tensor.data_type) or 1) - 1
    return total


def _graph_only(model_path: Path) -> Any:
    import onnx

    return onnx.load_model(str(model_path), load_external_data=False)


def compile_to_buffers(
    model: str | os.PathLike[str],
    ep: str = "auto",
    align: int = DEFAULT_ALIGN,
    *,
    align_threshold: int = DEFAULT_ALIGN_THRESHOLD,
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
    ep_options: dict[str, str] | None = None,
    fix_dims: dict[str, int] | None = None,
    fix_shapes: dict[str, tuple[int, ...]] | None = None,
    blob_fallback: BlobFallback = "error",
) -> CompiledArtifact:
    """Compile without writing outputs to disk.

    EP context blobs arrive through ORT's write callback when the EP supports it. When it does not
    (every EP available with onnxruntime 1.31), this raises EpContextNotInMemory unless
    `blob_fallback="tempdir"`: the EP then writes its blob into a private temporary directory, which
    is read back, embedded in the graph, and removed before this returns.
    """
    source = read_source(Path(model))
    resolved = eps.resolve(ep, ep_options or {}, validate=True)
    policy = LayoutPolicy(inline_threshold, align, align_threshold, None)
    overrides = dimension_overrides(source, fix_dims or {}, fix_shapes or {})
    names = OutputNames.for_source(source.path)
    model_proto = _graph_only(source.path)  # parsed once for the plan and the inline rule
    capacity = planned_capacity(source, policy, model_proto)
    sinks: list[MemorySink] = []  # a fresh sink per attempt (ORT may refuse the blob callback and we retry)
    fallback_used = False

    # ORT (1.31) serves only the main graph's initializers and Constant outputs from in-memory buffers; a
    # subgraph initializer with external data would be looked up on disk, so it stays inline.
    main_graph = graph_tensor_names(model_proto.graph)
    del model_proto

    def new_data_pass() -> DataPass:
        sinks.append(MemorySink(capacity))
        return DataPass(sinks[-1], names.model, DataLayout(policy), keep_inline=lambda name: name not in main_graph)

    def refuse_or_fall_back(message: str) -> None:
        nonlocal fallback_used
        if blob_fallback != "tempdir":
            raise EpContextNotInMemory(f"{message}, so it cannot compile to memory; pass blob_fallback='tempdir' "
                                       "to let it write to a temporary directory that is read back and removed")
        fallback_used = True

    if not resolved.info.compiles:  # nothing to compile: the source graph, weights re-laid out into the buffers
        data_pass = new_data_pass()
        graph = relayout(source, data_pass, keep_inline=lambda graph_path, name: graph_path != "")
        data_pass.finish()
        return _artifact(graph, sinks[-1], resolved.info.short_name, False)
    with tempfile.TemporaryDirectory(prefix="ortcompile-blobs-") as scratch:
        request = OrtCompile(source.path, resolved, Path(scratch) / names.model, overrides, True, blobs_in_memory=True, in_process=True)
        output, data_pass = compile_with_ort(request, new_data_pass, refuse_or_fall_back)
        data_pass.finish()
        graph = _embed_blobs(output.graph_proto, Path(scratch), output.blob_sink.blobs if output.blob_sink else {})
    return _artifact(graph, sinks[-1], resolved.info.short_name, fallback_used)


def _artifact(graph: bytes, sink: MemorySink, ep: str, fallback_used: bool) -> CompiledArtifact:
    buffers = {name: memoryview(t.map)[: t.position] for name, t in sink.targets.items()}
    return CompiledArtifact(graph, buffers, ep, _count_epcontext(graph), fallback_used, [t.map for t in sink.targets.values()])


def _embed_blobs(graph_proto: bytes, scratch: Path, in_memory: dict[str, bytes]) -> bytes:
    """Blobs the EP wrote (to the scratch directory or through the callback) go into their EPContext nodes."""
    import onnx

    model = onnx.load_model_from_string(graph_proto)
    for name, content in in_memory.items():
        (scratch / name).write_bytes(content)  # one code path for both: embed_blobs reads the scratch dir
    names = referenced_blobs(model, scratch)
    total = sum((scratch / n).stat().st_size for n in names)
    if total and len(graph_proto) + total >= PROTOBUF_LIMIT:
        raise CompilationFailed(f"the EP context blob ({total} bytes) is too large to embed in memory; use compile_model to write files")
    if names:
        embed_blobs(model, scratch, names)
    return model.SerializeToString()


def _count_epcontext(graph: bytes) -> int:
    import onnx

    return len(epcontext_nodes(onnx.load_model_from_string(graph)))


def open_session(artifact: CompiledArtifact, ep: str | None = None, ep_options: dict[str, str] | None = None) -> Any:
    """An InferenceSession over the artifact's buffers, used in place (no copy of the weights).

    The session keeps a reference to the artifact: the buffers must outlive it.
    """
    resolved = eps.resolve(ep or artifact.ep, ep_options or {})
    options = sessions.session_options(resolved, config={
        "session.use_external_initializer_file_buffers_directly": "1",
        sessions.LEAN_CONFIG: "1",  # prepacking would copy every weight
    })
    if artifact.buffers:
        names = list(artifact.buffers)
        options.add_external_initializers_from_files_in_memory(names, [artifact.buffers[n] for n in names], [len(artifact.buffers[n]) for n in names])
    session = sessions.open_session(artifact.graph, resolved, options=options, label="the in-memory artifact").session
    session._ortcompile_artifact = artifact  # keep the buffers alive as long as the session
    return session


__all__ = ["CompiledArtifact", "EpContextNotInMemory", "compile_to_buffers", "open_session"]
