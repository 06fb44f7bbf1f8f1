"""Pass 2: finish the small graph proto ONNX Runtime produced and write it on its own.

By now every large initializer lives in a data file, so the proto holds the graph, tiny tensors and
EPContext nodes. Here blobs are embedded or left as files (`--embed`), every path is checked to be a
plain relative name inside the output, and the size is checked against the protobuf limit before a
single byte of the model file is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile.compile.datapass import HashingFile, WrittenFile
from ortcompile.compile.source import PROTOBUF_LIMIT
from ortcompile.errors import CompilationFailed, OutputError
from ortcompile.onnxfacts import EPCONTEXT, attribute, blob_files, epcontext_nodes, external_locations, is_external, op_counts
from ortcompile.options import EmbedPolicy
from ortcompile.paths import UnsafePath, resolve_inside

# `--embed auto` embeds blobs only when all of them together stay this small: one self-contained
# file for small models, while a large blob never goes near the 2 GiB protobuf limit.
AUTO_EMBED_LIMIT = 16 << 20


@dataclass
class GraphSummary:
    epcontext_nodes: int
    remaining_ops: dict[str, int]
    graph_bytes: int
    embedded_blob_bytes: int
    blob_names: list[str] = field(default_factory=list)  # referenced blob files left beside the model
    data_locations: list[str] = field(default_factory=list)  # external data files the graph references
    external_initializers: int = 0
    inline_initializers: int = 0


def referenced_blobs(model: Any, staging_dir: Path, must_exist: bool = True) -> list[str]:
    """Blob files named by EPContext nodes (embed_mode=0), checked to be plain names inside the output."""
    names: list[str] = []
    for node, name in blob_files(model):
        try:
            path = resolve_inside(staging_dir, name, plain=True)
        except UnsafePath:
            raise CompilationFailed(f"EP wrote a context path {name!r} that is not a plain file name in the output") from None
        if must_exist and not path.is_file():
            raise CompilationFailed(f"EP context file {name!r} named by node {node.name!r} was not written")
        if name not in names:
            names.append(name)
    return names


def should_embed(policy: EmbedPolicy, blob_bytes: int, graph_bytes: int) -> bool:
    if policy == "never" or blob_bytes == 0:
        return False
    fits = graph_bytes + blob_bytes < PROTOBUF_LIMIT
    if policy == "always":
        if not fits:
            raise OutputError(
                f"cannot embed {blob_bytes} bytes of EP context: the model would exceed the 2 GiB protobuf "
                "limit; use --embed never (or auto)"
            )
        return True
    return blob_bytes <= AUTO_EMBED_LIMIT


def embed_blobs(model: Any, staging_dir: Path, names: list[str]) -> int:
    """Move blob bytes into their EPContext nodes (embed_mode=1), as ORT itself writes embedded models."""
    contents = {name: (staging_dir / name).read_bytes() for name in names}
    for node, name in blob_files(model):
        attribute(node, "ep_cache_context").s = contents[name]
        mode = attribute(node, "embed_mode")
        if mode is not None:
            mode.i = 1
    for name in names:
        (staging_dir / name).unlink()
    return sum(len(c) for c in contents.values())


def write_graph(graph_proto: bytes, staging_dir: Path, model_name: str, embed: EmbedPolicy, pool: Any,
                blobs_pending: bool = False) -> tuple[WrittenFile, GraphSummary]:
    """`blobs_pending`: a shared EP context is written only after the batch's last model (never embedded)."""
    import onnx

    model = onnx.load_model_from_string(graph_proto)
    blobs = referenced_blobs(model, staging_dir, must_exist=not blobs_pending)
    if blobs_pending:
        embed = "never"
    blob_bytes = 0 if blobs_pending else sum((staging_dir / n).stat().st_size for n in blobs)
    embedded = 0
    if should_embed(embed, blob_bytes, len(graph_proto)):
        embedded = embed_blobs(model, staging_dir, blobs)
        blobs = []
    size = model.ByteSize()
    if size >= PROTOBUF_LIMIT:
        raise OutputError(
            f"the compiled graph proto would be {size} bytes, over the 2 GiB protobuf limit; "
            "lower --inline-threshold or use --embed never"
        )
    target = HashingFile(staging_dir / model_name, pool)
    try:
        target.write(model.SerializeToString())
    except BaseException:
        target.abandon()
        raise
    written = target.close()
    external = sum(1 for t in model.graph.initializer if is_external(t))
    summary = GraphSummary(len(epcontext_nodes(model)), op_counts(model.graph.node, exclude=[EPCONTEXT]), size, embedded, blobs,
                           external_locations(model), external, len(model.graph.initializer) - external)
    return written, summary
