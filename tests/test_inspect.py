"""`ortcompile inspect`: what a model contains, from its graph proto alone.

Every test runs the real CLI (in this process: helpers.run_cli) on outputs the real compiler produced (QNN's
HTP simulator, or the CPU EP where a test needs external initializers), then asserts on exit codes, stderr lines
and the JSON report. The > 2 GB test builds a real compiled output whose data file is a 2 GiB + 256 KiB sparse file, so it runs in
seconds and needs no RAM, and proves inspect never reads that file unless --check is given; it measures the
peak RSS of a fresh `python -m ortcompile inspect` process.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import CliResult, published, run_cli

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
CLI = [sys.executable, "-m", "ortcompile"]
PROTOBUF_LIMIT = 2**31 - 1

# The documented JSON schema (docs/inspect.md). Exact sets: a renamed, added or dropped key fails here.
TOP_KEYS = {"format", "model", "graph_bytes", "protobuf_headroom_bytes", "opsets", "unused_opsets", "inputs", "outputs", "epcontext_nodes",
            "nodes", "initializers", "alignment", "manifest", "target", "parts", "compatibility", "problems"}
IO_KEYS = {"name", "dtype", "shape", "dynamic"}
EPCONTEXT_KEYS = {"name", "source", "partition_name", "main_context", "embed_mode", "ep_sdk_version", "blob", "embedded_bytes"}
BLOB_KEYS = {"location", "size", "missing", "unsafe_path", "shared"}
NODES_KEYS = {"epcontext", "epcontext_by_source", "compiled_ops", "remaining_ops"}
INITIALIZERS_KEYS = {"inline", "inline_bytes", "external", "files"}
DATA_FILE_KEYS = {"name", "tensors", "referenced_bytes", "size", "missing", "unsafe_path", "short", "shared"}
ALIGNMENT_KEYS = {"align", "threshold", "large_tensors", "aligned", "unaligned"}
UNALIGNED_KEYS = {"name", "file", "offset", "length"}
MANIFEST_KEYS = {"path", "found", "hashed", "ok", "problems", "files"}
MANIFEST_FILE_KEYS = {"name", "role", "size", "actual_size", "sha256_ok", "status"}


# ---------------------------------------------------------------- helpers


def inspect_json(model: Path, *extra: object, code: int = 0) -> dict:
    proc = run_cli("inspect", model, "--json", *extra)
    assert proc.returncode == code, proc.stderr
    return json.loads(proc.stdout)


def compile_to(source: Path, out: Path, *extra: object) -> Path:
    proc = run_cli("compile", source, "-o", out, "-q", *extra)
    assert proc.returncode == 0, proc.stderr
    return out / f"{source.stem}_ctx.onnx"


def refresh_manifest(model: Path) -> dict:
    """Record the current size and sha256 of every file the manifest lists, as if the compiler wrote them."""
    path = model.with_name(model.name[: -len(".onnx")] + ".manifest.json")
    manifest = json.loads(path.read_text())
    for entry in manifest["files"]:
        target = model.parent / entry["name"]
        entry["size"] = target.stat().st_size
        entry["sha256"] = sha256_of(target)
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def sha256_of(path: Path) -> str:
    """sha256 of a file, feeding zeros for its holes instead of reading them (the > 2 GiB sparse output)."""
    digest, zeros, chunk = hashlib.sha256(), bytes(16 << 20), 16 << 20
    fd = os.open(path, os.O_RDONLY)
    try:
        size, pos = os.fstat(fd).st_size, 0
        while pos < size:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: nothing but a hole up to the end
                data = size
            while pos < data:
                step = min(chunk, data - pos)
                digest.update(memoryview(zeros)[:step])
                pos += step
            end = os.lseek(fd, data, os.SEEK_HOLE) if data < size else size
            while pos < end:
                block = os.pread(fd, min(chunk, end - pos), pos)
                digest.update(block)
                pos += len(block)
    finally:
        os.close(fd)
    return digest.hexdigest()


def external_fields(tensor: onnx.TensorProto) -> dict[str, onnx.StringStringEntryProto]:
    return {entry.key: entry for entry in tensor.external_data}


def one_line_error(proc: CliResult) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One pristine compiled output per fixture, shared by the module; tests that damage one copy it first."""
    base = tmp_path_factory.mktemp("inspect-built")
    return {
        # QNN takes the whole MLP; the blob is small, so --embed auto embeds it.
        "mlp": compile_to(FIXTURES / "mlp.onnx", base / "mlp"),
        # QNN declines Mod and Sinh: 3 EPContext nodes sharing one _qnn.<digest>.bin, and W_mod (1 KiB) as external data.
        "split": compile_to(FIXTURES / "split.onnx", base / "split", "--embed", "never"),
        "dynamic": compile_to(FIXTURES / "dynamic.onnx", base / "dynamic", "--fix-dim", "batch=1"),
        # No EP compilation: every weight goes to external data, the two 256 KiB ones at 4 KiB-aligned offsets.
        "cpu": compile_to(FIXTURES / "mlp.onnx", base / "cpu", "--ep", "cpu", "--inline-threshold", "1K", "--align-threshold", "4K"),
    }


def copy_output(model: Path, tmp_path: Path) -> Path:
    target = tmp_path / model.parent.name
    shutil.copytree(model.parent, target)
    return target / model.name


# ---------------------------------------------------------------- the schema


def test_json_schema_keys_are_exactly_the_documented_ones(built: dict[str, Path], tmp_path: Path) -> None:
    report = inspect_json(built["split"])
    assert set(report) == TOP_KEYS
    assert report["format"] == "ortcompile-inspect/1"
    for io in report["inputs"] + report["outputs"]:
        assert set(io) == IO_KEYS
    assert {frozenset(node) for node in report["epcontext_nodes"]} == {frozenset(EPCONTEXT_KEYS)}
    blobs = [node["blob"] for node in report["epcontext_nodes"] if node["blob"] is not None]
    assert blobs and all(set(blob) == BLOB_KEYS for blob in blobs)
    assert set(report["nodes"]) == NODES_KEYS
    assert set(report["initializers"]) == INITIALIZERS_KEYS
    assert report["initializers"]["files"] and all(set(f) == DATA_FILE_KEYS for f in report["initializers"]["files"])
    assert set(report["alignment"]) == ALIGNMENT_KEYS
    assert set(report["manifest"]) == MANIFEST_KEYS
    assert all(set(f) == MANIFEST_FILE_KEYS for f in report["manifest"]["files"])

    # The one nested object the split output has no instance of: an unaligned large tensor.
    moved = copy_output(built["cpu"], tmp_path)
    _move_tensor(moved, "W2", 3 << 20 | 12)  # 4-byte aligned for mmap, not 4 KiB aligned
    unaligned = inspect_json(moved)["alignment"]["unaligned"]
    assert len(unaligned) == 1 and set(unaligned[0]) == UNALIGNED_KEYS


def test_plain_model_has_the_same_schema_with_null_manifest() -> None:
    report = inspect_json(FIXTURES / "mlp.onnx")
    assert set(report) == TOP_KEYS
    assert report["manifest"] is None
    assert report["epcontext_nodes"] == []


# ---------------------------------------------------------------- each fixture's compiled output


def test_split_output_three_partitions_one_blob_file(built: dict[str, Path]) -> None:
    model = built["split"]
    report = inspect_json(model)
    assert report["model"] == str(model)
    assert report["graph_bytes"] == model.stat().st_size
    assert report["protobuf_headroom_bytes"] == PROTOBUF_LIMIT - model.stat().st_size
    assert report["opsets"]["ai.onnx"] == 17
    assert report["inputs"] == [{"name": "x", "dtype": "float", "shape": [1, 256], "dynamic": False}]
    assert report["outputs"] == [{"name": "y", "dtype": "float", "shape": [1, 256], "dynamic": False}]

    nodes = report["epcontext_nodes"]
    assert len(nodes) == 3
    assert {n["source"] for n in nodes} == {"QNNExecutionProvider"}
    assert all(n["embed_mode"] == 0 and n["embedded_bytes"] == 0 and n["ep_sdk_version"] for n in nodes)
    assert all(n["partition_name"] for n in nodes) and len({n["partition_name"] for n in nodes}) == 3
    main = [n for n in nodes if n["main_context"] == 1]
    assert len(main) == 1, "QNN writes one context binary for all partitions; the others point at it"
    blob_file = model.parent / published(model.parent, "split_ctx_qnn.bin")
    assert main[0]["blob"] == {"location": blob_file.name, "size": blob_file.stat().st_size, "missing": False, "unsafe_path": False,
                               "shared": False}
    assert all(n["blob"] is None for n in nodes if n["main_context"] == 0)

    assert report["nodes"] == {"epcontext": 3, "epcontext_by_source": {"QNNExecutionProvider": 3},
                               "compiled_ops": {"MatMul": 3, "Relu": 1}, "remaining_ops": {"Mod": 1, "Sinh": 1}}
    data = model.parent / published(model.parent, "split_ctx.onnx.data")
    assert report["initializers"] == {
        "inline": 0,
        "inline_bytes": 0,
        "external": 1,  # W_mod, 256 floats: at the 1 KiB inline threshold, so external
        "files": [{"name": data.name, "tensors": 1, "referenced_bytes": 1024, "size": data.stat().st_size,
                   "missing": False, "unsafe_path": False, "short": False, "shared": False}],
    }
    assert report["alignment"] == {"align": 4096, "threshold": 1 << 20, "large_tensors": 0, "aligned": 0, "unaligned": []}
    manifest = report["manifest"]
    assert manifest["path"] == "split_ctx.manifest.json"
    assert (manifest["found"], manifest["hashed"], manifest["ok"], manifest["problems"]) == (True, False, True, [])
    assert {(f["name"], f["role"]) for f in manifest["files"]} == {
        ("split_ctx.onnx", "model"), (data.name, "data"), (blob_file.name, "ep_context")}
    for entry in manifest["files"]:
        size = (model.parent / entry["name"]).stat().st_size
        assert (entry["size"], entry["actual_size"], entry["sha256_ok"], entry["status"]) == (size, size, None, "ok")
    assert report["problems"] == []


def test_mlp_output_one_embedded_partition(built: dict[str, Path]) -> None:
    model = built["mlp"]
    report = inspect_json(model)
    [node] = report["epcontext_nodes"]
    proto = onnx.load_model(str(model), load_external_data=False)
    [epcontext] = [n for n in proto.graph.node if n.op_type == "EPContext"]
    cache = next(a.s for a in epcontext.attribute if a.name == "ep_cache_context")
    assert node["embed_mode"] == 1 and node["blob"] is None and node["main_context"] == 1
    assert node["embedded_bytes"] == len(cache) > 100_000  # the QNN context binary of a 2x256x256 MLP
    assert report["graph_bytes"] == model.stat().st_size > node["embedded_bytes"]
    assert report["nodes"] == {"epcontext": 1, "epcontext_by_source": {"QNNExecutionProvider": 1},
                               "compiled_ops": {"Add": 1, "MatMul": 2, "Relu": 1}, "remaining_ops": {}}
    assert report["initializers"] == {"inline": 0, "inline_bytes": 0, "external": 0, "files": []}
    assert [f["name"] for f in report["manifest"]["files"]] == ["mlp_ctx.onnx"]


def test_dynamic_output_compiled_with_fixed_batch_has_static_input(built: dict[str, Path]) -> None:
    compiled = inspect_json(built["dynamic"])
    assert compiled["inputs"] == [{"name": "x", "dtype": "float", "shape": [1, 256], "dynamic": False}]
    assert compiled["nodes"]["epcontext"] == 1
    source = inspect_json(FIXTURES / "dynamic.onnx")
    assert source["inputs"] == [{"name": "x", "dtype": "float", "shape": ["batch", 256], "dynamic": True}]
    assert source["outputs"] == [{"name": "y", "dtype": "float", "shape": ["batch", 256], "dynamic": True}]

    text = run_cli("inspect", FIXTURES / "dynamic.onnx")
    assert text.returncode == 0
    assert "input      x float[batch*,256]  (* symbolic)" in text.stdout.splitlines()


def test_cpu_output_external_weights_aligned(built: dict[str, Path]) -> None:
    model = built["cpu"]
    report = inspect_json(model)
    assert report["epcontext_nodes"] == []
    assert report["nodes"] == {"epcontext": 0, "epcontext_by_source": {}, "compiled_ops": {}, "remaining_ops": {"Add": 1, "MatMul": 2, "Relu": 1}}
    [data] = report["initializers"]["files"]
    assert report["initializers"]["external"] == 3 and report["initializers"]["inline"] == 0
    assert data["tensors"] == 3 and data["referenced_bytes"] == 2 * 256 * 256 * 4 + 256 * 4
    assert data["size"] == (model.parent / published(model.parent, "mlp_ctx.onnx.data")).stat().st_size >= data["referenced_bytes"]
    # The policy the output was compiled with comes from the manifest, not the defaults.
    assert report["alignment"] == {"align": 4096, "threshold": 4096, "large_tensors": 2, "aligned": 2, "unaligned": []}


def test_sharded_output_lists_every_data_file(tmp_path: Path) -> None:
    model = compile_to(FIXTURES / "mlp.onnx", tmp_path, "--ep", "cpu", "--inline-threshold", "1K", "--align-threshold", "4K", "--shard-size", "300K")
    files = inspect_json(model)["initializers"]["files"]
    assert [f["name"] for f in files] == sorted([published(tmp_path, "mlp_ctx.onnx.data"), published(tmp_path, "mlp_ctx.onnx.data.1")])
    assert sum(f["tensors"] for f in files) == 3
    assert sum(f["referenced_bytes"] for f in files) == 2 * 256 * 256 * 4 + 256 * 4
    assert all(f["size"] == (tmp_path / f["name"]).stat().st_size <= 300 * 1024 for f in files)


def test_share_weights_batch_marks_shared_files(tmp_path: Path) -> None:
    """mlp.onnx and dynamic.onnx have the same weights: --share-weights stores them once, and each model's
    report says the data file is shared (deleting it for one model breaks the other)."""
    proc = run_cli("compile", FIXTURES / "mlp.onnx", FIXTURES / "dynamic.onnx", "-o", tmp_path, "-q", "--share-weights", "--ep", "cpu")
    assert proc.returncode == 0, proc.stderr
    names = set()
    for model in ("mlp_ctx.onnx", "dynamic_ctx.onnx"):
        report = inspect_json(tmp_path / model)
        [use] = report["initializers"]["files"]
        assert (use["shared"], use["tensors"], use["referenced_bytes"], use["missing"]) == (True, 3, 2 * 256 * 256 * 4 + 256 * 4, False)
        assert report["problems"] == []
        names.add(use["name"])
        assert any(line.endswith(" (shared with other models)") for line in run_cli("inspect", tmp_path / model).stdout.splitlines())
    assert len(names) == 1, "both models reference one data file"


def test_share_weights_batch_marks_the_shared_ep_context(tmp_path: Path) -> None:
    proc = run_cli("compile", FIXTURES / "mlp.onnx", FIXTURES / "split.onnx", "-o", tmp_path, "-q", "--share-weights", "--embed", "never")
    assert proc.returncode == 0, proc.stderr
    blobs = set()
    for model in ("mlp_ctx.onnx", "split_ctx.onnx"):
        report = inspect_json(tmp_path / model)
        [main] = [n for n in report["epcontext_nodes"] if n["main_context"] == 1]
        assert main["blob"]["shared"] is True and main["blob"]["missing"] is False
        blobs.add(main["blob"]["location"])
    assert len(blobs) == 1, "one EP context for the batch"


def test_unaligned_large_tensor_is_named(built: dict[str, Path], tmp_path: Path) -> None:
    model = copy_output(built["cpu"], tmp_path)
    data = published(model.parent, "mlp_ctx.onnx.data")
    offset = _move_tensor(model, "W2", (1 << 20) + 64)
    alignment = inspect_json(model)["alignment"]
    assert alignment["large_tensors"] == 2 and alignment["aligned"] == 1
    assert alignment["unaligned"] == [{"name": "W2", "file": data, "offset": offset, "length": 256 * 256 * 4}]
    text = run_cli("inspect", model).stdout.splitlines()
    assert "alignment  1/2 tensors >= 4.0 KiB at 4096-byte offsets" in text
    assert f"  unaligned W2 in {data} at {offset}" in text


def _move_tensor(model: Path, name: str, new_offset: int) -> int:
    """Move one external tensor's bytes to new_offset in its data file, rewrite the graph and the manifest."""
    proto = onnx.load_model(str(model), load_external_data=False)
    tensor = next(t for t in proto.graph.initializer if t.name == name)
    fields = external_fields(tensor)
    data = model.parent / fields["location"].value
    offset, length = int(fields["offset"].value), int(fields["length"].value)
    with open(data, "r+b") as stream:
        stream.seek(offset)
        payload = stream.read(length)
        stream.seek(new_offset)
        stream.write(payload)
    fields["offset"].value = str(new_offset)
    onnx.save_model(proto, str(model))
    refresh_manifest(model)
    return new_offset


def test_text_report_lines(built: dict[str, Path]) -> None:
    proc = run_cli("inspect", built["split"])
    assert proc.returncode == 0 and proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert lines[0] == f"model      {built['split']}"
    assert "input      x float[1,256]" in lines
    assert "nodes      3 EPContext; compiled: MatMul 3, Relu 1; remaining: Mod 1, Sinh 1" in lines
    assert sum(line.startswith("epcontext  ") for line in lines) == 3
    blob, data = published(built["split"].parent, "split_ctx_qnn.bin"), published(built["split"].parent, "split_ctx.onnx.data")
    assert sum(f"file {blob} (" in line for line in lines) == 1
    assert sum("no blob (refers to the main context)" in line for line in lines) == 2
    assert "weights    0 inline (0 B), 1 external" in lines
    assert f"  file     {data}: 1 tensor, 1.0 KiB referenced, 1.0 KiB" in lines
    assert "manifest   split_ctx.manifest.json: ok (sizes only (--check hashes), 3 files)" in lines
    assert not any(line.startswith("problem") for line in lines)


def test_quiet_prints_nothing(built: dict[str, Path]) -> None:
    proc = run_cli("inspect", built["split"], "-q")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


# ---------------------------------------------------------------- plain models


def test_plain_model_inline_weights() -> None:
    report = inspect_json(FIXTURES / "mlp.onnx")
    assert report["opsets"] == {"ai.onnx": 17}
    assert report["nodes"]["epcontext"] == 0 and report["nodes"]["epcontext_by_source"] == {}
    assert report["nodes"]["remaining_ops"] == {"Add": 1, "MatMul": 2, "Relu": 1}
    assert report["initializers"] == {"inline": 3, "inline_bytes": 2 * 256 * 256 * 4 + 256 * 4, "external": 0, "files": []}
    assert report["manifest"] is None and report["problems"] == []
    assert report["graph_bytes"] == (FIXTURES / "mlp.onnx").stat().st_size


def test_plain_model_mixed_dtypes_and_symbolic_dim() -> None:
    report = inspect_json(FIXTURES / "mixed.onnx")
    assert report["inputs"] == [
        {"name": "x", "dtype": "float", "shape": [1, 16], "dynamic": False},
        {"name": "h", "dtype": "float16", "shape": [1, 16], "dynamic": False},
        {"name": "idx", "dtype": "int64", "shape": ["n"], "dynamic": True},
        {"name": "mask", "dtype": "bool", "shape": [1, 16], "dynamic": False},
    ]
    assert [(o["name"], o["dtype"]) for o in report["outputs"]] == [("y", "float"), ("y16", "float16"), ("top", "int64"), ("pos", "bool")]


def _plain_with_external_data(tmp_path: Path) -> Path:
    model = onnx.load_model(str(FIXTURES / "mlp.onnx"))
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="ext.onnx.data", size_threshold=1024)
    return path


def test_plain_model_with_external_data(tmp_path: Path) -> None:
    path = _plain_with_external_data(tmp_path)
    report = inspect_json(path)
    assert report["initializers"]["external"] == 3 and report["initializers"]["inline"] == 0
    [data] = report["initializers"]["files"]
    assert data == {"name": "ext.onnx.data", "tensors": 3, "referenced_bytes": 2 * 256 * 256 * 4 + 256 * 4,
                    "size": (tmp_path / "ext.onnx.data").stat().st_size, "missing": False, "unsafe_path": False, "short": False,
                    "shared": False}
    assert report["problems"] == [] and report["manifest"] is None


def test_plain_model_with_missing_external_data_is_reported_not_fatal(tmp_path: Path) -> None:
    """A packaging job runs inspect to see what is there: a missing file is a finding (exit 0), not a crash."""
    path = _plain_with_external_data(tmp_path)
    (tmp_path / "ext.onnx.data").unlink()
    proc = run_cli("inspect", path, "--json")
    assert proc.returncode == 0 and proc.stderr == ""
    report = json.loads(proc.stdout)
    [data] = report["initializers"]["files"]
    assert (data["missing"], data["size"], data["tensors"]) == (True, None, 3)
    assert report["problems"] == ["external data file 'ext.onnx.data' is missing"]
    text = run_cli("inspect", path)
    assert text.returncode == 0
    assert "  file     ext.onnx.data: 3 tensors, 513.0 KiB referenced, MISSING" in text.stdout.splitlines()
    assert "problem    external data file 'ext.onnx.data' is missing" in text.stdout.splitlines()


def test_check_fails_on_missing_external_data_without_manifest(tmp_path: Path) -> None:
    """--check is the gate: any problem, manifest or not, exits 5 (the report is still printed)."""
    path = _plain_with_external_data(tmp_path)
    (tmp_path / "ext.onnx.data").unlink()
    proc = run_cli("inspect", path, "--check", "--json")
    assert proc.returncode == 5
    assert json.loads(proc.stdout)["problems"] == ["external data file 'ext.onnx.data' is missing"]
    assert one_line_error(proc) == "ortcompile: error: check failed: external data file 'ext.onnx.data' is missing"


def test_plain_model_compiled_ops_is_empty_not_unknown() -> None:
    """No EPContext node: nothing was compiled, and the graph alone says so (null is only for 'unknown')."""
    assert inspect_json(FIXTURES / "mlp.onnx")["nodes"]["compiled_ops"] == {}
    assert "nodes      0 EPContext; compiled: none; remaining: Add 1, MatMul 2, Relu 1" in run_cli("inspect", FIXTURES / "mlp.onnx").stdout.splitlines()


# ---------------------------------------------------------------- damaged compiled outputs


def test_missing_data_file_reported_and_check_exits_5(built: dict[str, Path], tmp_path: Path) -> None:
    model = copy_output(built["split"], tmp_path)
    name, blob = published(model.parent, "split_ctx.onnx.data"), published(model.parent, "split_ctx_qnn.bin")
    (model.parent / name).unlink()
    report = inspect_json(model)  # without --check: a report, exit 0
    [data] = report["initializers"]["files"]
    assert data["missing"] is True and data["size"] is None
    assert report["problems"] == [f"external data file '{name}' is missing", f"{name}: missing"]
    assert report["manifest"]["ok"] is False
    status = {f["name"]: f["status"] for f in report["manifest"]["files"]}
    assert status == {"split_ctx.onnx": "ok", name: "missing", blob: "ok"}

    proc = run_cli("inspect", model, "--check", "--json")
    assert proc.returncode == 5
    assert json.loads(proc.stdout)["manifest"]["hashed"] is True  # the report is still printed
    line = one_line_error(proc)
    assert line.startswith("ortcompile: error: ") and f"{name}: missing" in line


def test_missing_blob_file_reported(built: dict[str, Path], tmp_path: Path) -> None:
    model = copy_output(built["split"], tmp_path)
    blob = published(model.parent, "split_ctx_qnn.bin")
    (model.parent / blob).unlink()
    report = inspect_json(model)
    [main] = [n for n in report["epcontext_nodes"] if n["main_context"] == 1]
    assert main["blob"] == {"location": blob, "size": None, "missing": True, "unsafe_path": False, "shared": False}
    assert f"EP context file '{blob}' (node {main['name']!r}) is missing" in report["problems"]
    assert f"{blob}: missing" in report["problems"]
    proc = run_cli("inspect", model, "--check", "-q")
    assert proc.returncode == 5
    line = one_line_error(proc)
    assert line.startswith("ortcompile: error: ") and f"{blob}: missing" in line


def test_truncated_data_file_is_short(built: dict[str, Path], tmp_path: Path) -> None:
    model = copy_output(built["split"], tmp_path)
    name = published(model.parent, "split_ctx.onnx.data")
    os.truncate(model.parent / name, 1000)
    report = inspect_json(model)
    [data] = report["initializers"]["files"]
    assert (data["size"], data["short"], data["missing"]) == (1000, True, False)
    assert report["problems"] == [f"external data file '{name}' has 1000 bytes, tensors need 1024",
                                  f"{name}: size 1000, manifest says 1024"]
    assert "SHORT" in run_cli("inspect", model).stdout


def test_check_hashes_and_catches_a_same_size_change(built: dict[str, Path], tmp_path: Path) -> None:
    model = copy_output(built["split"], tmp_path)
    report = inspect_json(model, "--check")
    assert report["manifest"]["hashed"] is True and report["manifest"]["ok"] is True
    assert [f["sha256_ok"] for f in report["manifest"]["files"]] == [True, True, True]

    blob = model.parent / published(model.parent, "split_ctx_qnn.bin")
    with open(blob, "r+b") as stream:  # one byte, same size: only a hash can see it
        stream.seek(blob.stat().st_size // 2)
        byte = stream.read(1)
        stream.seek(-1, os.SEEK_CUR)
        stream.write(bytes([byte[0] ^ 0xFF]))
    assert inspect_json(model)["manifest"]["ok"] is True  # sizes only: fast, and blind to this by design
    proc = run_cli("inspect", model, "--check", "--json")
    assert proc.returncode == 5
    entry = next(f for f in json.loads(proc.stdout)["manifest"]["files"] if f["name"] == blob.name)
    assert (entry["sha256_ok"], entry["status"]) == (False, "sha256 differs from the manifest")
    line = one_line_error(proc)
    assert line.startswith("ortcompile: error: ") and line.endswith(f"{blob.name}: sha256 differs from the manifest")


@pytest.mark.parametrize("location", ["../outside.data", "/etc/passwd"])
def test_data_path_leaving_the_directory_is_flagged(built: dict[str, Path], tmp_path: Path, location: str) -> None:
    model = copy_output(built["split"], tmp_path)
    proto = onnx.load_model(str(model), load_external_data=False)
    [tensor] = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    external_fields(tensor)["location"].value = location
    onnx.save_model(proto, str(model))
    report = inspect_json(model)
    [data] = report["initializers"]["files"]
    assert (data["name"], data["unsafe_path"], data["missing"], data["size"]) == (location, True, False, None)
    assert f"external data path {location!r} is absolute or leaves the model's directory" in report["problems"]


def test_compiled_ops_unknown_without_manifest(built: dict[str, Path], tmp_path: Path) -> None:
    """EPContext nodes do not say which ops they replaced; only the manifest does. Without it: null, never a guess."""
    model = copy_output(built["split"], tmp_path)
    model.with_name("split_ctx.manifest.json").unlink()
    report = inspect_json(model)
    assert report["manifest"] is None and report["problems"] == []
    assert report["nodes"] == {"epcontext": 3, "epcontext_by_source": {"QNNExecutionProvider": 3},
                               "compiled_ops": None, "remaining_ops": {"Mod": 1, "Sinh": 1}}
    lines = run_cli("inspect", model).stdout.splitlines()
    assert "nodes      3 EPContext; compiled: unknown without a manifest; remaining: Mod 1, Sinh 1" in lines
    assert "manifest   none" in lines


def test_not_a_model_and_no_such_file_exit_3(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    proc = run_cli("inspect", junk)
    assert proc.returncode == 3
    assert one_line_error(proc).startswith(f"ortcompile: error: {junk}: not a valid ONNX model")
    proc = run_cli("inspect", tmp_path / "absent.onnx")
    assert proc.returncode == 3
    assert one_line_error(proc) == f"ortcompile: error: {tmp_path / 'absent.onnx'}: no such file"


def test_manifest_from_another_tool_is_a_problem_not_a_crash(built: dict[str, Path], tmp_path: Path) -> None:
    model = copy_output(built["split"], tmp_path)
    model.with_name("split_ctx.manifest.json").write_text('{"format": "something-else/9", "files": []}')
    report = inspect_json(model)
    assert report["manifest"]["ok"] is False
    assert report["problems"] == ["split_ctx.manifest.json: unknown manifest format 'something-else/9'"]
    proc = run_cli("inspect", model, "--check", "-q")
    assert proc.returncode == 5 and "unknown manifest format" in one_line_error(proc)


# ---------------------------------------------------------------- a > 2 GB output, sparse


BIG_OFFSET = 2 << 30  # W2 moves here: a 2 GiB + 256 KiB data file, offsets past 2**31, holes everywhere else
RSS_LIMIT = 300 << 20
WALL_LIMIT = 5.0
# Measured on the 2-core dev box: inspect --json on this output took 0.3-0.5 s at 46 MiB peak RSS (that is
# Python with onnx and numpy imported), while --check (hashing the 2 GiB) took 2-5 s. The bounds leave 10x room
# for a loaded CI machine; reading the data file into memory would cost > 2 GiB of RSS, and the atime check
# below catches even a streamed read that keeps RSS low (wall time alone could not tell).

MEASURE = r"""
import json, resource, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
wall = time.perf_counter() - start
print(json.dumps({"wall": wall, "maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
                  "code": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}))
"""


def measured(*args: object) -> dict:
    """Run the CLI under a fresh, small interpreter, so RUSAGE_CHILDREN is that one child's peak RSS.

    Linux carries the forking process's RSS high-water mark across exec into the child's ru_maxrss, so the
    wrapper matters: under pytest the child would inherit pytest's mark; under the wrapper it inherits ~14 MiB
    (measured with /bin/true). The value is an upper bound of the CLI's own peak, which is what a bound needs."""
    proc = subprocess.run([sys.executable, "-c", MEASURE, *CLI, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def big_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real compiled output (CPU EP) whose data file is > 2 GiB but occupies < 1 MiB on disk."""
    directory = tmp_path_factory.mktemp("inspect-big")
    model = compile_to(FIXTURES / "mlp.onnx", directory, "--ep", "cpu", "--inline-threshold", "1K", "--align-threshold", "4K")
    _move_tensor(model, "W2", BIG_OFFSET)
    data = directory / published(directory, "mlp_ctx.onnx.data", own_digest=False)
    assert data.stat().st_size == BIG_OFFSET + 256 * 256 * 4 > 2**31
    assert data.stat().st_blocks * 512 < 4 << 20, "the filesystem did not keep the file sparse"
    return model


def _atime_is_tracked(directory: Path) -> bool:
    """relatime/strictatime update atime on a read when atime <= mtime; noatime never does."""
    probe = directory / "atime-probe"
    probe.write_bytes(b"x" * 4096)
    mtime = probe.stat().st_mtime_ns
    os.utime(probe, ns=(mtime - 3_600_000_000_000, mtime))
    probe.read_bytes()
    tracked = probe.stat().st_atime_ns != mtime - 3_600_000_000_000
    probe.unlink()
    return tracked


def _age_atime(path: Path) -> int:
    mtime = path.stat().st_mtime_ns
    os.utime(path, ns=(mtime - 3_600_000_000_000, mtime))
    return path.stat().st_atime_ns


def test_inspect_over_2gb_output_is_fast_low_memory_and_never_reads_the_data(big_output: Path, tmp_path: Path) -> None:
    data = big_output.parent / published(big_output.parent, "mlp_ctx.onnx.data", own_digest=False)
    atime_tracked = _atime_is_tracked(big_output.parent)
    aged = _age_atime(data)

    result = measured("inspect", big_output, "--json")
    assert result["code"] == 0, result["stderr"]
    assert result["wall"] < WALL_LIMIT, result
    assert result["maxrss_kib"] * 1024 < RSS_LIMIT, result
    report = json.loads(result["stdout"])
    [use] = report["initializers"]["files"]
    assert use["size"] == data.stat().st_size > 2**31
    assert use["referenced_bytes"] == 2 * 256 * 256 * 4 + 256 * 4 and use["short"] is False
    assert report["alignment"]["aligned"] == 2 and report["alignment"]["unaligned"] == []
    assert report["manifest"]["ok"] is True and report["manifest"]["hashed"] is False
    assert next(f for f in report["manifest"]["files"] if f["role"] == "data")["actual_size"] == data.stat().st_size
    assert report["problems"] == []
    if atime_tracked:
        assert data.stat().st_atime_ns == aged, "inspect without --check read the data file"

    # Positive control: --check must read all of it (and the atime probe sees that read).
    checked = measured("inspect", big_output, "--check", "-q")
    assert checked["code"] == 0, checked["stderr"]
    if atime_tracked:
        assert data.stat().st_atime_ns != aged, "--check did not read the data file"
    print(f"\n> 2 GB inspect: {result['wall']:.2f} s, {result['maxrss_kib'] / 1024:.0f} MiB; "
          f"--check: {checked['wall']:.2f} s, {checked['maxrss_kib'] / 1024:.0f} MiB; atime tracked: {atime_tracked}")


def test_the_sparse_over_2gb_output_is_a_real_model(big_output: Path) -> None:
    """The object of the test above is not a fake: it loads in ONNX Runtime and matches its source."""
    proc = run_cli("verify", big_output, "--reference", FIXTURES / "mlp.onnx", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["integrity"]["ok"] is True
    assert report["runs"][0]["outputs"][0]["max_abs"] == 0.0  # same EP, same weights: bit-identical


def test_docs_describe_every_json_key_and_option() -> None:
    """docs/inspect.md is the schema's reference: a key or option added without documenting it fails here."""
    doc = (ROOT / "docs" / "inspect.md").read_text()
    keys = (TOP_KEYS | IO_KEYS | EPCONTEXT_KEYS | BLOB_KEYS | NODES_KEYS | INITIALIZERS_KEYS | DATA_FILE_KEYS | ALIGNMENT_KEYS
            | UNALIGNED_KEYS | MANIFEST_KEYS | MANIFEST_FILE_KEYS)
    undocumented = sorted(k for k in keys if f"`{k}`" not in doc and f'"{k}"' not in doc)
    assert undocumented == []
    help_options = run_cli("inspect", "--help").stdout.partition("Options:")[2]
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-z])\b", help_options))
    assert options >= {"--check", "--json", "-q", "--quiet"}
    assert sorted(o for o in options if o not in doc) == []
