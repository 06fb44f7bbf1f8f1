"""Static shapes for NPU EPs: --fix-dim / --fix-shape become pins, and a compile that needs static shapes
refuses to start while an input dimension is still dynamic.

NPU EPs such as QNN compile nothing useful from a dynamic graph: they take only the shape-computation
glue (Shape, Gather, Concat on int64 tensors) and the output then fails to load. The prepare step writes
the pins into the graph itself (named dims everywhere they appear, unnamed ones on their input) so ORT's
constant folding can turn the shape glue into constants; without it (`--no-prepare`) named dims are
pinned through ORT's free-dimension overrides, which cannot reach unnamed dims.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ortcompile.errors import UsageError
from ortcompile.onnxfacts import iter_graphs
from ortcompile.plan.source import InputInfo, SourceModel

# No tensor can have a dimension above this: 2**48 elements along one axis take 128 TiB even at 4 bits each (int4),
# the whole user address space of an x86-64 or ARM64 Linux process (48-bit virtual addresses). ONNX Runtime would
# take up to 2**63-1 (int64), and then every allocation fails: refused before any work instead.
MAX_DIM = 1 << 48
MAX_DIM_REASON = "a tensor with more elements along one axis would not fit in a 64-bit process's 128 TiB address space, even at 4 bits each"


@dataclass(frozen=True)
class Pins:
    """Values for a model's dynamic input dimensions."""

    named: dict[str, int] = field(default_factory=dict)  # symbolic dim name -> value, for the whole graph
    unnamed: dict[str, dict[int, int]] = field(default_factory=dict)  # input -> {axis: value} for dims without a name

    def shape_of(self, model_input: InputInfo) -> tuple[int | str | None, ...]:
        """The input's dims with the pins applied (what is left dynamic stays a name or None)."""
        axes = self.unnamed.get(model_input.name, {})
        return tuple(
            axes.get(axis, d) if d is None else self.named.get(d, d) if isinstance(d, str) else d
            for axis, d in enumerate(model_input.dims)
        )

    def to_json(self) -> dict[str, object]:
        unnamed = {k: {str(a): v for a, v in sorted(axes.items())} for k, axes in sorted(self.unnamed.items())}
        return {"dims": dict(sorted(self.named.items())), "unnamed": unnamed}


def parse_fix_dims(pairs: Iterable[str | tuple[str, str]] | Mapping[str, str | int], flag: str = "--fix-dim") -> dict[str, int]:
    """NAME=VALUE pairs (strings, or (name, value) tuples from the CLI's KEY=VALUE type), e.g. batch=1; `flag` names
    the option in messages (verify and bench call it --dim)."""
    dims: dict[str, int] = {}
    for pair in pairs.items() if isinstance(pairs, Mapping) else pairs:
        name, sep, value = pair.partition("=") if isinstance(pair, str) else (pair[0], "=", str(pair[1]))
        shown = pair if isinstance(pair, str) else f"{name}={value}"
        if not sep or not name.strip():
            raise UsageError(f"bad {flag} {shown!r}: expected NAME=VALUE, e.g. batch=1")
        dims[name.strip()] = _positive(value, f"{flag} {shown!r}")
    return dims


def parse_fix_shapes(pairs: list[str] | tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """INPUT=D0,D1,... pairs, e.g. pixel_values=1,3,224,224."""
    shapes: dict[str, tuple[int, ...]] = {}
    for pair in pairs:
        name, sep, dims = pair.rpartition("=")
        if not sep or not name.strip() or not dims.strip():
            raise UsageError(f"bad --fix-shape {pair!r}: expected INPUT=D0,D1,..., e.g. x=1,3,224,224")
        shapes[name.strip()] = tuple(_positive(d, f"--fix-shape {pair!r}") for d in dims.split(","))
    return shapes


def _positive(text: str, what: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise UsageError(f"bad {what}: {text.strip()!r} is not a whole number") from None
    return check_dim(value, f"bad {what}")


def check_dim(value: int, what: str) -> int:
    """A dimension some tensor could have, or a UsageError starting with `what` that gives the bound and why."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{what}: {value!r} is not a whole number")
    if value <= 0:
        raise UsageError(f"{what}: dimensions must be positive")
    if value > MAX_DIM:
        raise UsageError(f"{what}: {value} is too large: at most 2**48 = {MAX_DIM} ({MAX_DIM_REASON})")
    return value


def resolve_pins(source: SourceModel, fix_dims: dict[str, int], fix_shapes: dict[str, tuple[int, ...]], *, allow_unnamed: bool = True) -> Pins:
    """Check the requests against the model's inputs. Unnamed dims can be pinned only by the prepare step."""
    known = source.symbolic_dims
    for name, value in fix_dims.items():  # values from the Python API and the config file arrive unparsed here
        check_dim(value, f"--fix-dim {name}={value}")
        if name not in known:
            listed = ", ".join(sorted(known)) or "none"
            raise UsageError(f"--fix-dim {name}: the model has no symbolic dimension {name!r} (it has: {listed})")
    pins = Pins(dict(fix_dims), {})
    inputs = {i.name: i for i in source.inputs}
    for input_name, shape in fix_shapes.items():
        for value in shape:
            check_dim(value, f"--fix-shape {input_name}={','.join(map(str, shape))}")
        if input_name not in inputs:
            raise UsageError(f"--fix-shape {input_name}: the model has no input {input_name!r} (it has: {', '.join(inputs)})")
        _merge_shape(pins, inputs[input_name], shape, allow_unnamed)
    return pins


def dimension_overrides(source: SourceModel, fix_dims: dict[str, int], fix_shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Named pins only, for ORT's free-dimension overrides (sessions and compiles without the prepare step)."""
    return resolve_pins(source, fix_dims, fix_shapes, allow_unnamed=False).named


def _merge_shape(pins: Pins, model_input: InputInfo, shape: tuple[int, ...], allow_unnamed: bool) -> None:
    if len(shape) != len(model_input.dims):
        raise UsageError(f"--fix-shape {model_input.name}: the input has rank {len(model_input.dims)}, not {len(shape)}")
    for axis, (declared, wanted) in enumerate(zip(model_input.dims, shape)):
        if isinstance(declared, int):
            if declared != wanted:
                raise UsageError(f"--fix-shape {model_input.name}: dimension {axis} is fixed at {declared}, not {wanted}")
        elif declared is None:
            if not allow_unnamed:
                raise UsageError(f"--fix-shape {model_input.name}: dimension {axis} has no name, so ONNX Runtime cannot pin it "
                                 "(the prepare step can: drop --no-prepare)")
            pins.unnamed.setdefault(model_input.name, {})[axis] = wanted
        elif pins.named.setdefault(declared, wanted) != wanted:
            raise UsageError(f"--fix-shape {model_input.name}: dimension {declared!r} is already fixed to {pins.named[declared]}")


def still_dynamic(source: SourceModel, pins: Pins, frozen: set[str] = frozenset()) -> list[InputInfo]:  # type: ignore[assignment]
    """Inputs with a dimension no pin reaches, shown with the pins applied (frozen inputs become constants)."""
    left = []
    for model_input in source.inputs:
        if model_input.name in frozen:
            continue
        shape = pins.shape_of(model_input)
        if any(not isinstance(d, int) for d in shape):
            left.append(InputInfo(model_input.name, shape, model_input.dtype))
    return left


def require_static(source: SourceModel, pins: Pins, ep_short_name: str, frozen: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """Refuse before any work: an NPU EP given a dynamic graph compiles only shape glue that does not load."""
    left = still_dynamic(source, pins, frozen)
    if not left:
        return
    names = sorted({d for i in left for d in i.dims if isinstance(d, str)})
    unnamed = [i for i in left if any(d is None for d in i.dims)]
    flags = [f"--fix-dim {n}=N" for n in names]
    flags += [f"--fix-shape {i.name}=" + ",".join(str(d) if isinstance(d, int) else "N" for d in i.dims) for i in unnamed]
    raise UsageError(f"{ep_short_name} compiles static shapes only, and these inputs are still dynamic: "
                     f"{', '.join(i.describe() for i in left)}; add {' '.join(flags)} (N: the size you will run with)")


def dynamic_inputs_hint(source: SourceModel, overrides: dict[str, int]) -> str:
    """Say which inputs are still dynamic and how to pin them; empty when none are."""
    left = still_dynamic(source, Pins(overrides, {}))
    if not left:
        return ""
    names = sorted({d for i in left for d in i.dims if isinstance(d, str)})
    fix = " ".join(f"--fix-dim {n}=1" for n in names) or f"--fix-shape {left[0].name}=..."
    return f"; dynamic inputs: {', '.join(i.describe() for i in left)}; NPU EPs need static shapes: try {fix}"


def apply_pins(model: Any, pins: Pins) -> None:
    """Named dims get their value wherever they appear (every graph); unnamed ones on their input only."""
    for site in iter_graphs(model):
        for value in (*site.graph.input, *site.graph.output, *site.graph.value_info):
            for dim in value_dims(value):
                if dim.HasField("dim_param") and dim.dim_param in pins.named:
                    dim.dim_value = pins.named[dim.dim_param]  # setting the value clears the param (a oneof)
                elif dim.HasField("dim_value") and dim.dim_value < 0:
                    dim.Clear()  # -1 is an exporter's "unknown"; left in place it reads as a bad size
    for graph_input in model.graph.input:
        for axis, value in pins.unnamed.get(graph_input.name, {}).items():
            dim = value_dims(graph_input)[axis]
            dim.Clear()
            dim.dim_value = value


def value_dims(value: Any) -> Any:
    """The dims of a value's tensor shape (empty when it has none)."""
    tensor_type = value.type.tensor_type
    return tensor_type.shape.dim if value.type.HasField("tensor_type") and tensor_type.HasField("shape") else []
