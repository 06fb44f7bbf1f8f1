"""plan.LayoutPolicy / DataLayout: pure functions deciding inline vs external, file and offset."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ortcompile.errors import UsageError
from ortcompile.layout import DataLayout, LayoutPolicy, Placement
from ortcompile.naming import carries_digest, content_addressed, data_file_name

MIB = 1 << 20


def place_all(policy: LayoutPolicy, tensors: list[tuple[str, int, int]]) -> list[Placement]:
    layout = DataLayout(policy)
    return [layout.place(name, nbytes, element) for name, nbytes, element in tensors]


def test_defaults_match_the_documented_policy() -> None:
    policy = LayoutPolicy()
    assert (policy.inline_threshold, policy.align, policy.align_threshold, policy.shard_size) == (1024, 4096, MIB, None)


def test_inline_threshold_is_exclusive() -> None:
    layout = DataLayout(LayoutPolicy(inline_threshold=1024))
    assert layout.is_inline(0) and layout.is_inline(1023)
    assert not layout.is_inline(1024)
    assert not DataLayout(LayoutPolicy(inline_threshold=0)).is_inline(0)  # 0: everything external


def test_alignment_for_large_and_small_tensors() -> None:
    policy = LayoutPolicy(align=4096, align_threshold=MIB)
    assert policy.alignment_for(MIB, 4) == 4096
    assert policy.alignment_for(MIB - 1, 4) == 4
    assert policy.alignment_for(MIB - 1, 8) == 8
    assert policy.alignment_for(1000, 1) == 1
    assert policy.alignment_for(1000, 0) == 1  # never a zero or negative alignment
    assert LayoutPolicy(align=65536, align_threshold=0).alignment_for(1, 1) == 65536


def test_offsets_are_padded_to_alignment() -> None:
    placements = place_all(LayoutPolicy(), [
        ("a", 1037, 1),  # odd size: everything after it needs padding
        ("b", MIB + 3, 4),  # large: 4096
        ("c", 1032, 8),  # small: element size 8
        ("d", 1034, 2),
        ("e", 2 * MIB, 2),
    ])
    assert [(p.name, p.file_index, p.offset) for p in placements] == [
        ("a", 0, 0),
        ("b", 0, 4096),
        ("c", 0, 4096 + MIB + 8),  # 4096 + MIB + 3 rounded up to 8
        ("d", 0, 4096 + MIB + 8 + 1032),
        ("e", 0, 2 * 4096 + MIB),  # 4096 + MIB + 8 + 1032 + 1034 rounded up to 4096
    ]
    assert [p.nbytes for p in placements] == [1037, MIB + 3, 1032, 1034, 2 * MIB]


def test_layout_records_placements_and_file_sizes() -> None:
    layout = DataLayout(LayoutPolicy(align_threshold=100, align=64))
    layout.place("a", 10, 1)
    layout.place("b", 100, 4)
    assert layout.placements == [Placement("a", 0, 0, 10), Placement("b", 0, 64, 100)]
    assert layout.file_sizes == [164]  # no trailing padding


def test_same_sequence_gives_same_layout() -> None:
    tensors = [(f"t{i}", n, 4) for i, n in enumerate([5000, MIB, 7, 3 * MIB + 1, 4096])]
    policy = LayoutPolicy(shard_size=2 * MIB)
    assert place_all(policy, tensors) == place_all(policy, tensors)


def test_shards_never_split_a_tensor() -> None:
    policy = LayoutPolicy(align=4096, align_threshold=4096, shard_size=10_000)
    placements = place_all(policy, [("a", 6000, 4), ("b", 6000, 4), ("c", 4000, 4), ("d", 4000, 4)])
    assert [(p.file_index, p.offset) for p in placements] == [
        (0, 0),
        (1, 0),  # 6000 + 6000 > 10_000: a new file
        (1, 6000),  # 6000 + 4000 == 10_000: exactly fits (small: 4-byte alignment)
        (2, 0),
    ]


def test_alignment_padding_counts_against_the_shard() -> None:
    policy = LayoutPolicy(align=4096, align_threshold=2000, shard_size=10_000)
    placements = place_all(policy, [("a", 5000, 1), ("b", 2000, 4)])
    # b would start at 8192 (aligned) and end at 10_192 > 10_000, though 5000 + 2000 would fit.
    assert [(p.file_index, p.offset) for p in placements] == [(0, 0), (1, 0)]


def test_oversized_tensor_gets_its_own_shard() -> None:
    policy = LayoutPolicy(shard_size=MIB)
    placements = place_all(policy, [("a", 1000, 4), ("big", 3 * MIB, 4), ("c", 1000, 4)])
    assert [(p.name, p.file_index, p.offset) for p in placements] == [("a", 0, 0), ("big", 1, 0), ("c", 2, 0)]
    # Oversized first: it stays in the first file, alone.
    placements = place_all(policy, [("big", 3 * MIB, 4), ("c", 1000, 4)])
    assert [(p.file_index, p.offset) for p in placements] == [(0, 0), (1, 0)]


@pytest.mark.parametrize("seed", range(5))
def test_random_layouts_keep_every_invariant(seed: int) -> None:
    """Seeded random sizes/element sizes/policies: aligned, no overlap, no straddling, shards respected."""
    rng = np.random.default_rng(seed)
    policy = LayoutPolicy(
        align=int(2 ** rng.integers(0, 17)),
        align_threshold=int(rng.integers(0, 2 * MIB)),
        shard_size=int(rng.integers(1, 4 * MIB)),
    )
    tensors = [(f"t{i:03}", int(rng.integers(1, 3 * MIB)), int(rng.choice([1, 2, 4, 8]))) for i in range(200)]
    layout = DataLayout(policy)
    placements = [layout.place(*t) for t in tensors]
    by_file: dict[int, list[Placement]] = {}
    for (_, nbytes, element), p in zip(tensors, placements):
        assert p.offset % policy.alignment_for(nbytes, element) == 0
        by_file.setdefault(p.file_index, []).append(p)
    assert sorted(by_file) == list(range(len(by_file)))  # files are used in order, none skipped
    assert len(layout.file_sizes) == len(by_file)
    for index, members in by_file.items():
        for a, b in zip(members, members[1:]):
            assert a.offset + a.nbytes <= b.offset  # in order, no overlap
        end = members[-1].offset + members[-1].nbytes
        assert layout.file_sizes[index] == end
        assert end <= policy.shard_size or len(members) == 1  # only a lone oversized tensor exceeds a shard  # type: ignore[operator]


def test_data_file_names() -> None:
    """As written (into the stage, split's parts, in-memory buffers)."""
    assert data_file_name("m_ctx.onnx", 0) == "m_ctx.onnx.data"
    assert data_file_name("m_ctx.onnx", 1) == "m_ctx.onnx.data.1"
    assert data_file_name("m_ctx.onnx", 12) == "m_ctx.onnx.data.12"


SHA = "3f2a9c1b4d5e" + "0" * 52


@pytest.mark.parametrize("written, published", [
    ("m_ctx.onnx.data", "m_ctx.3f2a9c1b4d5e.data"),
    ("m_ctx.onnx.data.1", "m_ctx.3f2a9c1b4d5e.data.1"),
    ("m_ctx.onnx.data.12", "m_ctx.3f2a9c1b4d5e.data.12"),
    ("prefill_shared.data", "prefill_shared.3f2a9c1b4d5e.data"),
    ("prefill_shared.data.2", "prefill_shared.3f2a9c1b4d5e.data.2"),
    ("m_ctx_qnn.bin", "m_ctx_qnn.3f2a9c1b4d5e.bin"),
    ("m_ctx_part01_qnn.bin", "m_ctx_part01_qnn.3f2a9c1b4d5e.bin"),
    ("m_ctx_part01_qnn.0123456789ab.bin", "m_ctx_part01_qnn.3f2a9c1b4d5e.bin"),  # a compiled part's blob, linked by stitch
    ("blob", "blob.3f2a9c1b4d5e"),
    ("x.0123456789ab_ctx.onnx.data", "x.0123456789ab_ctx.3f2a9c1b4d5e.data"),  # a digest-like stem is the user's: kept
])
def test_content_addressed_names(written: str, published: str) -> None:
    """Every file a published graph references carries the first 12 hex digits of its sha256; the same bytes keep
    the same name (idempotent), and only a name with its own digest counts as one ortcompile addressed."""
    assert content_addressed(written, SHA) == published
    assert content_addressed(published, SHA) == published
    assert carries_digest(published, SHA)
    assert not carries_digest(written, SHA) or written == published
    assert not carries_digest(published, "9" * 64)


@pytest.mark.parametrize("field, value, option", [
    ("inline_threshold", -1, "--inline-threshold"),
    ("align", 0, "--align"),
    ("align", -4096, "--align"),
    ("align", 3, "--align"),
    ("align", 3000, "--align"),
    ("align_threshold", -1, "--align-threshold"),
    ("shard_size", 0, "--shard-size"),
    ("shard_size", -1, "--shard-size"),
])
def test_bad_policy_values_raise_usage_error(field: str, value: int, option: str) -> None:
    with pytest.raises(UsageError) as raised:
        LayoutPolicy(**{field: value})
    assert raised.value.exit_code == 2
    assert raised.value.message.startswith(option)


@pytest.mark.parametrize("align", [1, 2, 4096, 65536, 16 << 20])
def test_powers_of_two_are_valid_alignments(align: int) -> None:
    assert LayoutPolicy(align=align).align == align


@pytest.mark.parametrize("align", [32 << 20, 1 << 30])
def test_alignments_past_16_mib_are_refused(align: int) -> None:
    # --align 1G --align-threshold 0 once padded a 32 KB model into a 1 GB data file.
    with pytest.raises(UsageError, match="larger than 16777216"):
        LayoutPolicy(align=align)


def test_policy_is_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        LayoutPolicy().align = 8  # type: ignore[misc]
