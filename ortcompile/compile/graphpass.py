"""Pass 2: finish the small graph proto ONNX Runtime produced and write it on its own.

By now every large initializer lives in a data file, so the proto holds the graph, tiny tensors and
EPContext nodes. Here blobs are embedded or left as files (`--embed`), every path is checked to be a
plain relative name inside the output, and the size is checked against the protobuf limit before a
single byte of the model file is written.

Every file the graph keeps referencing (data files, blob files) is renamed in the stage to its
content-addressed name (`naming.content_addressed`) and the graph's `location` / `ep_cache_context`
references are rewritten to match, so publishing never puts new bytes under a name an older graph uses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ortcompile.compile.datapass import HashingFile, WrittenFile
from ortcompile.errors import CompilationFailed, OutputError
from ortcompile.naming import content_addressed
from ortcompile.onnxfacts import EPCONTEXT, attribute, blob_files, epcontext_nodes, external_locations, is_external, iter_tensors, op_counts
from ortcompile.options import EmbedPolicy
from ortcompile.output.digest import hash_and_sync
from ortcompile.paths import UnsafePath, resolve_inside
from ortcompile.plan.source import PROTOBUF_LIMIT

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


class StagedNames:
    """The staged files graphs reference, each renamed once to its content-addressed name.

    Data files come hashed from the data pass; blob files are hashed (and synced) when a graph first names one.
    One instance serves every graph of a --share-weights batch, so a shared file is hashed and renamed once.
    """

    def __init__(self, staging_dir: Path, data_files: list[WrittenFile]) -> None:
        self.staging_dir = staging_dir
        self._final: dict[str, WrittenFile] = {}  # name as written -> the file under its published name
        self.data_files = [self._rename(written) for written in data_files]

    def _rename(self, written: WrittenFile) -> WrittenFile:
        final = replace(written, name=content_addressed(written.name, written.sha256))
        if final.name != written.name:
            os.rename(self.staging_dir / written.name, self.staging_dir / final.name)
        self._final[written.name] = self._final[final.name] = final
        return final

    def path(self, name: str) -> Path:
        """Where a file a graph names is in the stage now (renamed already, or still as written)."""
        return self.staging_dir / (self._final[name].name if name in self._final else name)

    def data(self, location: str) -> str:
        """A data file's published name (every external tensor of an output lives in a file its data pass wrote)."""
        if location not in self._final:
            raise CompilationFailed(f"the compiled graph references a data file {location!r} the data pass did not write")
        return self._final[location].name

    def blob(self, name: str) -> WrittenFile:
        """An EP blob file, hashed and renamed the first time any graph names it."""
        if name not in self._final:
            self._rename(hash_and_sync(self.staging_dir / name))
        return self._final[name]


def address_files(model: Any, staged: StagedNames, blobs: list[str]) -> list[WrittenFile]:
    """Rewrite every data `location` and blob `ep_cache_context` of `model` to the published names; return the blobs."""
    for site in iter_tensors(model):
        if is_external(site.tensor):
            for entry in site.tensor.external_data:
                if entry.key == "location":
                    entry.value = staged.data(entry.value)
    renamed = {name: staged.blob(name) for name in blobs}
    for node, name in blob_files(model):
        attribute(node, "ep_cache_context").s = renamed[name].name.encode()
    return list(renamed.values())


def referenced_blobs(model: Any, staging_dir: Path, must_exist: bool = True, staged: StagedNames | None = None) -> list[str]:
    """Blob files named by EPContext nodes (embed_mode=0), checked to be plain names inside the output (and, with
    `staged`, found where an earlier graph of the batch may have renamed them)."""
    names: list[str] = []
    for node, name in blob_files(model):
        try:
            path = resolve_inside(staging_dir, name, plain=True)
        except UnsafePath:
            raise CompilationFailed(f"EP wrote a context path {name!r} that is not a plain file name in the output") from None
        if staged is not None:
            path = staged.path(name)
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
                staged: StagedNames) -> tuple[WrittenFile, list[WrittenFile], GraphSummary]:
    """The finished graph written as `model_name`; returns it, the blob files it references, and its summary."""
    import onnx

    model = onnx.load_model_from_string(graph_proto)
    blobs = referenced_blobs(model, staging_dir, staged=staged)
    blob_bytes = sum(staged.path(n).stat().st_size for n in blobs)
    embedded = 0
    if should_embed(embed, blob_bytes, len(graph_proto)):
        embedded = embed_blobs(model, staging_dir, blobs)
        blobs = []
    blob_files_ = address_files(model, staged, blobs)
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
    summary = GraphSummary(len(epcontext_nodes(model)), op_counts(model.graph.node, exclude=[EPCONTEXT]), size, embedded,
                           [b.name for b in blob_files_], external_locations(model), external, len(model.graph.initializer) - external)
    return written, blob_files_, summary
