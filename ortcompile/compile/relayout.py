"""Pass-through (`--ep cpu`, EPs that do not compile): the source graph as it is, weights re-laid out by us.

Nothing is compiled, so ONNX Runtime's Compile API has nothing to add, and its model writer breaks some
valid models: measured on silero-vad (If subgraphs with Constant nodes), the raw `ModelCompiler` with the
CPU EP writes a graph ORT then refuses ("Graph must be in single static assignment (SSA) form"). Here
the graph proto is kept node for node; only tensors at or above the inline threshold move, each to its
aligned place in the data files the plan gives, copied inside the kernel from the source's data files
when they come from one. No weight is ever held in memory, whatever the model size.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ortcompile.compile.datapass import DataPass
from ortcompile.compile.freeze import freeze_inputs
from ortcompile.errors import InvalidModel
from ortcompile.onnxfacts import (
    ATTR_TENSOR,
    EXTERNAL,
    STRING,
    MalformedTensor,
    attribute,
    element_size,
    external_ref,
    iter_graphs,
    iter_initializers,
    iter_tensors,
    stored_nbytes,
)
from ortcompile.paths import model_dir, resolve_inside
from ortcompile.plan.shapes import Pins, apply_pins
from ortcompile.plan.source import SourceModel

KeepInline = Callable[[str, str], bool]  # (graph path, tensor name) -> keep it in the proto


def relayout(source: SourceModel, data_pass: DataPass, keep_inline: KeepInline | None = None, pins: Pins | None = None,
             frozen: dict[str, int | float] | None = None) -> bytes:
    """The source's graph proto with large initializers moved into the data pass's files, specialized on `frozen`
    inputs and with the pins written into its shapes (as for compiling EPs, without folding anything)."""
    import onnx

    model = onnx.load_model(str(source.path), load_external_data=False)
    if frozen:
        freeze_inputs(model, frozen)
    if pins is not None:
        apply_pins(model, pins)
    return relayout_model(model, model_dir(source.path), data_pass, keep_inline)


def relayout_model(model: Any, base: Path, data_pass: DataPass, keep_inline: KeepInline | None = None) -> bytes:
    """`model` (its external data relative to `base`) with its large tensors moved into the data pass's files."""
    keep = keep_inline or (lambda graph, name: False)
    if model.ir_version >= 4:  # older IRs list initializers among the graph inputs: leave their Constants be
        _constants_to_initializers(model, data_pass.layout.policy.inline_threshold, keep)
    sites = sorted(iter_initializers(model), key=lambda s: (s.graph != "", s.graph, s.name))  # main graph first, then by name
    with _SourceFiles(base) as files:
        for site in sites:
            _place(site.tensor, site.graph, data_pass, files, keep)
        for site in iter_tensors(model):  # what is not an initializer stays in the proto: Constant values, sparse tensors
            if site.kind != "initializer" and (ref := external_ref(site.tensor)) is not None:
                _make_inline(site.tensor, files.read(ref.location, ref.offset, stored_nbytes(site.tensor) or 0))
    return model.SerializeToString()


def _constants_to_initializers(model: Any, threshold: int, keep: KeepInline) -> None:
    """Large Constant values become initializers (as ONNX Runtime itself does), so they can move out of the proto."""
    for site in iter_graphs(model):
        graph, outputs = site.graph, {o.name for o in site.graph.output}
        kept, moved = [], False
        for node in graph.node:
            tensor = _large_constant(node, threshold)
            if tensor is not None and node.output[0] not in outputs and not keep(site.path, node.output[0]):
                tensor.name = node.output[0]
                graph.initializer.append(tensor)
                moved = True
            else:
                kept.append(node)
        if moved:
            del graph.node[:]
            graph.node.extend(kept)


def _large_constant(node: Any, threshold: int) -> Any | None:
    """A copy of a Constant node's `value` tensor when it is at least `threshold` bytes."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.output) != 1 or len(node.attribute) != 1:
        return None
    value = attribute(node, "value")
    if value is None or value.type != ATTR_TENSOR:
        return None
    try:
        nbytes = stored_nbytes(value.t)
    except MalformedTensor:
        return None  # reported when the tensor is placed, if ever
    if nbytes is None or nbytes < threshold:
        return None
    tensor = type(value.t)()
    tensor.CopyFrom(value.t)
    return tensor


def _place(tensor: Any, graph: str, data_pass: DataPass, files: _SourceFiles, keep: KeepInline) -> None:
    try:
        nbytes = stored_nbytes(tensor)
        ref = external_ref(tensor)
    except MalformedTensor as exc:
        raise InvalidModel(f"initializer {exc.tensor!r} {exc.problem}") from None
    if nbytes is None or tensor.data_type == STRING or data_pass.layout.is_inline(nbytes) or keep(graph, tensor.name):
        data_pass.inline_count += 1
        if ref is not None:
            _make_inline(tensor, files.read(ref.location, ref.offset, nbytes or 0))
        return
    item = element_size(tensor.data_type) or 1
    if ref is not None:
        with files.view(ref.location, ref.offset, nbytes) as (view, origin):
            placement = data_pass.place_tensor(tensor.name, view, item, origin)
    else:
        placement = data_pass.place_tensor(tensor.name, memoryview(_inline_bytes(tensor)), item, None)
    _point_at(tensor, data_pass.location_of(placement), placement.offset, nbytes)


def _inline_bytes(tensor: Any) -> bytes:
    """raw_data, or the typed fields (float_data, int32_data, ...) as the little-endian bytes ONNX defines."""
    if tensor.raw_data:
        return bytes(tensor.raw_data)
    from onnx import numpy_helper

    return numpy_helper.to_array(tensor).tobytes()


def _make_inline(tensor: Any, data: bytes) -> None:
    del tensor.external_data[:]
    tensor.data_location = 0  # DEFAULT
    tensor.raw_data = data


def _point_at(tensor: Any, location: str, offset: int, nbytes: int) -> None:
    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        tensor.ClearField(field)
    del tensor.external_data[:]
    tensor.data_location = EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


class _SourceFiles:
    """The source's data files, each opened once; read_source already checked every reference's path and extent."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._fds: dict[str, int] = {}

    def __enter__(self) -> _SourceFiles:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for fd in self._fds.values():
            os.close(fd)

    def _fd(self, location: str) -> int:
        if location not in self._fds:
            self._fds[location] = os.open(resolve_inside(self.base, location), os.O_RDONLY)
        return self._fds[location]

    def read(self, location: str, offset: int, length: int) -> bytes:
        return os.pread(self._fd(location), length, offset)

    @contextmanager
    def view(self, location: str, offset: int, length: int) -> Iterator[tuple[memoryview, tuple[int, int]]]:
        """A mapped view of the bytes (untouched pages cost no memory) and their origin for a kernel copy."""
        fd = self._fd(location)
        if length == 0:
            yield memoryview(b""), (fd, offset)
            return
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(fd, offset - start + length, prot=mmap.PROT_READ, offset=start)
        view = memoryview(mapped)[offset - start :]
        try:
            yield view, (fd, offset)
        finally:
            view.release()
            try:
                mapped.close()
            except BufferError:
                pass  # a failed write's traceback still holds a slice: the map closes when that is collected
