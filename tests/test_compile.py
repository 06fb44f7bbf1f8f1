"""Compiling the fixtures and generated models with the real QNN EP (HTP simulator) and the CPU EP.

Every compiled output is checked the way an app would use it: plain onnxruntime loads it (QNN registered as
a plugin, no ortcompile at run time) and its outputs are compared with the source model on the CPU EP.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import (
    FIXTURES,
    QNN_ATOL,
    QNN_RTOL,
    External,
    assert_no_junk,
    assert_paths_inside,
    attribute,
    check_output_dir,
    cpu_session,
    epcontext_nodes,
    external_tensors,
    inline_tensors,
    max_abs_diff_vs_cpu,
    published,
    qnn_session,
    run_cli,
    run_process,
    seeded_inputs,
    seeded_tensor,
    sha256,
    weights_model,
)

from ortcompile import CompileOptions, LayoutPolicy, compile_model

MIB = 1 << 20


@dataclass(frozen=True)
class Case:
    fixture: str
    cli_args: tuple[str, ...]
    options: dict[str, Any]
    epcontext: int
    remaining_ops: dict[str, int] = field(default_factory=dict)

    @property
    def stem(self) -> str:
        return Path(self.fixture).stem


CASES = {
    "mlp": Case("mlp.onnx", (), {}, 1),
    "split": Case("split.onnx", (), {}, 3, {"Mod": 1, "Sinh": 1}),
    "dynamic-fix-dim": Case("dynamic.onnx", ("--fix-dim", "batch=1"), {"fix_dims": {"batch": 1}}, 1),
    "dynamic-fix-shape": Case("dynamic.onnx", ("--fix-shape", "x=1,256"), {"fix_shapes": {"x": (1, 256)}}, 1),
}


def check_qnn_output(out: Path, case: Case) -> dict[str, Any]:
    """Files == manifest, paths inside, EPContext count, and QNN outputs match the CPU EP on the source."""
    manifest = check_output_dir(out, case.stem)
    assert_no_junk(out)
    model = assert_paths_inside(out / f"{case.stem}_ctx.onnx")
    assert len(epcontext_nodes(model)) == case.epcontext
    remaining = sorted(n.op_type for n in model.graph.node if n.op_type != "EPContext")
    assert remaining == sorted(op for op, n in case.remaining_ops.items() for _ in range(n))
    session = qnn_session(out / f"{case.stem}_ctx.onnx")
    assert session.get_providers()[0] == "QNNExecutionProvider"
    # dynamic.onnx was compiled with batch pinned: the compiled model's input is static.
    assert [i.shape for i in session.get_inputs()] == [[1, 256]]
    max_abs_diff_vs_cpu(session, FIXTURES / case.fixture, seeds=range(3))
    return manifest


@pytest.mark.parametrize("case_id", CASES)
def test_cli_compiles_fixture_with_qnn(case_id: str, tmp_path: Path) -> None:
    case = CASES[case_id]
    out = tmp_path / "out"
    proc = run_cli("compile", FIXTURES / case.fixture, "-o", out, "--ep", "qnn", "--json", *case.cli_args)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["outputs"][0]
    manifest = check_qnn_output(out, case)
    assert report["epcontext_nodes"] == case.epcontext
    assert report["remaining_ops"] == case.remaining_ops
    assert report["files"] == manifest["files"]
    assert report["ep"] == "QNNExecutionProvider"


@pytest.mark.parametrize("case_id", CASES)
def test_api_compiles_fixture_with_qnn(case_id: str, tmp_path: Path) -> None:
    case = CASES[case_id]
    out = tmp_path / "out"
    result = compile_model(FIXTURES / case.fixture, out, CompileOptions(ep="qnn", **case.options))
    manifest = check_qnn_output(out, case)
    assert result.model_path == out / f"{case.stem}_ctx.onnx"
    assert result.epcontext_nodes == case.epcontext
    assert result.remaining_ops == case.remaining_ops
    assert result.files == manifest["files"]


def test_fix_dim_value_reaches_the_compiled_model(tmp_path: Path) -> None:
    """--fix-dim batch=4: QNN compiles for batch 4, and the compiled model takes (only) that batch."""
    result = compile_model(FIXTURES / "dynamic.onnx", tmp_path, CompileOptions(ep="qnn", fix_dims={"batch": 4}))
    assert result.epcontext_nodes == 1
    session = qnn_session(tmp_path / "dynamic_ctx.onnx")
    assert [i.shape for i in session.get_inputs()] == [[4, 256]]
    max_abs_diff_vs_cpu(session, FIXTURES / "dynamic.onnx", seeds=range(2), dims={"batch": 4})
    manifest = check_output_dir(tmp_path, "dynamic")
    assert manifest["options"]["fix_dims"] == {"batch": 4}


def _compile_split_cli(out: Path, *models: Path, fresh_process: bool = False) -> dict[str, Any]:
    """With `fresh_process`, `python -m ortcompile`: tests comparing the bytes of two runs use one process per run,
    since each process hashes strings with its own seed (set order would show up as a difference only then)."""
    run = run_process if fresh_process else run_cli
    proc = run("compile", *models, FIXTURES / "split.onnx", "-o", out, "--ep", "qnn", "--embed", "never", "-q")
    assert proc.returncode == 0, proc.stderr
    return check_output_dir(out, "split")


@pytest.fixture(scope="module")
def split_alone(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """split.onnx compiled alone in a fresh process (QNN, --embed never): (its output directory, its manifest). The
    first of the two runs compared below, and the reference a batch's split must equal: read only."""
    out = tmp_path_factory.mktemp("split-alone") / "out"
    return out, _compile_split_cli(out, fresh_process=True)


def test_compiling_twice_gives_identical_bytes(split_alone: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """Deterministic output: same input and options in a fresh process -> the same bytes in every file."""
    (first_dir, first), second = split_alone, _compile_split_cli(tmp_path / "2", fresh_process=True)
    assert first == second
    for entry in first["files"]:
        assert (first_dir / entry["name"]).read_bytes() == (tmp_path / "2" / entry["name"]).read_bytes()


def test_cli_and_api_agree(tmp_path: Path) -> None:
    cli = _compile_split_cli(tmp_path / "cli")
    compile_model(FIXTURES / "split.onnx", tmp_path / "api", CompileOptions(ep="qnn", embed="never"))
    api = check_output_dir(tmp_path / "api", "split")
    # Both in this (pytest) process, where QNN has compiled before: each compile runs the EP in a fresh worker child
    # (functional-3: QNN's process-global counters reach the blob), so the manifests agree exactly, blob sha256 included.
    assert {k: v for k, v in cli.items() if k != "files"} == {k: v for k, v in api.items() if k != "files"}
    assert cli["files"] == api["files"]


def test_multi_model_cli_is_deterministic(split_alone: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """QNN keeps process-global counters that end up in the blob (functional-3): a model compiled after
    another one in the same command must still give the bytes it gives alone (the module's run of it alone)."""
    alone = split_alone[1]
    after_mlp = _compile_split_cli(tmp_path / "after", FIXTURES / "mlp.onnx", fresh_process=True)
    assert alone["files"] == after_mlp["files"]


def test_split_structure(tmp_path: Path) -> None:
    """split.onnx: QNN takes the three MatMul/Relu runs; Mod(fmod=1) and Sinh stay on the CPU, and Mod's
    1 KiB W_mod (== the default inline threshold) goes to the data file."""
    out = tmp_path / "out"
    compile_model(FIXTURES / "split.onnx", out, CompileOptions(ep="qnn", embed="never"))
    model = assert_paths_inside(out / "split_ctx.onnx")
    assert [n.op_type for n in model.graph.node] == ["EPContext", "Mod", "EPContext", "Sinh", "EPContext"]
    assert attribute(model.graph.node[1], "fmod") == 1
    # One context binary for the three partitions: only the first node (main_context=1) names it, by its content:
    # the QNN blob as the EP named it, with the first 12 hex digits of its sha256 before the extension.
    mains = [n for n in epcontext_nodes(model) if attribute(n, "main_context") == 1]
    blob = next(out.glob("split_ctx_qnn.*.bin"))
    assert blob.name == f"split_ctx_qnn.{sha256(blob)[:12]}.bin"
    assert len(mains) == 1 and attribute(mains[0], "ep_cache_context") == blob.name.encode()
    import hashlib

    import onnx
    from onnx import numpy_helper

    source = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(FIXTURES / "split.onnx")).graph.initializer}
    data = f"split_ctx.{hashlib.sha256(source['W_mod'].tobytes()).hexdigest()[:12]}.data"  # the data file is W_mod alone
    assert external_tensors(out / "split_ctx.onnx") == [External("W_mod", data, 0, 1024, 4)]
    assert inline_tensors(out / "split_ctx.onnx") == {}  # W1..W3 live in the QNN context binary
    assert (out / data).read_bytes() == source["W_mod"].tobytes()
    assert sorted(os.listdir(out)) == sorted([blob.name, data, "split_ctx.manifest.json", "split_ctx.onnx"])


@pytest.fixture(scope="module")
def split_never(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The EP compiles in a fresh worker child, as in the --embed always/auto runs it is compared with (see functional-3).
    out = tmp_path_factory.mktemp("never")
    _compile_split_cli(out)
    return out


def test_embed_never_leaves_context_binary(split_never: Path) -> None:
    manifest = check_output_dir(split_never, "split")
    blobs = [f for f in manifest["files"] if f["role"] == "ep_context"]
    assert [b["name"] for b in blobs] == [published(split_never, "split_ctx_qnn.bin")]
    assert blobs[0]["size"] > 100_000  # three compiled MatMuls of 256x256 fp32 weights
    model = assert_paths_inside(split_never / "split_ctx.onnx")
    assert all(attribute(n, "embed_mode") == 0 for n in epcontext_nodes(model))
    max_abs_diff_vs_cpu(qnn_session(split_never / "split_ctx.onnx"), FIXTURES / "split.onnx", seeds=range(3))


@pytest.mark.parametrize("embed", ["always", "auto"])
def test_embed_puts_context_in_model(embed: str, split_never: Path, tmp_path: Path) -> None:
    """`always`, and `auto` for a blob this small (< 16 MiB), embed the blob: no .bin file, embed_mode=1,
    and the embedded bytes are exactly what `--embed never` leaves in the .bin file."""
    out = tmp_path / "out"
    proc = run_cli("compile", FIXTURES / "split.onnx", "-o", out, "--ep", "qnn", "--embed", embed, "-q")
    assert proc.returncode == 0, proc.stderr
    manifest = check_output_dir(out, "split")
    assert [f["role"] for f in manifest["files"]] == ["model", "data"]
    assert not list(out.glob("*.bin"))
    model = assert_paths_inside(out / "split_ctx.onnx")
    mains = [n for n in epcontext_nodes(model) if attribute(n, "main_context") == 1]
    assert len(mains) == 1
    assert attribute(mains[0], "embed_mode") == 1
    assert attribute(mains[0], "ep_cache_context") == (split_never / published(split_never, "split_ctx_qnn.bin")).read_bytes()
    max_abs_diff_vs_cpu(qnn_session(out / "split_ctx.onnx"), FIXTURES / "split.onnx", seeds=range(3))


def test_mlp_auto_embeds_into_a_single_file(tmp_path: Path) -> None:
    """mlp: QNN takes every node and every weight, so auto gives one self-contained model file."""
    compile_model(FIXTURES / "mlp.onnx", tmp_path, CompileOptions(ep="qnn"))
    manifest = check_output_dir(tmp_path, "mlp")
    assert [f["name"] for f in manifest["files"]] == ["mlp_ctx.onnx"]


# ---------------------------------------------------------------- --ep cpu: pass-through

def assert_bit_identical_on_cpu(compiled: Path, source: Path, seeds: range = range(2)) -> None:
    """Same CPU kernels on the same weights: outputs must be equal bit for bit, not just close."""
    got, want = cpu_session(compiled), cpu_session(source)
    for seed in seeds:
        feeds = seeded_inputs(want, seed)
        for a, b in zip(got.run(None, feeds), want.run(None, feeds)):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes()


def test_cpu_passthrough_is_bit_identical(tmp_path: Path) -> None:
    proc = run_cli("compile", FIXTURES / "mlp.onnx", "-o", tmp_path, "--ep", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["outputs"][0]
    assert report["epcontext_nodes"] == 0
    assert report["remaining_ops"] == {"Add": 1, "MatMul": 2, "Relu": 1}
    check_output_dir(tmp_path, "mlp")
    model = assert_paths_inside(tmp_path / "mlp_ctx.onnx")
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Add", "Relu", "MatMul"]
    # b1 is exactly 1024 bytes: at the default threshold, so external like W1 and W2.
    assert sorted(e.name for e in external_tensors(tmp_path / "mlp_ctx.onnx")) == ["W1", "W2", "b1"]
    assert_bit_identical_on_cpu(tmp_path / "mlp_ctx.onnx", FIXTURES / "mlp.onnx")


def _arrays(seed: int, spec: dict[str, tuple[Any, tuple[int, ...]]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: seeded_tensor(rng, dtype, shape) for name, (dtype, shape) in spec.items()}


def assert_data_matches(out_model: Path, arrays: dict[str, np.ndarray]) -> list[External]:
    """Each external tensor's bytes in its data file are the source array's bytes; no two overlap."""
    externals = external_tensors(out_model)
    by_file: dict[str, list[External]] = {}
    for ext in externals:
        with open(out_model.parent / ext.location, "rb") as stream:
            stream.seek(ext.offset)
            assert stream.read(ext.length) == arrays[ext.name].tobytes(), ext.name
        by_file.setdefault(ext.location, []).append(ext)
    for location, items in by_file.items():
        items.sort(key=lambda e: e.offset)
        for a, b in zip(items, items[1:]):
            assert a.offset + a.length <= b.offset, (location, a, b)
        assert items[-1].offset + items[-1].length <= (out_model.parent / location).stat().st_size
    return externals


@pytest.mark.parametrize("threshold, inline", [(None, {"i8_1023", "f32_255"}), ("4096", {"i8_1023", "f32_255", "i8_1024", "f32_256"})])
def test_inline_threshold_boundary(threshold: str | None, inline: set[str], tmp_path: Path) -> None:
    """Initializers smaller than --inline-threshold stay in the proto, the rest go to the data file."""
    arrays = _arrays(1, {"f32_255": (np.float32, (255,)), "f32_256": (np.float32, (256,)), "i8_1023": (np.int8, (1023,)),
                         "i8_1024": (np.int8, (1024,)), "f32_big": (np.float32, (64, 65))})
    weights_model(tmp_path / "w.onnx", arrays)
    out = tmp_path / "out"
    proc = run_cli("compile", tmp_path / "w.onnx", "-o", out, "--ep", "cpu", "-q", *(["--inline-threshold", threshold] if threshold else []))
    assert proc.returncode == 0, proc.stderr
    check_output_dir(out, "w")
    model = out / "w_ctx.onnx"
    names_inline = set(inline_tensors(model)) & set(arrays)
    assert names_inline == inline
    externals = {e.name for e in assert_data_matches(model, source_arrays(tmp_path / "w.onnx"))}
    assert externals == {"Wq", *arrays} - inline  # Wq (16 KiB) is external too; the 1-element divisors inline
    assert_bit_identical_on_cpu(model, tmp_path / "w.onnx")


# ---------------------------------------------------------------- alignment and shards

# Odd sizes, in name order (ORT asks about initializers alphabetically), so that packing without padding
# would misalign almost every tensor: large ones (>= 1 MiB) must land on --align, the others on their
# element size.
LAYOUT_SPEC: dict[str, tuple[Any, tuple[int, ...]]] = {
    "a_i8_odd": (np.int8, (1037,)),
    "b_f32_big": (np.float32, (263, 1031)),  # 1,084,612 B
    "c_f64": (np.float64, (129,)),  # 1,032 B
    "d_i8_big": (np.int8, (1_050_001,)),
    "e_f16": (np.float16, (517,)),
    "f_f16_big": (np.float16, (1_048_583,)),  # 2,097,166 B
    "g_i32": (np.int32, (263,)),
    "h_f32_tiny": (np.float32, (10,)),  # inline
}


@pytest.fixture(scope="module")
def layout_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    arrays = _arrays(2, LAYOUT_SPEC)
    path = tmp_path_factory.mktemp("layout") / "w.onnx"
    weights_model(path, arrays, external_data=True)
    return path, arrays


def assert_aligned(externals: list[External], align: int, threshold: int) -> None:
    for ext in externals:
        wanted = align if ext.length >= threshold else ext.itemsize
        assert ext.offset % wanted == 0, (ext, wanted)
    # The test can fail: some large tensor follows one whose end is not on the boundary.
    ends = sorted((e.offset + e.length) for e in externals)
    assert any(end % align for end in ends)


@pytest.mark.parametrize("align, threshold", [(4096, MIB), (65536, MIB), (512, 1024)])
def test_external_offsets_are_aligned(align: int, threshold: int, layout_model: tuple[Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    source, arrays = layout_model
    out = tmp_path / "out"
    proc = run_cli("compile", source, "-o", out, "--ep", "cpu", "-q", "--align", str(align), "--align-threshold", str(threshold))
    assert proc.returncode == 0, proc.stderr
    manifest = check_output_dir(out, "w")
    assert [f["name"] for f in manifest["files"] if f["role"] == "data"] == [published(out, "w_ctx.onnx.data")]
    assert_paths_inside(out / "w_ctx.onnx")
    externals = assert_data_matches(out / "w_ctx.onnx", source_arrays(source))
    assert {e.name for e in externals} == {"Wq", *arrays} - {"h_f32_tiny"}
    assert_aligned(externals, align, threshold)
    assert_bit_identical_on_cpu(out / "w_ctx.onnx", source)


def source_arrays(source: Path) -> dict[str, np.ndarray]:
    """Every initializer of the source model, external data loaded."""
    import onnx
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(source)).graph.initializer}


def test_qnn_declined_initializers_are_aligned(layout_model: tuple[Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    """With --ep qnn, Wq goes into the context binary and the Mod(fmod=1) weights QNN declines are laid out
    by pass 1: same alignment rules, and the model still runs (QNN for y, CPU for the Mods). Without the
    prepare step: its constant folding would compute each Mod of two initializers into a constant."""
    source, arrays = layout_model
    out = tmp_path / "out"
    result = compile_model(source, out, CompileOptions(ep="qnn", layout=LayoutPolicy(align=65536), prepare=False))
    assert result.epcontext_nodes == 1
    assert result.remaining_ops == {"Mod": len(arrays)}
    check_output_dir(out, "w")
    assert_paths_inside(out / "w_ctx.onnx")
    externals = assert_data_matches(out / "w_ctx.onnx", source_arrays(source))
    assert {e.name for e in externals} == set(arrays) - {"h_f32_tiny"}
    assert_aligned(externals, 65536, MIB)
    session = qnn_session(out / "w_ctx.onnx")
    reference = cpu_session(source)
    feeds = seeded_inputs(reference, 0)
    got, want = session.run(None, feeds), reference.run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=QNN_RTOL, atol=QNN_ATOL)  # y = x @ Wq, on QNN
    for a, b in zip(got[1:], want[1:]):
        assert a.tobytes() == b.tobytes()  # the Mods run on the CPU EP: exact


@pytest.mark.parametrize("shard", [2 * MIB, 1_500_000])
def test_shards_split_data_without_straddling(shard: int, layout_model: tuple[Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    source, arrays = layout_model
    out = tmp_path / "out"
    proc = run_cli("compile", source, "-o", out, "--ep", "cpu", "-q", "--shard-size", str(shard))
    assert proc.returncode == 0, proc.stderr
    manifest = check_output_dir(out, "w")
    data_files = [f["name"] for f in manifest["files"] if f["role"] == "data"]
    assert len(data_files) >= 3
    assert data_files == [published(out, "w_ctx.onnx.data"), *(published(out, f"w_ctx.onnx.data.{i}") for i in range(1, len(data_files)))]
    assert_paths_inside(out / "w_ctx.onnx")
    externals = assert_data_matches(out / "w_ctx.onnx", source_arrays(source))  # also: none straddles its file's end
    assert {e.location for e in externals} == set(data_files)
    for name in data_files:
        members = [e for e in externals if e.location == name]
        size = (out / name).stat().st_size
        assert size == max(e.offset + e.length for e in members)  # no trailing padding
        if len(members) > 1:
            assert size <= shard, (name, size, members)
        else:
            assert members[0].length > shard or size <= shard  # only an oversized tensor may exceed the shard size
    # f_f16_big (2,097,166 B) is larger than either shard size: it gets a file of its own.
    big = next(e for e in externals if e.name == "f_f16_big")
    assert [e.name for e in externals if e.location == big.location] == ["f_f16_big"] and big.offset == 0
    assert_aligned(externals, 4096, MIB)
    assert_bit_identical_on_cpu(out / "w_ctx.onnx", source)
    assert not [n for n in os.listdir(out) if n.startswith(".ortcompile-stage-")]
