"""Small model generators and checks for the hardening tests (bad inputs, kills, concurrency, fuzzing).

Everything builds real ONNX files that real onnxruntime compiles; nothing here mocks anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import helpers
import numpy as np
import onnx
from helpers import cli_env, popen_process, published, run_cli, run_process, without_digest  # noqa: F401  (the suite's one CLI runner module; published names)
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
STAGE_PREFIX = ".ortcompile-stage-"
OPSET = 17


def error_lines(stderr: str) -> list[str]:
    return helpers.without_progress(stderr)


# ---------------------------------------------------------------- directory snapshots

def snapshot(directory: Path) -> dict[str, tuple[str, int, str]] | None:
    """Every entry under `directory`, hidden ones included: relative path -> (kind, size, sha256 or link target).

    None when the directory does not exist. Symlinks are recorded, not followed.
    """
    directory = Path(directory)
    if not os.path.lexists(directory):
        return None
    entries: dict[str, tuple[str, int, str]] = {}
    for root, dirs, files in os.walk(directory, followlinks=False):
        for name in dirs + files:
            path = Path(root) / name
            rel = path.relative_to(directory).as_posix()
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                entries[rel] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                entries[rel] = ("dir", 0, "")
            elif stat.S_ISREG(st.st_mode):
                entries[rel] = ("file", st.st_size, file_sha256(path))
            else:  # FIFOs, sockets, devices: never opened (a FIFO would block)
                entries[rel] = ("special", 0, oct(st.st_mode))
    return dict(sorted(entries.items()))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def stage_dirs(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(STAGE_PREFIX))


def check_published(out: Path, stem: str, *, hash_files: bool = True) -> dict[str, Any]:
    """The published output of `stem` is complete: the manifest lists the model, every listed file exists with the
    recorded size (and sha256), every path is a plain name, and no file of the output is a staging leftover."""
    manifest_path = out / f"{stem}_ctx.manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["model"] == f"{stem}_ctx.onnx", manifest["model"]
    names = [f["name"] for f in manifest["files"]]
    assert len(names) == len(set(names)), names
    assert f"{stem}_ctx.onnx" in names, names
    for entry in manifest["files"]:
        name = entry["name"]
        assert "/" not in name and name not in (".", "..") and not name.startswith(STAGE_PREFIX), name
        path = out / name
        assert path.is_file(), f"{name} listed by the manifest is missing"
        assert path.stat().st_size == entry["size"], (name, path.stat().st_size, entry["size"])
        if hash_files:
            assert file_sha256(path) == entry["sha256"], f"{name}: sha256 differs from the manifest"
    # the model itself references only files of this output
    model = onnx.load(str(out / manifest["model"]), load_external_data=False)
    for tensor in model.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            location = {e.key: e.value for e in tensor.external_data}["location"]
            assert location in names, (tensor.name, location, names)
    for node in model.graph.node:
        if node.op_type == "EPContext":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            if attrs.get("embed_mode", 1) == 0:
                assert attrs["ep_cache_context"].decode() in names, attrs["ep_cache_context"]
    return manifest


# ---------------------------------------------------------------- models

def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any], name: str = "m") -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ortcompile-hardening")
    model.ir_version = 9
    return model


def mlp(width: int = 64, layers: int = 2, seed: int = 0, batch: int | str = 1, name: str = "mlp") -> onnx.ModelProto:
    """x[batch, width] -> (MatMul + Add + Relu) x layers; each weight width*width float32 (16 KiB at 64)."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    current = "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        b = (rng.standard_normal((width,)) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"B{i}")]
        nodes += [helper.make_node("MatMul", [current, f"W{i}"], [f"m{i}"]), helper.make_node("Add", [f"m{i}", f"B{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"])]
        current = f"r{i}"
    nodes.append(helper.make_node("Identity", [current], ["y"]))
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])], inits, name)


def save(model: onnx.ModelProto, path: Path, *, external: str | None = None) -> Path:
    """Save; with `external`, every initializer of >= 1 KiB goes to that file (relative to the model)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    model = onnx.ModelProto.FromString(model.SerializeToString())  # onnx.save mutates its argument
    if external:
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=external, size_threshold=1024)
    else:
        onnx.save(model, str(path))
    return path


def set_external(tensor: TensorProto, **fields: Any) -> None:
    """Rewrite a tensor's external_data entries (location/offset/length...) as given (None: drop the key)."""
    current = {e.key: e.value for e in tensor.external_data}
    for key, value in fields.items():
        if value is None:
            current.pop(key, None)
        else:
            current[key] = str(value)
    del tensor.external_data[:]
    for key, value in current.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = TensorProto.EXTERNAL
    tensor.ClearField("raw_data")


def external_mlp(directory: Path, name: str = "m", data: str | None = None, **model_kwargs: Any) -> Path:
    """An MLP whose weights live in `<name>.onnx.data` (or `data`) beside it; returns the model path."""
    return save(mlp(**model_kwargs), directory / f"{name}.onnx", external=data or f"{name}.onnx.data")


def edit_model(path: Path, edit: Any) -> Path:
    """Load the graph proto (not the data), apply edit(model), save in place."""
    model = onnx.load(str(path), load_external_data=False)
    edit(model)
    path.write_bytes(model.SerializeToString())
    return path


def initializer(model: onnx.ModelProto, name: str) -> TensorProto:
    return next(t for t in model.graph.initializer if t.name == name)


def epcontext_model(path: Path, cache: bytes, embed_mode: int = 0) -> Path:
    """A compiled-looking model: one com.microsoft:EPContext node whose ep_cache_context is `cache`."""
    node = helper.make_node("EPContext", ["x"], ["y"], name="ctx0", domain="com.microsoft", embed_mode=embed_mode,
                            ep_cache_context=cache, source="QNNExecutionProvider", main_context=1)
    model = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [], "ctx")
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def finalize_failing_model(path: Path) -> Path:
    """QNN takes both partitions at GetCapability, but the HTP graph of the second fails to finalize (see helpers)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    helpers.finalize_failing_model(path)
    return path


def sized_model(directory: Path, name: str, megabytes: float, seed: int = 0) -> Path:
    """A [1, 512] MatMul chain whose float32 weights (1 MiB each) total about `megabytes`, stored in `<name>.onnx.data`."""
    layers = max(1, round(megabytes))
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    data_name = f"{name}.onnx.data"
    inits, nodes, current = [], [], "x"
    with open(directory / data_name, "wb") as stream:
        for i in range(layers):
            w = (rng.standard_normal((512, 512)) / 23).astype(np.float32)
            tensor = TensorProto(name=f"W{i:03d}", data_type=TensorProto.FLOAT, dims=[512, 512])
            set_external(tensor, location=data_name, offset=stream.tell(), length=w.nbytes)
            stream.write(w.tobytes())
            inits.append(tensor)
            nodes.append(helper.make_node("MatMul", [current, f"W{i:03d}"], [f"h{i}"]))
            current = f"h{i}"
    nodes.append(helper.make_node("Identity", [current], ["y"]))
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512])], inits, name)
    (directory / f"{name}.onnx").write_bytes(model.SerializeToString())
    return directory / f"{name}.onnx"


def write_mixed_big_model(directory: Path, name: str = "mixed", qnn_layers: int = 3, qnn_width: int = 4096, cpu_tensors: int = 4,
                          seed: int = 0) -> tuple[Path, int]:
    """A model with both passes doing real work: `qnn_layers` [qnn_width^2] MatMul+Relu layers (QNN compiles them into
    its blob: seconds of native EP compile) and `cpu_tensors` ~256 MiB weights each feeding `Mod(fmod=1)` (QNN does
    not take it: they stay in the output graph and go through the data pass). Weights are written straight to
    `<name>.onnx.data` by tests/bigmodel.py's generator. Returns (model path, data bytes)."""
    import math

    import bigmodel

    directory.mkdir(parents=True, exist_ok=True)
    weights = [bigmodel.Weight(f"q{i}", (qnn_width, qnn_width), math.sqrt(3.0 / qnn_width)) for i in range(qnn_layers)]
    weights += [bigmodel.Weight(f"c{j}", (8192, 8191), 1.0) for j in range(cpu_tensors)]
    data_name = f"{name}.onnx.data"
    offsets = bigmodel.write_data_file(directory / data_name, weights, seed)
    inits = []
    for weight in weights:
        tensor = TensorProto(name=weight.name, data_type=TensorProto.FLOAT, dims=list(weight.shape))
        set_external(tensor, location=data_name, offset=offsets[weight.name], length=weight.nbytes)
        inits.append(tensor)
    inits.append(numpy_helper.from_array(np.array([1e30], np.float32), "div"))
    nodes, current = [], "x"
    for i in range(qnn_layers):
        nodes += [helper.make_node("MatMul", [current, f"q{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        current = f"r{i}"
    nodes.append(helper.make_node("Identity", [current], ["y"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, qnn_width])]
    for j in range(cpu_tensors):
        nodes.append(helper.make_node("Mod", [f"c{j}", "div"], [f"z{j}"], fmod=1))
        outputs.append(helper.make_tensor_value_info(f"z{j}", TensorProto.FLOAT, [8192, 8191]))
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, qnn_width])], outputs, inits, name)
    (directory / f"{name}.onnx").write_bytes(model.SerializeToString())
    return directory / f"{name}.onnx", sum(w.nbytes for w in weights)
