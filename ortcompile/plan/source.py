"""Read and check the input model's graph proto without loading its weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortcompile.errors import InvalidModel, first_line
from ortcompile.onnxfacts import (
    ExternalRef,
    MalformedTensor,
    TensorKind,
    TensorSite,
    blob_files,
    dtype_name,
    external_ref,
    graph_inputs,
    input_dims,
    iter_tensors,
    op_counts,
    stored_nbytes,
    tensor_nbytes,
)
from ortcompile.paths import UnsafePath, model_dir, not_a_model_file, resolve_inside, shown

PROTOBUF_LIMIT = 2**31 - 1  # protobuf refuses to serialize or parse a message larger than this


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int  # its data's bytes, wherever they are stored
    external: ExternalRef | None  # as written in the model: location relative to the model's directory
    graph: str = ""  # the graph holding it: "" for the main graph, else a subgraph path (onnxfacts.GraphSite.path)
    kind: TensorKind = "initializer"


@dataclass(frozen=True)
class InputInfo:
    name: str
    dims: tuple[int | str | None, ...]  # int: fixed; str: symbolic name; None: unknown
    dtype: str = ""  # ONNX's element type name ("FLOAT", "DOUBLE"); "" when not a tensor or not declared

    @property
    def is_dynamic(self) -> bool:
        return any(not isinstance(d, int) for d in self.dims)

    def describe(self) -> str:
        return f"{self.name}[{','.join('?' if d is None else str(d) for d in self.dims)}]"


@dataclass(frozen=True)
class SourceModel:
    path: Path
    tensors: tuple[TensorInfo, ...]  # every tensor of every graph: initializers, sparse initializers, Constant values
    inputs: tuple[InputInfo, ...]
    external_paths: dict[str, Path]  # each external location as written in the model -> its checked, resolved path
    proto_bytes: int
    op_counts: dict[str, int]  # op type -> nodes, in the source graph
    opset: int | None = None  # the default (ai.onnx) domain's opset the model imports; None when it imports none

    @property
    def initializers(self) -> tuple[TensorInfo, ...]:
        """The main graph's initializers."""
        return tuple(t for t in self.tensors if t.kind == "initializer" and not t.graph)

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def external_files(self) -> tuple[Path, ...]:
        """The external data files, resolved, each once, sorted."""
        return tuple(sorted(set(self.external_paths.values())))

    @property
    def external_locations(self) -> list[str]:
        """Each external location as written in the model, in the order of `external_files`."""
        return sorted(self.external_paths, key=lambda location: (self.external_paths[location], location))

    @property
    def symbolic_dims(self) -> set[str]:
        return {d for i in self.inputs for d in i.dims if isinstance(d, str)}


def read_source(path: Path) -> SourceModel:
    """Parse the model's graph proto (never its external data) and check every external reference."""
    path = Path(path)
    problem = not_a_model_file(path)
    if problem:
        raise InvalidModel(problem)
    size = path.stat().st_size
    if size == 0:
        raise InvalidModel(f"{path}: empty file, not an ONNX model")
    if size > PROTOBUF_LIMIT:
        raise InvalidModel(f"{path}: {size} bytes is over the 2 GiB protobuf limit, so it cannot be an ONNX model file")
    import onnx  # (only now: a missing or wrong path is reported without the import's second or more)

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
    # Every tensor of every graph: ORT reads external data for subgraph initializers and Constant values too.
    tensors = tuple(_tensor_info(path, site) for site in iter_tensors(model))
    external_paths: dict[str, Path] = {}
    for tensor in tensors:
        if tensor.external and tensor.external.location not in external_paths:
            external_paths[tensor.external.location] = _resolve_location(path, _owner(tensor), tensor.external.location)
    _check_external_extents(path, tensors, external_paths)
    _check_epcontext_paths(path, model)
    inputs = tuple(InputInfo(v.name, input_dims(v), (v.type.HasField("tensor_type") and dtype_name(v.type.tensor_type.elem_type)) or "")
                   for v in graph_inputs(model.graph))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    return SourceModel(path, tensors, inputs, external_paths, size, op_counts(model.graph.node), opset)


def _owner(tensor: TensorInfo | TensorSite) -> str:
    """How a message names a tensor: "initializer 'W'", "constant 'k' in subgraph 'If_0/then_branch'"."""
    kind = {"initializer": "initializer", "sparse_initializer": "sparse initializer", "attribute": "constant"}[tensor.kind]
    return f"{kind} {tensor.name!r}" + (f" in subgraph {tensor.graph!r}" if tensor.graph else "")


def _tensor_info(model_path: Path, site: TensorSite) -> TensorInfo:
    tensor, owner = site.tensor, _owner(site)
    dtype = dtype_name(tensor.data_type)
    if dtype is None:
        raise InvalidModel(f"{model_path}: {owner} has an unknown data type {tensor.data_type}")
    try:
        external = external_ref(tensor)
        nbytes = stored_nbytes(tensor)
    except MalformedTensor as exc:
        raise InvalidModel(f"{model_path}: {owner} {exc.problem}{_out_of_range(exc, tensor.data_type, dtype, tensor.dims)}") from None
    if nbytes is None:  # external, without a length, of a type without a fixed size
        raise InvalidModel(f"{model_path}: {owner} is external without a length, and {dtype} has no fixed size")
    return TensorInfo(site.name, dtype, tuple(int(d) for d in tensor.dims), nbytes, external, site.graph, site.kind)


def _out_of_range(exc: MalformedTensor, data_type: int, dtype: str, dims: Any) -> str:
    """For an offset or length beyond int64: what the tensor needs, in the words of the extent and length checks."""
    if exc.number is None:
        return ""
    try:
        own = tensor_nbytes(data_type, dims)
    except ValueError:
        return ""
    if own is None:
        return ""
    if exc.field == "length":
        return f"; its shape {list(dims)} of {dtype} needs {own} bytes"
    return f", so it needs bytes up to {exc.number + own}"


def _resolve_location(model_path: Path, owner: str, location: str, what: str = "external data path") -> Path:
    """Refuse absolute, `..` and symlinked paths that lead outside the model's directory (paths.resolve_inside).

    The directory is the one the model path names (ONNX Runtime resolves locations from there, even when
    the model file itself is a symlink); a location whose real path leaves it is refused, symlinks included.
    """
    base = model_dir(model_path)
    try:
        return resolve_inside(base, location)
    except UnsafePath as exc:
        raise InvalidModel(f"{model_path}: {_unsafe(owner, what, location, exc, base)}") from None


def _unsafe(owner: str, what: str, location: str, exc: UnsafePath, base: Path) -> str:
    if exc.rule == "absolute":
        return f"{owner} has an absolute {what} {location!r}"
    if exc.rule == "parent":
        return f"{owner} has an {what} with '..': {location!r}"
    if exc.rule == "nul":
        return f"{owner} has an {what} with a NUL byte"
    if exc.rule == "outside" and exc.resolved != base:
        return f"{owner} {what} {location!r} resolves outside the model's directory (to {exc.resolved}); copy or hard-link the files into one directory"
    if exc.rule == "too-long":
        return f"{owner} {what} {shown(location)!r} {exc.reason}: File name too long"
    return f"{owner} {what} {shown(location)!r} {exc.reason}"


def _check_epcontext_paths(model_path: Path, model: Any) -> None:
    """An already-compiled input names its EP blobs by path: the same rules as external data apply."""
    for node, location in blob_files(model):
        owner = f"EPContext node {node.name!r}"
        blob = _resolve_location(model_path, owner, location, what="EP context path")
        try:
            present = blob.is_file()
        except OSError as exc:
            raise InvalidModel(f"{model_path}: {owner} names EP context file {shown(location)!r}, which cannot be read ({exc.strerror})") from None
        if not present:
            raise InvalidModel(f"{model_path}: {owner} names EP context file {location!r}, which is missing")


def _check_external_extents(model_path: Path, tensors: tuple[TensorInfo, ...], paths: dict[str, Path]) -> None:
    sizes: dict[Path, int] = {}
    for tensor in tensors:
        if tensor.external is None:
            continue
        location = tensor.external.location
        data_path = paths[location]
        if data_path not in sizes:
            try:
                if not data_path.is_file():
                    raise InvalidModel(f"{model_path}: external data file {location!r} (for {_owner(tensor)}) is missing")
                sizes[data_path] = data_path.stat().st_size
            except OSError as exc:
                raise InvalidModel(f"{model_path}: external data file {shown(location)!r} (for {_owner(tensor)}) "
                                   f"cannot be read ({exc.strerror})") from None
        end = tensor.external.offset + tensor.nbytes
        if end > sizes[data_path]:
            raise InvalidModel(
                f"{model_path}: {_owner(tensor)} needs bytes up to {end} of {location!r}, but that file has only {sizes[data_path]} bytes"
            )
