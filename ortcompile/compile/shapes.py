"""Static shapes for NPU EPs: turn --fix-dim / --fix-shape into ONNX Runtime free-dimension overrides.

NPU EPs such as QNN compile nothing when an input has a symbolic dimension. ORT's session option
`add_free_dimension_override_by_name` pins a named dimension for the whole graph, and the compiled
model then carries the fixed shape.
"""

from __future__ import annotations

from ortcompile.compile.source import InputInfo, SourceModel
from ortcompile.errors import UsageError

INT64_MAX = 2**63 - 1  # ONNX Runtime takes dimensions as int64


def parse_fix_dims(pairs: list[str] | tuple[str, ...]) -> dict[str, int]:
    """NAME=VALUE pairs, e.g. batch=1."""
    dims: dict[str, int] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"bad --fix-dim {pair!r}: expected NAME=VALUE, e.g. batch=1")
        dims[name.strip()] = _positive(value, f"--fix-dim {pair!r}")
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
    if value <= 0:
        raise UsageError(f"bad {what}: dimensions must be positive")
    if value > INT64_MAX:
        raise UsageError(f"bad {what}: {value} is too large (at most 2**63-1)")
    return value


def dimension_overrides(source: SourceModel, fix_dims: dict[str, int], fix_shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Check the requests against the model's inputs; return symbolic name -> value."""
    known = source.symbolic_dims
    for name in fix_dims:
        if name not in known:
            listed = ", ".join(sorted(known)) or "none"
            raise UsageError(f"--fix-dim {name}: the model has no symbolic dimension {name!r} (it has: {listed})")
    overrides = dict(fix_dims)
    inputs = {i.name: i for i in source.inputs}
    for input_name, shape in fix_shapes.items():
        if input_name not in inputs:
            raise UsageError(f"--fix-shape {input_name}: the model has no input {input_name!r} (it has: {', '.join(inputs)})")
        _merge_shape(overrides, inputs[input_name], shape)
    return overrides


def _merge_shape(overrides: dict[str, int], model_input: InputInfo, shape: tuple[int, ...]) -> None:
    if len(shape) != len(model_input.dims):
        raise UsageError(f"--fix-shape {model_input.name}: the input has rank {len(model_input.dims)}, not {len(shape)}")
    for axis, (declared, wanted) in enumerate(zip(model_input.dims, shape)):
        if isinstance(declared, int):
            if declared != wanted:
                raise UsageError(f"--fix-shape {model_input.name}: dimension {axis} is fixed at {declared}, not {wanted}")
        elif declared is None:
            raise UsageError(
                f"--fix-shape {model_input.name}: dimension {axis} has no name, so ONNX Runtime cannot pin it"
            )
        elif overrides.setdefault(declared, wanted) != wanted:
            raise UsageError(f"--fix-shape {model_input.name}: dimension {declared!r} is already fixed to {overrides[declared]}")


def dynamic_inputs_hint(source: SourceModel, overrides: dict[str, int]) -> str:
    """Say which inputs are still dynamic and how to pin them; empty when none are."""
    still = [i for i in source.dynamic_inputs if any(not isinstance(d, int) and d not in overrides for d in i.dims)]
    if not still:
        return ""
    names = sorted({d for i in still for d in i.dims if isinstance(d, str) and d not in overrides})
    fix = " ".join(f"--fix-dim {n}=1" for n in names) or f"--fix-shape {still[0].name}=..."
    return f"; dynamic inputs: {', '.join(i.describe() for i in still)}; NPU EPs need static shapes: try {fix}"
