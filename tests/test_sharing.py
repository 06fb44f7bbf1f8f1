"""`ortcompile compile A B ... --share-weights`: identical weights stored once, one shared EP context.

CPU side (end to end): a generated prefill/decode pair (~48 MiB of weights each, all shared but one 6 MiB
tensor, different tensor names, one with external data and one without) and the mlp/dynamic fixtures (same
weights). Each compiled model loads with plain onnxruntime and matches its source bit for bit.

QNN side (structure only: the x86_64 HTP simulator cannot load a shared context, it segfaults): mlp + split
give ONE `mlp_ctx_qnn.<digest>.bin` both graphs reference; `verify` says "shared EP context: cannot be loaded on this
device" (exit 1, the crash stays in verify's child process); `inspect` marks the blob shared. A batch whose
second model fails publishes nothing.

The CLI runs in this process (helpers.run_cli; real ORT, real QNN EP, each compile's EP in its own worker child).
The tests of the simulator's crash on a shared context run `python -m ortcompile` in a fresh process: the crash must
stay in ortcompile's child, and if it ever did not, it would end that process, not the test run.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from helpers import (
    DIGEST,
    FIXTURES,
    STAGE_PREFIX,
    assert_one_line_error,
    attribute,
    cpu_only_model,
    cpu_session,
    epcontext_nodes,
    published,
    run_cli,
    run_process,
    seeded_inputs,
    sha256,
    snapshot,
    weights_model,
    without_progress,
)
from onnx import TensorProto, helper, numpy_helper

MLP, SPLIT, DYNAMIC = FIXTURES / "mlp.onnx", FIXTURES / "split.onnx", FIXTURES / "dynamic.onnx"
MiB = 1 << 20
SHARED_CONTEXT_ERROR = "ortcompile: error: shared EP context: cannot be loaded on this device"

# The generated pair: 8 weights of 6 MiB alternating [1024,1536] / [1536,1024], 8 biases (6 KiB / 4 KiB).
WIDTHS = (1024, 1536)
LAYERS = 8
DIFFERENT = 5  # decode's W5 has other values: the one tensor that cannot be shared


def _pair_arrays(differ: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    layers = []
    for i in range(LAYERS):
        rows, cols = WIDTHS[i % 2], WIDTHS[(i + 1) % 2]
        seed = 1000 + i if (differ and i == DIFFERENT) else i
        w = (np.random.default_rng(seed).standard_normal((rows, cols)) / math.sqrt(rows)).astype(np.float32)
        b = (np.random.default_rng(100 + i).standard_normal(cols) * 0.1).astype(np.float32)
        layers.append((w, b))
    return layers


def write_pair_model(path: Path, prefix: str, batch: int, activation: str, differ: bool, external: bool) -> dict[str, np.ndarray]:
    """x[batch,1024] -> 8 x (MatMul, Add, activation) -> y; initializers named `<prefix>.W<i>`/`<prefix>.b<i>`."""
    inits, nodes, arrays = [], [], {}
    current = "x"
    for i, (w, b) in enumerate(_pair_arrays(differ)):
        wn, bn = f"{prefix}.W{i}", f"{prefix}.b{i}"
        arrays[wn], arrays[bn] = w, b
        inits += [numpy_helper.from_array(w, wn), numpy_helper.from_array(b, bn)]
        nodes += [helper.make_node("MatMul", [current, wn], [f"m{i}"]), helper.make_node("Add", [f"m{i}", bn], [f"a{i}"]),
                  helper.make_node(activation, [f"a{i}"], [f"h{i}"])]
        current = f"h{i}"
    nodes.append(helper.make_node("Identity", [current], ["y"]))
    graph = helper.make_graph(nodes, prefix, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, WIDTHS[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, WIDTHS[LAYERS % 2]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ortcompile-tests")
    model.ir_version = 9
    onnx.checker.check_model(model)
    if external:
        onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data", size_threshold=1024)
    else:
        onnx.save(model, str(path))  # ~48 MiB protobuf: fine, and shows sharing does not care how the source stores it
    return arrays


def externals(model_path: Path) -> dict[str, tuple[str, int, int]]:
    """Initializer name -> (location, offset, length) for the compiled model's external tensors."""
    model = onnx.load(str(model_path), load_external_data=False)
    found = {}
    for tensor in model.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            fields = {e.key: e.value for e in tensor.external_data}
            found[tensor.name] = (fields["location"], int(fields.get("offset", "0")), int(fields["length"]))
    return found


def manifest_of(out: Path, stem: str) -> dict[str, Any]:
    return json.loads((out / f"{stem}_ctx.manifest.json").read_text())


def listed(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in manifest["files"]}


def check_shared_output_dir(out: Path, stems: list[str]) -> dict[str, dict[str, Any]]:
    """The directory holds exactly the manifests and the files they list (shared ones listed by several);
    each listed file has its recorded size and sha256. Returns name -> entry over all manifests."""
    entries: dict[str, dict[str, Any]] = {}
    for stem in stems:
        manifest = manifest_of(out, stem)
        names = [f["name"] for f in manifest["files"]]
        assert len(names) == len(set(names)), names
        assert [f["name"] for f in manifest["files"] if f["role"] == "model"] == [f"{stem}_ctx.onnx"]
        for entry in manifest["files"]:
            if entry["name"] in entries:  # listed by an earlier manifest too: identical entry
                assert entries[entry["name"]] == entry, entry["name"]
            entries[entry["name"]] = entry
    assert set(os.listdir(out)) == set(entries) | {f"{s}_ctx.manifest.json" for s in stems}
    for name, entry in entries.items():
        assert (out / name).stat().st_size == entry["size"], name
        assert sha256(out / name) == entry["sha256"], name
    return entries


def total_bytes(out: Path, stems: list[str]) -> int:
    """Bytes of every output file the models need (each file once), manifests excluded."""
    names = {f["name"] for stem in stems for f in manifest_of(out, stem)["files"]}
    return sum((out / n).stat().st_size for n in names)


def assert_bit_identical(compiled: Path, source: Path, seeds: range, dims: dict[str, int] | None = None) -> None:
    """Plain onnxruntime (no ortcompile) on both, same default session options, same inputs."""
    got_session, want_session = cpu_session(compiled), cpu_session(source)
    for seed in seeds:
        feeds = seeded_inputs(want_session, seed, dims)
        for got, want in zip(got_session.run(None, feeds), want_session.run(None, feeds)):
            assert got.shape == want.shape and got.dtype == want.dtype
            assert got.tobytes() == want.tobytes(), f"{compiled.name} differs from {source.name} (seed {seed})"


# ---------------------------------------------------------------- CPU: the generated prefill/decode pair

@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("pair")
    src = root / "src"
    src.mkdir()
    prefill = write_pair_model(src / "prefill.onnx", "prefill", 4, "Relu", differ=False, external=True)
    decode = write_pair_model(src / "decode.onnx", "decode", 1, "Tanh", differ=True, external=False)
    shared_out, unshared_out = root / "shared", root / "unshared"
    shared = run_cli("compile", src / "prefill.onnx", src / "decode.onnx", "-o", shared_out, "--ep", "cpu", "--share-weights", "--json", "-v")
    unshared = run_cli("compile", src / "prefill.onnx", src / "decode.onnx", "-o", unshared_out, "--ep", "cpu", "--json")
    yield {"src": src, "prefill": prefill, "decode": decode, "shared": shared, "unshared": unshared,
           "shared_out": shared_out, "unshared_out": unshared_out}
    shutil.rmtree(root, ignore_errors=True)


def test_pair_compiles_into_one_shared_data_file(pair: dict[str, Any]) -> None:
    proc, out = pair["shared"], pair["shared_out"]
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)["outputs"]
    assert [Path(r["model"]).name for r in results] == ["prefill_ctx.onnx", "decode_ctx.onnx"]
    entries = check_shared_output_dir(out, ["prefill", "decode"])
    assert sorted(entries) == ["decode_ctx.onnx", "prefill_ctx.onnx", published(out, "prefill_shared.data")]
    # Saved bytes are reported with -v: every decode tensor but W5.
    reused = sum(a.nbytes for n, a in pair["decode"].items() if n != f"decode.W{DIFFERENT}")
    assert f"shared weights: {reused} bytes stored once instead of again" in proc.stderr


def test_pair_manifests_list_the_shared_file_in_both(pair: dict[str, Any]) -> None:
    out = pair["shared_out"]
    prefill, decode = listed(manifest_of(out, "prefill")), listed(manifest_of(out, "decode"))
    shared = published(out, "prefill_shared.data")
    for files, stem in ((prefill, "prefill"), (decode, "decode")):
        assert set(files) == {f"{stem}_ctx.onnx", shared}
        assert files[shared]["role"] == "data"
        assert files[shared]["shared"] is True
        assert files[f"{stem}_ctx.onnx"]["shared"] is False
        assert manifest_of(out, stem)["options"]["share_weights"] is True
    assert prefill[shared]["sha256"] == decode[shared]["sha256"] == sha256(out / shared)


def test_pair_identical_tensors_point_at_the_same_bytes(pair: dict[str, Any]) -> None:
    """Content-addressed, not name-addressed: decode.Wi/bi reuse prefill.Wi/bi's extents, except W5."""
    out = pair["shared_out"]
    prefill, decode = externals(out / "prefill_ctx.onnx"), externals(out / "decode_ctx.onnx")
    assert len(prefill) == len(decode) == 2 * LAYERS
    prefill_end = max(offset + length for _, offset, length in prefill.values())
    shared = published(out, "prefill_shared.data")
    for name, extent in decode.items():
        twin = prefill["prefill." + name.split(".", 1)[1]]
        if name == f"decode.W{DIFFERENT}":
            location, offset, length = extent
            assert location == shared and offset >= prefill_end and offset % 4096 == 0
        else:
            assert extent == twin, name
    # The file is one copy of prefill's tensors plus decode's W5, with nothing but alignment padding.
    distinct = sum(a.nbytes for a in pair["prefill"].values()) + pair["decode"][f"decode.W{DIFFERENT}"].nbytes
    size = (out / shared).stat().st_size
    assert distinct <= size < distinct + 4096 * (2 * LAYERS + 1)
    data = (out / shared).read_bytes()
    for name, (_, offset, length) in decode.items():
        assert data[offset : offset + length] == pair["decode"][name].tobytes(), name


def test_pair_total_bytes_about_one_copy(pair: dict[str, Any], record_property: Any) -> None:
    assert pair["unshared"].returncode == 0, pair["unshared"].stderr
    shared = total_bytes(pair["shared_out"], ["prefill", "decode"])
    unshared = total_bytes(pair["unshared_out"], ["prefill", "decode"])
    ratio = shared / unshared
    record_property("sharing_ratio", round(ratio, 4))
    print(f"\nprefill+decode: shared {shared} bytes, unshared {unshared} bytes, ratio {ratio:.4f}")
    # Expected: 9 of 16 big tensors -> 0.5625; measured 0.5625 (56,668,775 vs 100,749,815 bytes).
    assert ratio < 0.6
    one_model = sum(a.nbytes for a in pair["prefill"].values())
    assert shared < one_model + pair["decode"][f"decode.W{DIFFERENT}"].nbytes + 128 * 1024


@pytest.mark.parametrize("stem", ["prefill", "decode"])
def test_pair_each_model_matches_its_source_bit_for_bit(pair: dict[str, Any], stem: str) -> None:
    assert_bit_identical(pair["shared_out"] / f"{stem}_ctx.onnx", pair["src"] / f"{stem}.onnx", range(3))


@pytest.mark.parametrize("stem", ["prefill", "decode"])
def test_pair_verify_passes(pair: dict[str, Any], stem: str) -> None:
    proc = run_cli("verify", pair["shared_out"] / f"{stem}_ctx.onnx", "--reference", pair["src"] / f"{stem}.onnx", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["failure"] == ""
    integrity = report["integrity"]
    assert integrity["ok"] is True and integrity["hashed"] is True
    # The shared data file is checked (size and sha256) like any other file the model needs.
    assert [(f["name"], f["role"], f["sha256_ok"], f["status"]) for f in integrity["files"]] == [
        (f"{stem}_ctx.onnx", "model", True, "ok"), (published(pair["shared_out"], "prefill_shared.data"), "data", True, "ok")]
    assert all(c["max_abs"] == 0 for run in report["runs"] for c in run["outputs"])


@pytest.mark.parametrize("stem", ["prefill", "decode"])
def test_pair_inspect_marks_the_shared_file(pair: dict[str, Any], stem: str) -> None:
    model = pair["shared_out"] / f"{stem}_ctx.onnx"
    proc = run_cli("inspect", model, "--json")
    assert proc.returncode == 0, proc.stderr
    files = json.loads(proc.stdout)["initializers"]["files"]
    shared = published(pair["shared_out"], "prefill_shared.data")
    assert [(f["name"], f["shared"], f["tensors"]) for f in files] == [(shared, True, 2 * LAYERS)]
    text = run_cli("inspect", model)
    assert text.returncode == 0, text.stderr
    assert shared in text.stdout and "(shared with other models)" in text.stdout
    checked = run_cli("inspect", model, "--check", "-q")
    assert checked.returncode == 0, checked.stderr


def test_unshared_compile_marks_nothing_shared(pair: dict[str, Any]) -> None:
    """The control: without --share-weights each model has its own data file, nothing is marked shared."""
    out = pair["unshared_out"]
    for stem in ("prefill", "decode"):
        files = listed(manifest_of(out, stem))
        assert set(files) == {f"{stem}_ctx.onnx", published(out, f"{stem}_ctx.onnx.data")}
        assert not any(f.get("shared") for f in files.values())


# ---------------------------------------------------------------- CPU: mlp + dynamic fixtures

@pytest.fixture(scope="module")
def mlp_dynamic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mlp-dynamic") / "out"
    proc = run_cli("compile", MLP, DYNAMIC, "-o", out, "--ep", "cpu", "--share-weights", "-q")
    assert proc.returncode == 0, proc.stderr
    return out


def test_fixture_pair_stores_the_weights_once(mlp_dynamic: Path, tmp_path: Path) -> None:
    entries = check_shared_output_dir(mlp_dynamic, ["mlp", "dynamic"])
    shared = published(mlp_dynamic, "mlp_shared.data")
    assert sorted(entries) == ["dynamic_ctx.onnx", "mlp_ctx.onnx", shared]
    assert entries[shared]["shared"] is True
    assert externals(mlp_dynamic / "mlp_ctx.onnx") == externals(mlp_dynamic / "dynamic_ctx.onnx")
    # One copy: the shared file is byte-identical to the data file of mlp compiled alone.
    alone = run_cli("compile", MLP, "-o", tmp_path, "--ep", "cpu", "-q")
    assert alone.returncode == 0, alone.stderr
    alone_data = published(tmp_path, "mlp_ctx.onnx.data")
    assert (mlp_dynamic / shared).read_bytes() == (tmp_path / alone_data).read_bytes()
    assert DIGEST.search(shared)[0] == DIGEST.search(alone_data)[0]  # type: ignore[index]  # same bytes, same digest
    separate = 2 * total_bytes(tmp_path, ["mlp"])
    ratio = total_bytes(mlp_dynamic, ["mlp", "dynamic"]) / separate
    print(f"\nmlp+dynamic: sharing ratio {ratio:.4f}")
    assert ratio < 0.51  # measured 0.5004: two ~430-byte graphs on top of one 513 KiB data file


@pytest.mark.parametrize("stem, dims", [("mlp", None), ("dynamic", {"batch": 3})])
def test_fixture_pair_matches_sources_bit_for_bit(mlp_dynamic: Path, stem: str, dims: dict[str, int] | None) -> None:
    assert_bit_identical(mlp_dynamic / f"{stem}_ctx.onnx", FIXTURES / f"{stem}.onnx", range(3), dims)


@pytest.mark.parametrize("stem", ["mlp", "dynamic"])
def test_fixture_pair_verify_passes(mlp_dynamic: Path, stem: str) -> None:
    proc = run_cli("verify", mlp_dynamic / f"{stem}_ctx.onnx", "--reference", FIXTURES / f"{stem}.onnx", "--runs", "2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().splitlines()[-1].split() == ["result", "ok"]


def test_content_addressing_respects_alignment(tmp_path: Path) -> None:
    """The same 4000 bytes as int8 in A (at an odd offset) and as float32 in B: B needs a 4-aligned copy."""
    floats = (np.random.default_rng(9).standard_normal(1000)).astype(np.float32)
    weights_model(tmp_path / "a.onnx", {"a0": np.arange(1999, dtype=np.int8), "a1": floats.view(np.int8).copy()})
    weights_model(tmp_path / "b.onnx", {"b1": floats.copy()})
    out = tmp_path / "out"
    proc = run_cli("compile", tmp_path / "a.onnx", tmp_path / "b.onnx", "-o", out, "--ep", "cpu", "--share-weights", "-q")
    assert proc.returncode == 0, proc.stderr
    a, b = externals(out / "a_ctx.onnx"), externals(out / "b_ctx.onnx")
    assert a["a1"][1] % 4 != 0, "the test needs a1 at an offset a float32 cannot use"
    assert b["b1"][1] % 4 == 0 and b["b1"][1] != a["a1"][1]
    assert b["Wq"] == a["Wq"]  # the identical 64x64 matrix is still shared
    got = cpu_session(out / "b_ctx.onnx").run(["out_b1"], {"x": np.zeros((1, 64), np.float32)})[0]
    assert got.tobytes() == floats.tobytes()
    assert_bit_identical(out / "a_ctx.onnx", tmp_path / "a.onnx", range(1))


# ---------------------------------------------------------------- batch-level CLI rules

@pytest.mark.parametrize("models, needle", [
    ([MLP], "--share-weights needs at least two models"),
    ([MLP, MLP], "two models would both be named mlp_ctx.onnx"),
])
def test_share_weights_usage_errors(tmp_path: Path, models: list[Path], needle: str) -> None:
    out = tmp_path / "out"
    proc = run_cli("compile", *models, "-o", out, "--ep", "cpu", "--share-weights")
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, needle)
    assert not out.exists()  # a failed run removes the -o directory it created


def test_share_weights_takes_models_as_typed(tmp_path: Path) -> None:
    """`./a.onnx` and `dir//b.onnx` are the names the settings are kept under: the batch looked them up as Path made
    them (`a.onnx`), so a shared batch given so stopped with an internal error (KeyError, exit 70)."""
    models = [f"{FIXTURES}/./mlp.onnx", f"{FIXTURES}//dynamic.onnx"]
    out = tmp_path / "out"
    proc = run_cli("compile", *models, "-o", out, "--ep", "cpu", "--share-weights", "-q")
    assert proc.returncode == 0, proc.stderr
    check_shared_output_dir(out, ["mlp", "dynamic"])


def test_share_weights_refuses_if_changed(tmp_path: Path) -> None:
    proc = run_cli("compile", MLP, DYNAMIC, "-o", tmp_path / "out", "--ep", "cpu", "--share-weights", "--if-changed")
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, "--if-changed does not work with --share-weights")


def test_share_weights_verify_checks_every_model_before_publishing(tmp_path: Path) -> None:
    """--verify applies to the whole batch (buffers-2): each staged model is compared with its source."""
    out = tmp_path / "out"
    proc = run_cli("compile", MLP, DYNAMIC, "-o", out, "--ep", "cpu", "--share-weights", "--verify", "-v")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("verified: outputs match the source on the CPU EP (max abs diff 0; tolerance), in the pre-publish check") == 2, proc.stderr
    check_shared_output_dir(out, ["mlp", "dynamic"])


def test_share_weights_verify_of_an_unloadable_shared_context_publishes_nothing(tmp_path: Path) -> None:
    """On the QNN simulator the shared context cannot be loaded, so --verify must fail the batch: exit 1, one
    line, no output directory (never exit 0 with unverified files)."""
    out = tmp_path / "out"
    proc = run_process("compile", MLP, SPLIT, "-o", out, "--ep", "qnn", "--share-weights", "--verify")  # a crash: see the top
    assert proc.returncode == 1, proc.stderr
    fragmented, *error = without_progress(proc.stderr)  # split.onnx leaves Mod and Sinh between QNN partitions;
    assert fragmented.startswith("ortcompile: warning: split.onnx: the qnn graph is fragmented"), proc.stderr
    # the pre-publish check ran on each model compiled without sharing (compile/twins.py); --verify needs the real ones
    line = assert_one_line_error("\n".join(error), "shared EP context: cannot be loaded on this device")
    assert line.startswith(SHARED_CONTEXT_ERROR), line
    assert not out.exists()


# ---------------------------------------------------------------- QNN: one shared EP context

@pytest.fixture(scope="module")
def qnn_shared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("qnn-shared")
    out, separate = root / "out", root / "separate"
    proc = run_cli("compile", MLP, SPLIT, "-o", out, "--ep", "qnn", "--share-weights", "--json")
    alone = run_cli("compile", MLP, SPLIT, "-o", separate, "--ep", "qnn", "--embed", "never", "-q")
    assert alone.returncode == 0, alone.stderr
    return {"proc": proc, "out": out, "separate": separate}


def test_qnn_writes_one_context_named_after_the_first_model(qnn_shared: dict[str, Any]) -> None:
    proc, out = qnn_shared["proc"], qnn_shared["out"]
    assert proc.returncode == 0, proc.stderr
    assert [r["epcontext_nodes"] for r in json.loads(proc.stdout)["outputs"]] == [1, 3]
    entries = check_shared_output_dir(out, ["mlp", "split"])
    blob = published(out, "mlp_ctx_qnn.bin")
    assert sorted(entries) == ["mlp_ctx.onnx", blob, published(out, "mlp_shared.data"), "split_ctx.onnx"]
    assert [p.name for p in out.glob("*_qnn*.bin")] == [blob]
    # Both graphs' main EPContext nodes reference that one file; split's other partitions refer to its main node.
    for stem, count in (("mlp", 1), ("split", 3)):
        nodes = epcontext_nodes(onnx.load(str(out / f"{stem}_ctx.onnx"), load_external_data=False))
        assert len(nodes) == count
        main = [n for n in nodes if attribute(n, "main_context") == 1]
        assert len(main) == 1, stem
        assert attribute(main[0], "embed_mode") == 0
        assert attribute(main[0], "ep_cache_context") == blob.encode()
        assert attribute(main[0], "source") == b"QNNExecutionProvider"
        assert all(attribute(n, "ep_cache_context") is None for n in nodes if n is not main[0])


def test_qnn_shared_context_size(qnn_shared: dict[str, Any]) -> None:
    """One context holding both models' graphs: more than either alone, not more than both.
    Measured: 1,445,888 bytes shared vs 573,440 (mlp) + 909,312 (split) separately."""
    shared = (qnn_shared["out"] / published(qnn_shared["out"], "mlp_ctx_qnn.bin")).stat().st_size
    separate = qnn_shared["separate"]
    mlp, split = ((separate / published(separate, f"{s}_ctx_qnn.bin")).stat().st_size for s in ("mlp", "split"))
    print(f"\nQNN shared context {shared} bytes; separately mlp {mlp} + split {split} = {mlp + split}")
    assert max(mlp, split) < shared <= mlp + split


def test_qnn_manifests_mark_the_context_shared(qnn_shared: dict[str, Any]) -> None:
    out = qnn_shared["out"]
    mlp, split = listed(manifest_of(out, "mlp")), listed(manifest_of(out, "split"))
    blob_name, data_name = published(out, "mlp_ctx_qnn.bin"), published(out, "mlp_shared.data")
    assert set(mlp) == {"mlp_ctx.onnx", blob_name}
    assert set(split) == {"split_ctx.onnx", blob_name, data_name}
    for files in (mlp, split):
        blob = files[blob_name]
        assert (blob["role"], blob["shared"]) == ("ep_context", True)
        assert blob["sha256"] == sha256(out / blob_name) and blob["size"] == (out / blob_name).stat().st_size
    # split's CPU-side W_mod lives in the batch's data file, which only split uses: not shared.
    assert (split[data_name]["role"], split[data_name]["shared"]) == ("data", False)
    assert externals(out / "split_ctx.onnx") == {"W_mod": (data_name, 0, 1024)}


def test_simulator_cannot_load_a_shared_context(qnn_shared: dict[str, Any]) -> None:
    """Why verify probes in a child: plain onnxruntime loading the shared output kills its process.
    Measured with onnxruntime-qnn 2.7.0 on x86_64: SIGSEGV, with or without ep.share_ep_contexts=1."""
    script = textwrap.dedent("""
        import sys, onnxruntime as ort, onnxruntime_qnn
        ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
        options = ort.SessionOptions(); options.log_severity_level = 3
        devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
        options.add_provider_for_devices(devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path()})
        ort.InferenceSession(sys.argv[1], options)
        print("loaded")
    """)
    child = subprocess.run([sys.executable, "-c", script, str(qnn_shared["out"] / "mlp_ctx.onnx")], capture_output=True, text=True, timeout=120)
    assert "loaded" not in child.stdout
    assert child.returncode != 0


@pytest.mark.parametrize("stem", ["mlp", "split"])
def test_qnn_verify_reports_cannot_load_cleanly(qnn_shared: dict[str, Any], stem: str) -> None:
    proc = run_process("verify", qnn_shared["out"] / f"{stem}_ctx.onnx", "--reference", FIXTURES / f"{stem}.onnx")
    assert proc.returncode == 1, (proc.returncode, proc.stderr)  # not -11: the crash stayed in the probe's child
    line = assert_one_line_error(proc.stderr, "shared EP context: cannot be loaded on this device")
    assert line.startswith(SHARED_CONTEXT_ERROR), line
    assert "QNNExecutionProvider" in line
    assert proc.stdout == ""


def test_qnn_verify_api_survives_the_crash(qnn_shared: dict[str, Any]) -> None:
    """verify_model raises CompilationFailed; the calling process lives on to report it."""
    script = textwrap.dedent("""
        import json, sys
        from ortcompile.errors import CompilationFailed
        from ortcompile.readback.verify import verify_model
        try:
            verify_model(sys.argv[1], sys.argv[2])
        except CompilationFailed as exc:
            print(json.dumps({"exit_code": exc.exit_code, "message": exc.message}))
    """)
    child = subprocess.run([sys.executable, "-c", script, str(qnn_shared["out"] / "split_ctx.onnx"), str(SPLIT)],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    caught = json.loads(child.stdout.strip().splitlines()[-1])
    assert caught["exit_code"] == 1
    assert caught["message"].startswith("shared EP context: cannot be loaded on this device (QNNExecutionProvider: ")


@pytest.mark.parametrize("stem", ["mlp", "split"])
def test_qnn_inspect_shows_the_blob_shared(qnn_shared: dict[str, Any], stem: str) -> None:
    model = qnn_shared["out"] / f"{stem}_ctx.onnx"
    proc = run_cli("inspect", model, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    blobs = [n["blob"] for n in report["epcontext_nodes"] if n["blob"]]
    blob = published(qnn_shared["out"], "mlp_ctx_qnn.bin")
    size = (qnn_shared["out"] / blob).stat().st_size
    assert blobs == [{"location": blob, "size": size, "missing": False, "unsafe_path": False, "shared": True}]
    assert report["problems"] == []
    text = run_cli("inspect", model)
    assert f"file {blob}" in text.stdout and "shared EP context: other models use it too" in text.stdout
    assert run_cli("inspect", model, "--check", "-q").returncode == 0


def test_failing_batch_publishes_nothing(qnn_shared: dict[str, Any], tmp_path: Path) -> None:
    """sinh.onnx has nothing QNN takes: the batch fails after mlp compiled, and the earlier batch in the
    directory stays exactly as it was, even with --force."""
    out = tmp_path / "out"
    shutil.copytree(qnn_shared["out"], out)
    (out / "unrelated.txt").write_text("keep me\n")
    before = snapshot(out)
    proc = run_cli("compile", MLP, cpu_only_model(tmp_path / "sinh.onnx"), "-o", out, "--ep", "qnn", "--share-weights", "--force")
    assert proc.returncode == 1
    assert_one_line_error(proc.stderr, "qnn: the EP took none of this model's nodes")
    assert snapshot(out) == before
    assert not [n for n in os.listdir(out) if n.startswith(STAGE_PREFIX)]


def test_failing_batch_into_a_new_directory_leaves_no_files(tmp_path: Path) -> None:
    out = tmp_path / "new"
    proc = run_cli("compile", MLP, cpu_only_model(tmp_path / "sinh.onnx"), "-o", out, "--ep", "qnn", "--share-weights")
    assert proc.returncode == 1
    assert_one_line_error(proc.stderr, "took none of this model's nodes")
    assert not out.exists()  # a failed run removes the -o directory it created


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Any:
    """A 1 MiB tmpfs mounted for the test (root here; skipped where mounting is not allowed)."""
    mountpoint = tmp_path / "tmpfs"
    mountpoint.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mountpoint)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)


@pytest.mark.parametrize("full_at", ["data", "graph"])
def test_batch_on_a_full_disk_exits_4(small_tmpfs: Path, tmp_path: Path, full_at: str) -> None:
    """The disk fills while the batch writes its shared data file, or its first graph: exit 4 with the no-space
    line (it was an internal OSError, exit 1), nothing left on the filesystem, and the batch fits once space is back."""
    rng = np.random.default_rng(3)
    models = [tmp_path / "prefill.onnx", tmp_path / "decode.onnx"]
    for model in models:  # 300 KiB each, different: the shared file holds both
        weights_model(model, {"w": rng.standard_normal((256, 300)).astype(np.float32)})
    roomy = tmp_path / "roomy"
    assert run_cli("compile", *models, "-o", roomy, "--ep", "cpu", "--share-weights", "-q").returncode == 0
    data_pages = -(-(roomy / published(roomy, "prefill_shared.data")).stat().st_size // 4096)
    free = {"data": data_pages // 2, "graph": data_pages}[full_at] * 4096
    filler = small_tmpfs / ".filler"
    filler.write_bytes(b"\xa5" * (shutil.disk_usage(small_tmpfs).free - free))
    assert shutil.disk_usage(small_tmpfs).free == free
    before = snapshot(small_tmpfs)
    out = small_tmpfs / "out"
    proc = run_cli("compile", *models, "-o", out, "--ep", "cpu", "--share-weights")
    assert proc.returncode == 4, proc.stderr
    assert_one_line_error(proc.stderr, "no space left on the device", "choose another -o")
    assert snapshot(small_tmpfs) == before  # no stage, and the -o directory it created is gone again
    filler.unlink()
    assert run_cli("compile", *models, "-o", out, "--ep", "cpu", "--share-weights", "-q").returncode == 0
    check_shared_output_dir(out, ["prefill", "decode"])


def test_dynamic_member_is_refused_before_anything_runs(tmp_path: Path) -> None:
    out = tmp_path / "new"
    proc = run_cli("compile", MLP, DYNAMIC, "-o", out, "--ep", "qnn", "--share-weights")
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, "static shapes only", "--fix-dim batch=N")
    assert not out.exists()


def test_qnn_shared_batch_is_deterministic(qnn_shared: dict[str, Any], tmp_path: Path) -> None:
    """A second CLI run of the same batch, in a fresh process (its own string-hash seed), gives byte-identical files,
    shared context included."""
    again = run_process("compile", MLP, SPLIT, "-o", tmp_path / "again", "--ep", "qnn", "--share-weights", "-q")
    assert again.returncode == 0, again.stderr
    assert snapshot(tmp_path / "again") == snapshot(qnn_shared["out"])


# ---------------------------------------------------------------- Python API and docs/weight-sharing.md

def test_compile_shared_accepts_str_paths(tmp_path: Path) -> None:
    """buffers-3: like compile_model, str paths work for the sources and the output directory."""
    from ortcompile import CompileOptions
    from ortcompile.compile.sharing import compile_shared

    results = compile_shared([str(MLP), str(DYNAMIC)], str(tmp_path / "out"), CompileOptions(ep="cpu"))
    assert [r.model for r in results] == ["mlp_ctx.onnx", "dynamic_ctx.onnx"]
    check_shared_output_dir(tmp_path / "out", ["mlp", "dynamic"])


def test_weight_sharing_doc_example(tmp_path: Path) -> None:
    """The Python example in docs/weight-sharing.md runs and prints what the page shows."""
    import re

    blocks = re.findall(r"```(\w*)\n(.*?)```", (FIXTURES.parent / "docs" / "weight-sharing.md").read_text(), flags=re.S)
    pairs = [(code, blocks[i + 1][1]) for i, (lang, code) in enumerate(blocks[:-1]) if lang == "python" and blocks[i + 1][0] == "output"]
    assert len(pairs) == 1
    shutil.copytree(FIXTURES, tmp_path / "fixtures")
    code, expected = pairs[0]
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == expected


def test_shared_data_file_in_shards(tmp_path: Path) -> None:
    """--shard-size splits the batch data file; both models point into the same shards, both manifests list them."""
    out = tmp_path / "out"
    proc = run_cli("compile", MLP, DYNAMIC, "-o", out, "--ep", "cpu", "--share-weights", "--shard-size", "300K", "--align-threshold", "64K", "-q")
    assert proc.returncode == 0, proc.stderr
    entries = check_shared_output_dir(out, ["mlp", "dynamic"])
    shards = [published(out, "mlp_shared.data"), published(out, "mlp_shared.data.1")]
    assert sorted(n for n in entries if "_shared." in n) == sorted(shards)
    assert all(entries[n]["shared"] and (out / n).stat().st_size <= 300 * 1024 for n in shards)
    assert externals(out / "mlp_ctx.onnx") == externals(out / "dynamic_ctx.onnx")
    assert {loc for loc, _, _ in externals(out / "mlp_ctx.onnx").values()} == set(shards)
    assert_bit_identical(out / "dynamic_ctx.onnx", DYNAMIC, range(2), {"batch": 2})


def test_qnn_twin_models_share_weights_inside_the_context(qnn_shared: dict[str, Any], tmp_path: Path) -> None:
    """Two copies of split.onnx (different stems): the CPU-side W_mod is stored once and marked shared in both
    manifests, and QNN's one shared context is far smaller than two separate ones.
    Measured: 950,272 bytes shared vs 2 x 909,312 separately (0.52)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("split.onnx", "split_b.onnx"):
        shutil.copyfile(SPLIT, src / name)
    out = tmp_path / "out"
    proc = run_cli("compile", src / "split.onnx", src / "split_b.onnx", "-o", out, "--ep", "qnn", "--share-weights", "-q")
    assert proc.returncode == 0, proc.stderr
    entries = check_shared_output_dir(out, ["split", "split_b"])
    blob, data = published(out, "split_ctx_qnn.bin"), published(out, "split_shared.data")
    assert sorted(entries) == ["split_b_ctx.onnx", "split_ctx.onnx", blob, data]
    assert entries[data]["shared"] and entries[blob]["shared"]
    assert externals(out / "split_ctx.onnx") == externals(out / "split_b_ctx.onnx") == {"W_mod": (data, 0, 1024)}
    # split compiled on its own, --embed never
    separate = (qnn_shared["separate"] / published(qnn_shared["separate"], "split_ctx_qnn.bin")).stat().st_size
    shared = entries[blob]["size"]
    print(f"\nsplit twice: shared context {shared} bytes vs 2 x {separate} separately ({shared / (2 * separate):.3f})")
    assert separate < shared < 0.6 * 2 * separate
