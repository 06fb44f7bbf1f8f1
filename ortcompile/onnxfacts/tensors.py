"""Tensor facts: ONNX data types and byte sizes (int4, float8 included), external-data references.

Every reader asks here instead of parsing fields by hand, so each rule is written once: what a missing
`length` means, how INT4 packs, what ORT accepts as a number. Nothing here opens a file;
`ortcompile.paths.resolve_inside` decides whether a location may be opened. The compile path refuses a
malformed tensor (`MalformedTensor`, a ValueError); `inspect` reports what it can (`lenient_external_ref`).
Importing this module does not import onnx (see the package docstring).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from onnx import TensorProto

EPCONTEXT = "EPContext"
INT64_MAX = 2**63 - 1

# ONNX data types with a fixed size: (name, TensorProto.DataType number, bits per element). The numbers are
# fixed by the protobuf schema (tests check them against onnx). Sub-byte types are packed, so n elements
# take ceil(n * bits / 8) bytes (the ONNX IR spec; onnx.helper.make_tensor checks raw data by this rule).
# STRING and UNDEFINED have no size; a type onnx adds later counts as unknown (size None) until it is
# listed here, and tests/test_onnxfacts.py fails to say so.
DATA_TYPES = (
    ("FLOAT", 1, 32), ("UINT8", 2, 8), ("INT8", 3, 8), ("UINT16", 4, 16), ("INT16", 5, 16), ("INT32", 6, 32),
    ("INT64", 7, 64), ("BOOL", 9, 8), ("FLOAT16", 10, 16), ("DOUBLE", 11, 64), ("UINT32", 12, 32),
    ("UINT64", 13, 64), ("COMPLEX64", 14, 64), ("COMPLEX128", 15, 128), ("BFLOAT16", 16, 16),
    ("FLOAT8E4M3FN", 17, 8), ("FLOAT8E4M3FNUZ", 18, 8), ("FLOAT8E5M2", 19, 8), ("FLOAT8E5M2FNUZ", 20, 8),
    ("UINT4", 21, 4), ("INT4", 22, 4), ("FLOAT4E2M1", 23, 4), ("FLOAT8E8M0", 24, 8), ("UINT2", 25, 2),
    ("INT2", 26, 2), ("FLOAT6E2M3", 27, 6), ("FLOAT6E3M2", 28, 6),
)
_BITS = {number: bits for _, number, bits in DATA_TYPES}

# Enum numbers of the protobuf schema (checked against onnx in the tests), so no `import onnx` is needed.
EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
STRING = 8  # TensorProto.DataType.STRING: no fixed size; ORT never moves such a tensor out of the proto
ATTR_INT, ATTR_STRING, ATTR_TENSOR, ATTR_GRAPH = 2, 3, 4, 5  # AttributeProto.AttributeType
ATTR_TENSORS, ATTR_GRAPHS, ATTR_SPARSE_TENSOR, ATTR_SPARSE_TENSORS = 9, 10, 11, 12

# The external-data keys ORT reads; it refuses a model with any other key except its own "prepacked*" ones
# (onnx also defines "basepath", which ORT refuses).
_ORT_KEYS = frozenset({"location", "offset", "length", "checksum"})
# What ORT (strtoll, base 10) and onnx (int()) both read as the same number: no "0x", "1_000", "٣" or "5 ".
_DECIMAL = re.compile(r"[ \t\n\v\f\r]*[+-]?([0-9]+)")
_SHOWN_DIGITS = 40  # a number this long is still quoted in a message (int64 has 19 digits)


class MalformedTensor(ValueError):
    """A tensor field that cannot be read as ONNX defines it; `problem` completes "tensor 'W' ...".

    For an external offset or length beyond the int64 range, `field` names it and `number` is its value, so a
    reader can say what it would have meant (e.g. how far into the file it points).
    """

    def __init__(self, tensor: str | bytes, problem: str, field: str = "", number: int | None = None) -> None:
        self.tensor = tensor
        self.problem = problem
        self.field = field
        self.number = number
        super().__init__(f"tensor {tensor!r} {problem}")


# ---------------------------------------------------------------- sizes

def dtype_name(data_type: int) -> str | None:
    """ONNX's name for a data type ("FLOAT", "INT4"), or None for a number this onnx does not define."""
    from onnx import TensorProto

    try:
        return TensorProto.DataType.Name(data_type)
    except ValueError:
        return None


def element_bits(data_type: int) -> int | None:
    """Bits one element takes when packed; None for STRING, UNDEFINED and unknown types."""
    return _BITS.get(data_type)


def element_size(data_type: int) -> int | None:
    """Bytes per element rounded up to a whole byte (1 for packed sub-byte types): the alignment a tensor needs."""
    bits = element_bits(data_type)
    return None if bits is None else -(-bits // 8)


def element_count(shape: Iterable[int]) -> int:
    """Elements in a tensor of this shape (1 for a scalar)."""
    return math.prod(int(d) for d in shape)


def tensor_nbytes(data_type: int, shape: Iterable[int]) -> int | None:
    """Exact bytes of a tensor's data as ONNX stores it (raw or external); None when the type has no fixed size.

    Raises ValueError for a negative dimension.
    """
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimension in shape {dims}")
    bits = element_bits(data_type)
    if bits is None:
        return None
    return -(-math.prod(dims) * bits // 8)


def inline_nbytes(tensor: TensorProto) -> int:
    """Bytes a tensor holds in the proto itself: raw_data, else what its typed fields stand for, else its strings."""
    if tensor.raw_data:
        return len(tensor.raw_data)
    expected = _shape_nbytes(tensor)
    if expected is not None:
        return expected
    return sum(len(s) for s in tensor.string_data)


def stored_nbytes(tensor: TensorProto) -> int | None:
    """Bytes of a tensor's data wherever it is stored: its external length (missing: its own size), else inline.

    Raises MalformedTensor for unreadable external fields, a negative dimension, or an external length that
    disagrees with the type and shape. None only for an external tensor of a type without a fixed size
    (STRING, unknown) whose length is not written.
    """
    ref = external_ref(tensor)
    if ref is None:
        return inline_nbytes(tensor)
    expected = _shape_nbytes(tensor)
    if ref.length is None:
        return expected
    if expected is not None and ref.length != expected:
        raise MalformedTensor(tensor.name, f"has external length {ref.length} but its shape {list(tensor.dims)} of "
                                           f"{dtype_name(tensor.data_type)} needs {expected} bytes")
    return ref.length


def _shape_nbytes(tensor: TensorProto) -> int | None:
    try:
        return tensor_nbytes(tensor.data_type, tensor.dims)
    except ValueError:
        raise MalformedTensor(tensor.name, f"has a negative dimension in its shape {list(tensor.dims)}") from None


# ---------------------------------------------------------------- external data

@dataclass(frozen=True)
class ExternalRef:
    """An external-data reference as written in the model (location relative to the model's directory)."""

    location: str
    offset: int = 0
    length: int | None = None  # None: not written, which ONNX defines as the tensor's own size
    checksum: str | None = None
    unknown_keys: tuple[str, ...] = ()  # keys ORT does not read: it refuses to load such a model

    def length_or(self, own_size: int | None) -> int | None:
        """The bytes this reference covers, given the tensor's own size for a reference without a length."""
        return self.length if self.length is not None else own_size


def is_external(tensor: TensorProto) -> bool:
    """ORT reads `external_data` only when `data_location` says EXTERNAL; otherwise it is ignored."""
    return tensor.data_location == EXTERNAL


def external_ref(tensor: TensorProto) -> ExternalRef | None:
    """The tensor's external-data reference, None when its data is inline; MalformedTensor when unreadable."""
    if not is_external(tensor):
        return None
    ref, problems = _parse_external(tensor)
    if problems:
        raise MalformedTensor(tensor.name, *problems[0])
    return ref


def lenient_external_ref(tensor: TensorProto) -> tuple[ExternalRef | None, tuple[str, ...]]:
    """For readers that report: (reference with each unreadable field at its default, the problems found).

    Problems complete "tensor 'W' ..." like MalformedTensor.problem. The location is "" when missing.
    """
    if not is_external(tensor):
        return None, ()
    ref, problems = _parse_external(tensor)
    return ref, tuple(p.text for p in problems)


class _Problem(NamedTuple):
    text: str
    field: str = ""
    number: int | None = None  # an offset or length beyond the int64 range


def _parse_external(tensor: TensorProto) -> tuple[ExternalRef, list[_Problem]]:
    from onnx.external_data_helper import ExternalDataInfo

    problems: list[_Problem] = []
    fields: dict[str, str] = {}
    unknown: list[str] = []
    for entry in tensor.external_data:
        key, value = entry.key, entry.value
        if isinstance(key, bytes) or isinstance(value, bytes):  # protobuf's answer to a string that is not UTF-8
            problems.append(_Problem("has external data fields that are not valid UTF-8"))
        elif key not in _ORT_KEYS:
            if not key.startswith("prepacked"):
                unknown.append(key)
        elif value:  # ORT skips an empty value: it means "not written"; the last written one wins
            fields[key] = value
    for key in ("offset", "length"):
        if key in fields:
            number, problem = _read_number(key, fields.pop(key))
            if problem:
                problems.append(_Problem(problem, key, number if number > INT64_MAX else None))
            else:
                fields[key] = str(number)  # canonical digits: onnx's int() then reads what ORT's strtoll reads
    info = ExternalDataInfo(_external_view(fields))  # onnx's own reading of the fields, now known to be sound
    if not info.location:
        problems.append(_Problem("is external but has no location"))
    ref = ExternalRef(info.location, info.offset or 0, info.length, info.checksum, tuple(unknown))
    return ref, problems


def _read_number(key: str, value: str) -> tuple[int, str]:
    """(value, "") or (value or 0, the problem): an offset or length as ORT reads it, within int64 and not negative."""
    match = _DECIMAL.fullmatch(value)
    if not match:
        return 0, f"has a non-numeric external {key} {value[:40]!r}"
    digits = match.group(1).lstrip("0") or "0"
    if len(digits) > _SHOWN_DIGITS:  # beyond int64 whatever the digits; int() of thousands of them is refused
        return 0, f"has an external {key} of {len(digits)} digits, beyond the int64 range"
    number = -int(digits) if value.lstrip().startswith("-") else int(digits)
    if number < 0:
        return number, f"has a negative external {key} {number}"
    if number > INT64_MAX:
        return number, f"has an external {key} {number} beyond the int64 range"
    return number, ""


def _external_view(fields: dict[str, str]) -> TensorProto:
    """A tensor holding only the given external-data fields (no data): what ExternalDataInfo parses."""
    from onnx import TensorProto

    view = TensorProto(data_location=EXTERNAL)
    for key, value in fields.items():
        view.external_data.add(key=key, value=value)
    return view


def proto_text(value: str | bytes) -> str:
    """A protobuf string field as text: non-UTF-8 bytes come back as bytes, shown with U+FFFD."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value
