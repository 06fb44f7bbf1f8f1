"""Inputs for a model: what each input is, and seeded arrays that respect what the source graph says.

`make_feeds` picks, per input, in this order:

1. an array or scalar the user gave (`given`), checked against the input (given.py) and noted as `NAME: given (ORIGIN)`;
2. by the input's role (roles.py): an edge set's value (inputsets.py: silence, tones, images, padded ids), else
   for an LLM input (token ids aside: see 5) when the model has a cache, a RoPE table or an additive mask, one
   realistic prefill step over a partly filled cache (llm.py);
3. a position-id-like name (`position_ids`, `pos_ids`, ...): 0, 1, 2, ... along the last axis;
4. a bool input or a mask-like name (`attention_mask`, ...): all true / all ones (nothing masked out: a
   random mask can mask everything and turn a softmax into NaN);
5. a hint from the source graph (hints.py): indices into a table -> uniform in [0, N); compared with a
   constant -> that constant; a Resize's scales or sizes -> what the shapes around it imply;
6. otherwise random: floats uniform in [-1, 1), integers in [0, 4) (valid as small indices and axes),
   strings "ortcompile".

Every symbolic or unknown dimension gets a value: `dims`, else the shape of a given array, else a guess
(see `guess_dim`) reported in `Feeds.guessed` and `Feeds.notes`. Dims come from users (`--dim`, a compile's
`--fix-dim`): inputs they would make larger than the memory available are refused in one line before
anything is allocated (numpy would raise MemoryError, or overcommit and let the OOM killer end the process). Each input has its own random stream,
seeded from (seed, input name): the same seed gives the same arrays whatever the input order, and giving
one input does not change the others.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ortcompile.errors import UsageError
from ortcompile.native import proc_kib_field
from ortcompile.onnxfacts import graph_inputs, input_dims
from ortcompile.readback.given import Given, conform, load_inputs, parse_input
from ortcompile.readback.hints import InputHint, read_hints
from ortcompile.readback.inputsets import edge_value, sample_rate
from ortcompile.readback.inputspec import InputSpec
from ortcompile.readback.llm import Layout, layout_of, llm_value
from ortcompile.readback.roles import LLM_ROLES, TOKEN_IDS, ModelFacts, genai_int, role_of

Arrays = dict[str, np.ndarray]  # a model's inputs or outputs by name, as a session takes and gives them

__all__ = [
    "Feeds", "Given", "InputHint", "InputSpec", "guess_dim", "load_inputs", "make_feeds", "numpy_dtype", "parse_input", "read_hints",
    "specs_from_model", "specs_from_session", "unknown_dims",
]

# Guessed dims (measured on the real-model corpus, CPU EP). The leading axis is a batch in nearly every
# exported model: 1 keeps runs cheap. Other axes are spatial or sequence axes, where 1 breaks models (a
# detector's 1x1 image fails shape inference after its downsampling). No single size fits both kinds:
# - rank-4 inputs are images (NCHW/NHWC): 64 is a multiple of 32, the usual total stride of CNN backbones;
#   an OCR recognizer fails at height 128 (it expects the height to collapse to 1 or 2 rows).
# - other inputs are sequences (token ids, audio samples, features): 256, because audio models pad and
#   window their input (silero VAD: a reflect pad of 64 and a 256-sample STFT fail on 64 or 128 samples),
#   and a 256 x 256 attention map still runs in under a second on the CPU EP.
DEFAULT_BATCH = 1
IMAGE_EXTENT = 64
SEQUENCE_EXTENT = 256
INTEGER_HIGH = 4  # integers without a hint are drawn from [0, 4): valid as small indices, token ids, axes
STRING_VALUE = "ortcompile"
GIVEN_NOTE = "given"  # the note on an input the user gave: "NAME: given (ORIGIN)"

MASK_NAME = re.compile(r"mask", re.IGNORECASE)
POSITION_NAME = re.compile(r"position|(^|[_./])pos(_?ids?)?$", re.IGNORECASE)
BATCH_NAME = re.compile(r"batch", re.IGNORECASE)

# ORT's type strings -> ONNX element types (TensorProto.DataType).
_ORT_TYPES = {f"tensor({name.lower()})": value for name, value in onnx.TensorProto.DataType.items()}  # "tensor(float)", ...


@dataclass
class Feeds:
    """Arrays to feed, every non-fixed dim's value, the dims that were guessed, and notes on what was chosen."""

    arrays: dict[str, np.ndarray]
    dims: dict[str, int] = field(default_factory=dict)
    guessed: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    roles: dict[str, str] = field(default_factory=dict)  # input -> role (roles.py), for the edge sets to plan


def numpy_dtype(ort_type: str) -> np.dtype | None:
    """The numpy dtype of an ORT type string such as "tensor(float16)" (None: numpy cannot hold it)."""
    return InputSpec("", _ORT_TYPES.get(ort_type, 0), (), ort_type).dtype


def _dims(shape: Iterable[Any]) -> tuple[int | str | None, ...]:
    return tuple(d if isinstance(d, str) or d is None else (int(d) if int(d) >= 0 else None) for d in shape)


def specs_from_session(session: Any) -> list[InputSpec]:
    """Specs of an onnxruntime InferenceSession's inputs, in its order."""
    return [InputSpec(a.name, _ORT_TYPES.get(a.type, 0), _dims(a.shape), a.type) for a in session.get_inputs()]


def specs_from_model(model: onnx.ModelProto) -> list[InputSpec]:
    """Specs of an ONNX graph's inputs, initializers excluded (they are weights with defaults, not inputs)."""
    specs = []
    for value in graph_inputs(model.graph):
        tensor = value.type.tensor_type if value.type.HasField("tensor_type") else None
        dims = input_dims(value) if tensor is not None else ()
        elem = tensor.elem_type if tensor is not None else 0
        text = f"tensor({onnx.TensorProto.DataType.Name(elem).lower()})" if tensor is not None else value.type.WhichOneof("value")
        specs.append(InputSpec(value.name, elem, dims, text))
    return specs


def unknown_dims(specs: Sequence[InputSpec], dims: Mapping[str, int]) -> list[str]:
    """Keys of `dims` that name no non-fixed dim of these inputs (for a usage error on a typo)."""
    keys = {spec.dim_key(axis) for spec in specs for axis in range(len(spec.dims))}
    return sorted(set(dims) - keys)


def guess_dim(key: str, specs: Sequence[InputSpec]) -> int:
    """DEFAULT_BATCH for a batch (named like one, or the leading axis of a rank >= 2 input), else IMAGE_EXTENT
    for an axis of a rank-4 input, else SEQUENCE_EXTENT; a dim shared by several inputs takes the smallest guess.

    Unnamed dims (None, "?") are guessed one by one: two that must be equal (e.g. a batch written as None in
    two inputs) cannot be told apart from the graph's inputs, so they are reported as guessed and `dims`
    sets them by `NAME[AXIS]`.
    """
    guesses = [SEQUENCE_EXTENT]
    for spec in specs:
        for axis in range(len(spec.dims)):
            if spec.dim_key(axis) != key:
                continue
            if (axis == 0 and len(spec.dims) >= 2) or BATCH_NAME.search(key):
                guesses.append(DEFAULT_BATCH)
            elif len(spec.dims) == 4:
                guesses.append(IMAGE_EXTENT)
    return min(guesses)


def make_feeds(
    specs: Sequence[InputSpec],
    *,
    seed: int = 0,
    dims: Mapping[str, int] | None = None,
    given: Mapping[str, Given | np.ndarray | int | float | bool] | None = None,
    hints: Mapping[str, InputHint] | None = None,
    facts: ModelFacts | None = None,
    edge: str = "",
) -> Feeds:
    """One array per input (see the module docstring for how each is chosen). `facts`: what the source graph and
    its genai_config say about the inputs (roles.read_facts); `edge`: an edge set's style (inputsets.py)."""
    by_name = {spec.name: spec for spec in specs}
    given = {name: value if isinstance(value, Given) else Given(value) for name, value in (given or {}).items()}
    unknown = sorted(set(given) - set(by_name))
    if unknown:
        raise UsageError(f"unknown input {unknown[0]!r}: the model's inputs are {', '.join(by_name)}")
    for spec in specs:
        if spec.dtype is None and spec.name not in given:
            raise UsageError(f"input {spec.name!r} has type {spec.describe()}, which cannot be generated from Python")
    feeds = Feeds({})
    _choose_dims(feeds, specs, dict(dims or {}), given)
    shapes = {spec.name: tuple(d if isinstance(d, int) else feeds.dims[spec.dim_key(a)] for a, d in enumerate(spec.dims)) for spec in specs}
    made = [spec for spec in specs if not isinstance(given.get(spec.name, Given(0)).value, np.ndarray)]  # the arrays allocated here
    _require_memory(made, shapes, feeds.dims)
    facts, hints = facts or ModelFacts(), hints or {}
    extents = {name: shape[-1] if shape else None for name, shape in shapes.items()}
    feeds.roles = {spec.name: role for spec in specs if (role := role_of(spec, facts, hints.get(spec.name), extents[spec.name]))}
    layout = layout_of(feeds.roles, shapes, genai_int(facts, "head_size"))
    special = _RoleValues(feeds.roles, layout, facts, hints, edge, seed)
    for spec in specs:
        shape = shapes[spec.name]
        try:
            if spec.name in given:
                feeds.arrays[spec.name] = conform(spec, given[spec.name], shape)
                feeds.notes.append(f"{spec.name}: {GIVEN_NOTE} ({given[spec.name].origin})")
            elif (chosen := special.value(spec, shape)) is not None:
                feeds.arrays[spec.name] = chosen[0]
                feeds.notes.append(f"{spec.name}: {chosen[1]}")
            else:
                feeds.arrays[spec.name] = _generate(spec, shape, seed, hints.get(spec.name), feeds.notes)
        except (MemoryError, ValueError) as exc:  # numpy: "Unable to allocate ...", "array is too big ..."
            if isinstance(exc, ValueError) and "too big" not in str(exc):
                raise
            raise UsageError(f"input {spec.name!r} as {_shown(spec, shape)} cannot be allocated here ({type(exc).__name__}); "
                             f"{_smaller_dims(feeds.dims)}") from None
    return feeds


def _require_memory(specs: Sequence[InputSpec], shapes: Mapping[str, tuple[int, ...]], dims: Mapping[str, int]) -> None:
    """Refuse inputs that would not fit in the memory available (Linux MemAvailable; elsewhere numpy's MemoryError
    is caught instead), naming the largest one and the dims that made it."""
    needs = {spec.name: math.prod(shapes[spec.name]) * (spec.dtype.itemsize if spec.dtype is not None else 0) for spec in specs}
    available = proc_kib_field("/proc/meminfo", "MemAvailable")
    total = sum(needs.values())
    if available is None or total <= available:
        return
    largest = max(needs, key=lambda name: needs[name])
    spec = next(s for s in specs if s.name == largest)
    what = f"input {largest!r} as {_shown(spec, shapes[largest])}"
    size = f"{what} would take {size_text(total)}" if len(needs) == 1 else \
        f"the inputs would take {size_text(total)} (the largest, {what}: {size_text(needs[largest])})"
    raise UsageError(f"{size}, more than the {size_text(available)} of memory available; {_smaller_dims(dims)}")


def _shown(spec: InputSpec, shape: tuple[int, ...]) -> str:
    return f"{spec.type_text or spec.describe().split('[')[0]}[{','.join(map(str, shape))}]"


def _smaller_dims(dims: Mapping[str, int]) -> str:
    chosen = ", ".join(f"{k}={v}" for k, v in dims.items())
    return f"give smaller dims (chosen: {chosen}; --dim, or the compile's --fix-dim/--fix-shape)" if chosen else "the model's fixed shapes are too large"


def size_text(size: int) -> str:
    """Bytes for a message: 1.5 GiB, 2.0 PiB (sizes of any magnitude, as huge dims give)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} EiB"


def _choose_dims(feeds: Feeds, specs: Sequence[InputSpec], explicit: dict[str, int], given: Mapping[str, Given]) -> None:
    """Explicit dims win, then the shapes of given arrays (which must agree with each other), then guesses."""
    feeds.dims.update(explicit)
    from_arrays: dict[str, tuple[int, str]] = {}
    for spec in specs:
        item = given.get(spec.name)
        if item is None or not isinstance(item.value, np.ndarray):
            continue  # a scalar given on the command line fills the input's shape; it sets no dim
        for axis, size in enumerate(item.value.shape[: len(spec.dims)]):
            key = spec.dim_key(axis)
            if key is None:
                continue
            where = f"input {spec.name!r} ({item.origin})"
            if key in explicit and explicit[key] != size:
                raise UsageError(f"{where} has {key}={size}, but {key}={explicit[key]} was asked for")
            if key in from_arrays and from_arrays[key][0] != size:
                raise UsageError(f"{where} has {key}={size}, but {from_arrays[key][1]} has {key}={from_arrays[key][0]}")
            from_arrays.setdefault(key, (size, where))
    feeds.dims.update({key: size for key, (size, _) in from_arrays.items() if key not in explicit})
    for spec in specs:
        for axis in range(len(spec.dims)):
            key = spec.dim_key(axis)
            if key is not None and key not in feeds.dims:
                feeds.dims[key] = feeds.guessed[key] = guess_dim(key, specs)
    if feeds.guessed:
        feeds.notes.append("guessed dims: " + ", ".join(f"{k}={v}" for k, v in feeds.guessed.items()))


class _RoleValues:
    """Values chosen by role: an edge set's, else an LLM input's (None: the generic generator decides)."""

    def __init__(self, roles: dict[str, str], layout: Layout | None, facts: ModelFacts, hints: Mapping[str, InputHint], edge: str, seed: int) -> None:
        self.roles, self.layout, self.facts, self.hints, self.edge, self.seed = roles, layout, facts, hints, edge, seed
        self.rate = sample_rate([h.value for h in hints.values()])

    def value(self, spec: InputSpec, shape: tuple[int, ...]) -> tuple[np.ndarray, str] | None:
        role, dtype, hint = self.roles.get(spec.name, ""), spec.dtype, self.hints.get(spec.name)
        if not role or dtype is None or dtype.kind == "O":
            return None
        if self.edge:
            pad = genai_int(self.facts, "pad_token_id") or 0
            made = edge_value(self.edge, role, shape, dtype, self.rate, pad if not hint or not hint.high or pad < hint.high else 0,
                              hint.high if hint else None)
            if made is not None:
                return made
        if self.layout is None or role not in LLM_ROLES or role == TOKEN_IDS or not shape:
            return None  # token ids: the hint's in-table ids (or genai's vocabulary) below
        return llm_value(role, shape, dtype, self.layout, _rng(self.seed, spec.name), hint.high if hint else None, self.facts.rope_theta)


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])  # crc32: stable across processes, unlike hash()


def _generate(spec: InputSpec, shape: tuple[int, ...], seed: int, hint: InputHint | None, notes: list[str]) -> np.ndarray:
    dtype = spec.dtype
    assert dtype is not None  # make_feeds refused the others
    if dtype.kind == "O":
        return np.full(shape, STRING_VALUE, dtype=object)
    numeric = dtype.kind in "iuf"
    if numeric and POSITION_NAME.search(spec.name) and shape:
        high = hint.high if hint and hint.high else None
        notes.append(f"{spec.name}: positions 0..{shape[-1] - 1} along the last axis" + (f", modulo {high}" if high else "") + " (named like position ids)")
        positions = np.arange(shape[-1]) % high if high else np.arange(shape[-1])
        return np.broadcast_to(positions, shape).astype(dtype)
    if dtype.kind == "b" or (numeric and MASK_NAME.search(spec.name)):
        what = "true (a bool input" if dtype.kind == "b" else "ones (named like a mask"
        notes.append(f"{spec.name}: all {what}: nothing masked out)")
        return np.ones(shape, dtype=dtype)
    rng = _rng(seed, spec.name)
    if hint and hint.high and dtype.kind in "iu":
        notes.append(f"{spec.name}: uniform in [0, {hint.high}) ({hint.why})")
        return rng.integers(0, hint.high, size=shape).astype(dtype)
    if hint and hint.values is not None and numeric and math.prod(shape) == len(hint.values):
        notes.append(f"{spec.name}: {list(hint.values)} ({hint.why})")
        return np.array(hint.values, dtype=dtype).reshape(shape)
    if hint and hint.value is not None and numeric:
        notes.append(f"{spec.name}: {hint.value} everywhere ({hint.why})")
        return np.full(shape, hint.value, dtype=dtype)
    if dtype.kind in "iu":
        return rng.integers(0, INTEGER_HIGH, size=shape).astype(dtype)
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
