"""Where every initializer goes (inline, which data file, which offset), decided before its bytes move.

The policy is a pure function of the sequence of (name, size, element size) it is asked about, so the
same model compiled twice gets the same layout. ONNX Runtime asks about initializers in name order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortcompile.errors import UsageError

DEFAULT_INLINE_THRESHOLD = 1024
DEFAULT_ALIGN = 4096
DEFAULT_ALIGN_THRESHOLD = 1 << 20
MAX_ALIGN = 16 << 20  # beyond huge-page sizes, alignment only wastes disk


@dataclass(frozen=True)
class LayoutPolicy:
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD  # smaller tensors stay in the graph proto
    align: int = DEFAULT_ALIGN  # offset alignment for large tensors (page size: mmap- and buffer-friendly)
    align_threshold: int = DEFAULT_ALIGN_THRESHOLD  # tensors at least this big get `align`
    shard_size: int | None = None  # start a new data file rather than grow one past this

    def __post_init__(self) -> None:
        if self.inline_threshold < 0:
            raise UsageError("--inline-threshold must be 0 or more bytes")
        if self.align <= 0 or self.align & (self.align - 1):
            raise UsageError(f"--align must be a power of two, got {self.align}")
        if self.align > MAX_ALIGN:
            raise UsageError(f"--align {self.align} is larger than {MAX_ALIGN} (16 MiB): every large tensor would be padded to it")
        if self.align_threshold < 0:
            raise UsageError("--align-threshold must be 0 or more bytes")
        if self.shard_size is not None and self.shard_size <= 0:
            raise UsageError("--shard-size must be a positive size")

    def alignment_for(self, nbytes: int, element_size: int) -> int:
        if nbytes >= self.align_threshold:
            return self.align
        return max(1, element_size)  # natural alignment: a typed view never straddles an element


@dataclass(frozen=True)
class Placement:
    name: str
    file_index: int  # 0 -> <model>.data, n -> <model>.data.n
    offset: int
    nbytes: int


@dataclass
class DataLayout:
    """Hands out placements in order; remembers them for the manifest and for checks."""

    policy: LayoutPolicy
    placements: list[Placement] = field(default_factory=list)
    file_sizes: list[int] = field(default_factory=list)

    def is_inline(self, nbytes: int) -> bool:
        return nbytes < self.policy.inline_threshold

    def place(self, name: str, nbytes: int, element_size: int) -> Placement:
        alignment = self.policy.alignment_for(nbytes, element_size)
        if not self.file_sizes:
            self.file_sizes.append(0)
        offset = _round_up(self.file_sizes[-1], alignment)
        shard = self.policy.shard_size
        if shard is not None and self.file_sizes[-1] > 0 and offset + nbytes > shard:
            self.file_sizes.append(0)  # tensors never straddle shards; an oversized one gets its own
            offset = 0
        placement = Placement(name, len(self.file_sizes) - 1, offset, nbytes)
        self.file_sizes[-1] = offset + nbytes
        self.placements.append(placement)
        return placement


def _round_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment
