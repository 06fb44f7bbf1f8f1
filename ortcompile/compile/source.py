"""Read and check the input model's graph proto without loading its weights."""

from __future__ import annotations

import collections
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortcompile.errors import InvalidModel, first_line
from ortcompile.onnxfacts import input_dims

PROTOBUF_LIMIT = 2**31 - 1  # protobuf refuses to serialize or parse a message larger than this

# Sub-byte element types are packed two per byte.
_PACKED_4BIT = {"INT4", "UINT4", "FLOAT4E2M1"}


@dataclass(frozen=True)
class ExternalRef:
    location: str  # as written in the model: relative to the model's directory
    offset: int
    length: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    external: ExternalRef | None


@dataclass(frozen=True)
class InputInfo:
    name: str
    dims: tuple[int | str | None, ...]  # int: fixed; str: symbolic name; None: unknown

    @property
    def is_dynamic(self) -> bool:
        return any(not isinstance(d, int) for d in self.dims)

    def describe(self) -> str:
        return f"{self.name}[{','.join('?' if d is None else str(d) for d in self.dims)}]"


@dataclass(frozen=True)
class SourceModel:
    path: Path
    initializers: tuple[TensorInfo, ...]
    inputs: tuple[InputInfo, ...]
    external_files: tuple[Path, ...]  # resolved, each once, sorted
    proto_bytes: int
    op_counts: dict[str, int]  # op type -> nodes, in the source graph

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.initializers)

    @property
    def external_paths(self) -> dict[str, Path]:
        """Each external location as written in the model -> its checked, resolved path."""
        base = model_dir(self.path)
        return {t.external.location: (base / t.external.location).resolve() for t in self.initializers if t.external}

    @property
    def external_refs(self) -> list[ExternalRef]:
        """One reference per external data file, in the order of `external_files`."""
        seen: dict[str, ExternalRef] = {}
        for tensor in self.initializers:
            if tensor.external and tensor.external.location not in seen:
                seen[tensor.external.location] = tensor.external
        return sorted(seen.values(), key=lambda ref: (model_dir(self.path) / ref.location).resolve())

    @property
    def dynamic_inputs(self) -> list[InputInfo]:
        return [i for i in self.inputs if i.is_dynamic]

    @property
    def symbolic_dims(self) -> set[str]:
        return {d for i in self.inputs for d in i.dims if isinstance(d, str)}


def model_dir(model_path: Path) -> Path:
    """Where a model's relative locations start: the directory its path names (not a symlink target's)."""
    return model_path.absolute().parent.resolve()


def read_source(path: Path) -> SourceModel:
    """Parse the model's graph proto (never its external data) and check every external reference."""
    import onnx

    path = Path(path)
    if not path.exists():
        raise InvalidModel(f"{path}: no such file")
    if not path.is_file():
        raise InvalidModel(f"{path}: not a regular file")
    size = path.stat().st_size
    if size == 0:
        raise InvalidModel(f"{path}: empty file, not an ONNX model")
    if size > PROTOBUF_LIMIT:
        raise InvalidModel(f"{path}: {size} bytes is over the 2 GiB protobuf limit, so it cannot be an ONNX model file")
    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except Exception as exc:  # DecodeError, or onnx's own errors on odd bytes
        raise InvalidModel(f"{path}: not a valid ONNX model ({first_line(exc)})") from exc
    if model.ir_version <= 0 or not model.HasField("graph") or not model.graph.node:
        raise InvalidModel(f"{path}: parses as protobuf but is not an ONNX model with a graph")
    try:
        return _checked_source(path, model, size)
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:
        # protobuf hands back bytes for strings that are not UTF-8, and fuzzed fields break assumptions in
        # ways no single check names: one line, invalid input, never a traceback.
        raise InvalidModel(f"{path}: malformed model field ({type(exc).__name__}: {first_line(exc, 160)})") from exc


def _checked_source(path: Path, model: Any, size: int) -> SourceModel:
    initializers = tuple(_tensor_info(t, path) for t in model.graph.initializer)
    external_files = tuple(sorted({_resolve_location(path, t.name, t.external.location) for t in initializers if t.external}))
    _check_external_extents(path, initializers)
    _check_epcontext_paths(path, model)
    initializer_names = {t.name for t in initializers}
    inputs = tuple(_input_info(vi) for vi in model.graph.input if vi.name not in initializer_names)
    op_counts = dict(sorted(collections.Counter(str(n.op_type) for n in model.graph.node).items()))
    return SourceModel(path, initializers, inputs, external_files, size, op_counts)


def _tensor_info(tensor: Any, model_path: Path) -> TensorInfo:
    import onnx

    try:
        dtype = onnx.TensorProto.DataType.Name(tensor.data_type)
    except ValueError:
        raise InvalidModel(f"{model_path}: initializer {tensor.name!r} has an unknown data type {tensor.data_type}") from None
    shape = tuple(int(d) for d in tensor.dims)
    if any(d < 0 for d in shape):
        raise InvalidModel(f"{model_path}: initializer {tensor.name!r} has a negative dimension in its shape {list(shape)}")
    expected = _expected_nbytes(tensor.data_type, shape)
    external = None
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        external = _external_ref(tensor, model_path, expected)
        if expected is not None and external.length != expected:
            raise InvalidModel(
                f"{model_path}: initializer {tensor.name!r} has external length {external.length} "
                f"but its shape {list(shape)} of {dtype} needs {expected} bytes"
            )
    nbytes = external.length if external else _inline_nbytes(tensor, expected)
    return TensorInfo(tensor.name, dtype, shape, nbytes, external)


def _external_ref(tensor: Any, model_path: Path, expected: int | None) -> ExternalRef:
    """`length` is optional in ONNX: without it the tensor's own size is meant."""
    fields = {e.key: e.value for e in tensor.external_data}
    name = tensor.name
    if any(isinstance(v, bytes) or isinstance(k, bytes) for k, v in fields.items()):  # protobuf's answer to bad UTF-8
        raise InvalidModel(f"{model_path}: initializer {name!r} has external data fields that are not valid UTF-8")
    location = fields.get("location", "")
    if not location:
        raise InvalidModel(f"{model_path}: initializer {name!r} is external but has no location")
    try:
        offset = int(fields.get("offset", "0") or "0")
        length = int(fields["length"]) if fields.get("length") else expected
    except ValueError:
        raise InvalidModel(f"{model_path}: initializer {name!r} has a non-numeric external offset or length") from None
    if offset < 0:
        raise InvalidModel(f"{model_path}: initializer {name!r} has a negative external offset {offset}")
    if length is None or length < 0:
        raise InvalidModel(f"{model_path}: initializer {name!r} has a negative or missing external length")
    return ExternalRef(location, offset, length)


def _resolve_location(model_path: Path, owner: str, location: str, what: str = "external data path") -> Path:
    """Refuse absolute, `..` and symlinked paths that lead outside the model's directory.

    The directory is the one the model path names (ONNX Runtime resolves locations from there, even when
    the model file itself is a symlink); a location whose real path leaves it is refused, symlinks included.
    """
    base = model_dir(model_path)
    if not owner.startswith("EPContext"):
        owner = f"initializer {owner!r}"
    if os.path.isabs(location) or Path(location).drive:
        raise InvalidModel(f"{model_path}: {owner} has an absolute {what} {location!r}")
    if ".." in Path(location).parts:
        raise InvalidModel(f"{model_path}: {owner} has an {what} with '..': {location!r}")
    if "\0" in location:
        raise InvalidModel(f"{model_path}: {owner} has an {what} with a NUL byte")
    try:
        resolved = (base / location).resolve()
    except (OSError, RuntimeError) as exc:  # symlink loops, names too long
        raise InvalidModel(f"{model_path}: {owner} {what} {location[:100]!r} cannot be resolved ({type(exc).__name__}: {exc})") from None
    if not resolved.is_relative_to(base):
        raise InvalidModel(f"{model_path}: {owner} {what} {location!r} resolves outside the model's directory (to {resolved}); "
                           "copy or hard-link the files into one directory")
    return resolved


def _check_epcontext_paths(model_path: Path, model: object) -> None:
    """An already-compiled input names its EP blobs by path: the same rules as external data apply."""
    for node in model.graph.node:  # type: ignore[attr-defined]
        if node.op_type != "EPContext":
            continue
        attrs = {a.name: a for a in node.attribute}
        if "embed_mode" in attrs and attrs["embed_mode"].i == 1:
            continue
        if "ep_cache_context" in attrs and attrs["ep_cache_context"].s:
            location = attrs["ep_cache_context"].s.decode("utf-8", errors="replace")
            blob = _resolve_location(model_path, f"EPContext node {node.name!r}", location, what="EP context path")
            try:
                present = blob.is_file()
            except OSError as exc:
                raise InvalidModel(f"{model_path}: EPContext node {node.name!r} names EP context file {location[:100]!r}, "
                                   f"which cannot be read ({exc.strerror})") from None
            if not present:
                raise InvalidModel(f"{model_path}: EPContext node {node.name!r} names EP context file {location!r}, which is missing")


def _check_external_extents(model_path: Path, initializers: tuple[TensorInfo, ...]) -> None:
    sizes: dict[Path, int] = {}
    for tensor in initializers:
        if tensor.external is None:
            continue
        data_path = _resolve_location(model_path, tensor.name, tensor.external.location)
        if data_path not in sizes:
            try:
                if not data_path.is_file():
                    raise InvalidModel(f"{model_path}: external data file {tensor.external.location!r} (for {tensor.name!r}) is missing")
                sizes[data_path] = data_path.stat().st_size
            except OSError as exc:
                raise InvalidModel(f"{model_path}: external data file {tensor.external.location[:100]!r} (for {tensor.name!r}) "
                                   f"cannot be read ({exc.strerror})") from None
        end = tensor.external.offset + tensor.external.length
        if end > sizes[data_path]:
            raise InvalidModel(
                f"{model_path}: initializer {tensor.name!r} needs bytes up to {end} of "
                f"{tensor.external.location!r}, but that file has only {sizes[data_path]} bytes"
            )


def _expected_nbytes(data_type: int, shape: tuple[int, ...]) -> int | None:
    import onnx

    name = onnx.TensorProto.DataType.Name(data_type)
    if name in ("STRING", "UNDEFINED"):
        return None
    try:
        onnx.helper.tensor_dtype_to_np_dtype(data_type)
    except (KeyError, ValueError):
        return None  # a type numpy cannot describe: its size is not checked here
    count = math.prod(shape)
    if name in _PACKED_4BIT:
        return (count + 1) // 2
    return count * onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize


def _inline_nbytes(tensor: Any, expected: int | None) -> int:
    if tensor.raw_data:
        return len(tensor.raw_data)
    if expected is not None:
        return expected
    return sum(len(s) for s in tensor.string_data)


def _input_info(value_info: object) -> InputInfo:
    return InputInfo(value_info.name, input_dims(value_info))  # type: ignore[attr-defined]
