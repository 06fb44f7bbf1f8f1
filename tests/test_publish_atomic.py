"""Replacing an output is atomic for readers: a program loading it while `compile --force` replaces it never runs
the old graph on the new weights (docs/output-layout.md#replacing-an-output).

A writer (this process, the CLI in-process) compiles two different models of the same name — same shapes, other
weights; some of them inline in the graph, the rest in the data file or the EP's blob — into one output directory,
alternating, with --force; a reader (another process, plain onnxruntime) loads the output and runs it in a loop.
Every run must give one of the two models' outputs; a load may fail, and then only because the old generation's
file was just removed (its name is in the old graph).

Before content-addressed names, publishing renamed `m_ctx.onnx.data` (or `m_ctx_qnn.bin`) and then `m_ctx.onnx`
into place: a reader that had read the old graph then mapped the new data. Measured with this test on the code
before the change: 34 wrong runs of 5,307 (62 replacements, 7 runs, each with 2-13) on the CPU EP, 5 of 1,855 (27
replacements, 3 runs) on QNN; after it 0 of 4,679 and 0 of 1,373 (docs/output-layout.md#replacing-an-output).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from genmodels import external_mlp, save
from helpers import cli_env, published, run_cli, sha256
from onnx import TensorProto, helper, numpy_helper

WIDTH = 64

READER = r"""
import json, sys
from pathlib import Path
import numpy as np
import onnxruntime as ort

model, ep, signals = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])  # (QNN prints banners on stdout: files talk)
references = {"a": sys.argv[4], "b": sys.argv[5]}
options = ort.SessionOptions()
options.log_severity_level = 4
if ep == "qnn":
    import onnxruntime_qnn
    ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    options.add_provider_for_devices(devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path()})
    kwargs = {}
else:
    kwargs = {"providers": ["CPUExecutionProvider"]}
x = np.random.default_rng(7).standard_normal((1, WIDTH_HERE)).astype(np.float32)
run = lambda path: ort.InferenceSession(str(path), options, **kwargs).run(None, {"x": x})[0]
outputs = {name: run(path) for name, path in references.items()}  # each model compiled on its own
assert not np.array_equal(outputs["a"], outputs["b"])
counts, failures = {"a": 0, "b": 0, "wrong": 0, "load_failed": 0}, {}
(signals / "ready").touch()
while not (signals / "stop").exists():
    try:
        y = run(model)
    except Exception as exc:
        counts["load_failed"] += 1
        line = str(exc).splitlines()[0]
        failures[line] = failures.get(line, 0) + 1
        continue
    counts[next((n for n, want in outputs.items() if np.array_equal(y, want)), "wrong")] += 1
(signals / "report.json").write_text(json.dumps({"counts": counts, "failures": failures}))
""".replace("WIDTH_HERE", str(WIDTH))


def cpu_model(directory: Path, seed: int) -> Path:
    """40 layers: the reader spends ~40 ms between reading the graph (biases inline) and opening its data file."""
    return external_mlp(directory, name="m", seed=seed, width=WIDTH, layers=40)


def qnn_model(directory: Path, seed: int) -> Path:
    """QNN takes the MatMul/Relu chain (its weights go into the blob); it declines Mod(fmod=1), whose 256-byte
    divisor stays inline in the graph: an old graph with a new blob computes neither model."""
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) / 8).astype(np.float32), f"W{i}") for i in range(2)]
    divisor = numpy_helper.from_array((0.75 + rng.random(WIDTH) / 2).astype(np.float32), "d")
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["h0"]), helper.make_node("Relu", ["h0"], ["r0"]),
             helper.make_node("MatMul", ["r0", "W1"], ["h1"]), helper.make_node("Mod", ["h1", "d"], ["y"], fmod=1)]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])], [*weights, divisor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return save(model, directory / "m.onnx")


# How onnxruntime says that a file the graph names is gone: a data file (checked, then mapped: removed in between
# gives `SystemError : 2`, ENOENT), an EP context file.
MISSING_FILE = [r'External data path does not exist: "[^"]*/m_ctx\.[0-9a-f]{12}\.data"', r"^SystemError : 2$",
                # the same race met one step later: the file went between ORT's existence check and its realpath
                r"Failed to get the weakly canonical path: \S*/m_ctx\.[0-9a-f]{12}\.data - No such file or directory",
                r"Failed to load from EpContext model\. The file path in ep_cache_context does not exist or is not accessible",
                # QNN's is_regular_file check passed, then the blob went before its ifstream opened it
                r"Failed to load from EpContext model\. Failed to open cache file\.$"]

MIN_REPLACEMENTS = 4  # however long they take: each one a window for the reader to see a mix
CASES = {  # ep -> (model builder, extra compile options, seconds of replacing)
    "cpu": (cpu_model, (), 10.0),
    "qnn": (qnn_model, ("--embed", "never"), 10.0),
}


@pytest.mark.parametrize("ep", list(CASES))
def test_force_replacement_never_gives_a_reader_the_old_graph_with_new_data(ep: str, tmp_path: Path) -> None:
    build, extra, seconds = CASES[ep]
    if ep == "qnn":
        pytest.importorskip("onnxruntime_qnn")
    models = {name: build(tmp_path / "src" / name, seed) for name, seed in (("a", 0), ("b", 1))}
    out, signals = tmp_path / "out", tmp_path / "signals"
    signals.mkdir()
    env = cli_env({"XDG_CACHE_HOME": str(tmp_path / "xdg")})

    def compile_(name: str, into: Path) -> None:
        result = run_cli("compile", models[name], "-o", into, "--ep", ep, "--force", "--check", "none", "-q", *extra, env=env)
        assert result.returncode == 0, result.stderr

    for name in models:  # each model compiled on its own: the reader's references
        compile_(name, tmp_path / f"ref-{name}")
    shutil.copytree(tmp_path / "ref-a", out)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(out / "m_ctx.onnx"), ep, str(signals),
                               str(tmp_path / "ref-a" / "m_ctx.onnx"), str(tmp_path / "ref-b" / "m_ctx.onnx")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while not (signals / "ready").exists():
            assert reader.poll() is None, reader.communicate()[1]
            time.sleep(0.05)
        replaced, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline or replaced < MIN_REPLACEMENTS:  # a slow machine still gets its races
            compile_("b" if replaced % 2 == 0 else "a", out)
            replaced += 1
        (signals / "stop").touch()
        _, stderr = reader.communicate(timeout=120)
    finally:
        reader.kill()
    assert reader.returncode == 0, stderr
    report = json.loads((signals / "report.json").read_text())
    counts, failures = report["counts"], report["failures"]
    print(f"\n{ep}: {replaced} replacements; reader: {counts}; load failures: {failures}")
    assert replaced >= MIN_REPLACEMENTS
    assert counts["a"] > 0 and counts["b"] > 0, "the reader never saw the output change"
    assert counts["wrong"] == 0, f"{counts['wrong']} runs got the old graph with the other model's data"
    # A load that fails does so cleanly: the old graph's file was removed after the new model was in place.
    for line in failures:
        assert any(re.search(pattern, line) for pattern in MISSING_FILE), line


# ---------------------------------------------------------------- what a replacement removes, and what it leaves

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _manifest(out: Path, stem: str) -> dict[str, Any]:
    return json.loads((out / f"{stem}_ctx.manifest.json").read_text())


def _cli(*args: object, env: dict[str, str]) -> None:
    result = run_cli(*args, "-q", env=env)
    assert result.returncode == 0, result.stderr


def test_replacing_removes_only_the_previous_generation(tmp_path: Path) -> None:
    """--force with other shards: the old shards go (after the new model is in place), the new ones carry their own
    digests, and a file a hand-edited manifest lists without its digest in its name is not ortcompile's to remove."""
    out, env = tmp_path / "out", cli_env({"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    _cli("compile", FIXTURES / "mlp.onnx", "-o", out, "--ep", "cpu", "--shard-size", "300K", env=env)
    old = {f["name"] for f in _manifest(out, "mlp")["files"]} - {"mlp_ctx.onnx"}
    assert len(old) == 2
    notes = out / "notes.txt"
    notes.write_text("the user's notes\n")
    manifest = _manifest(out, "mlp")
    manifest["files"].append({"name": notes.name, "role": "data", "size": notes.stat().st_size, "sha256": sha256(notes)})
    (out / "mlp_ctx.manifest.json").write_text(json.dumps(manifest))
    _cli("compile", FIXTURES / "mlp.onnx", "-o", out, "--ep", "cpu", "--force", env=env)
    [data] = [f for f in _manifest(out, "mlp")["files"] if f["role"] == "data"]
    assert data["name"] == f"mlp_ctx.{data['sha256'][:12]}.data"
    assert sorted(os.listdir(out)) == sorted(["mlp_ctx.onnx", data["name"], "mlp_ctx.manifest.json", notes.name])
    assert notes.read_text() == "the user's notes\n"


def test_replacing_one_model_of_a_batch_keeps_what_the_others_use(tmp_path: Path) -> None:
    """mlp and dynamic share `mlp_shared.<digest>.data`; mlp compiled again alone (--force) gets a data file of its own,
    and the shared one stays: dynamic's manifest lists it (it used to be removed with mlp's old files)."""
    out, env = tmp_path / "out", cli_env({"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    _cli("compile", FIXTURES / "mlp.onnx", FIXTURES / "dynamic.onnx", "-o", out, "--ep", "cpu", "--share-weights", env=env)
    shared = published(out, "mlp_shared.data")
    _cli("compile", FIXTURES / "mlp.onnx", "-o", out, "--ep", "cpu", "--force", env=env)
    assert (out / shared).is_file() and published(out, "mlp_ctx.onnx.data")
    _cli("verify", out / "dynamic_ctx.onnx", "--reference", FIXTURES / "dynamic.onnx", "--dim", "batch=2", env=env)
    _cli("verify", out / "mlp_ctx.onnx", "--reference", FIXTURES / "mlp.onnx", env=env)


def test_replacing_an_output_of_the_earlier_layout_removes_its_files(tmp_path: Path) -> None:
    """An output published before names were content-addressed (`mlp_ctx.onnx.data`): --force replaces it whole."""
    out, env = tmp_path / "out", cli_env({"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    _cli("compile", FIXTURES / "mlp.onnx", "-o", out, "--ep", "cpu", "--inline-threshold", "0", env=env)
    data = published(out, "mlp_ctx.onnx.data")
    (out / data).rename(out / "mlp_ctx.onnx.data")  # as the earlier ortcompile named it
    model = onnx.load(str(out / "mlp_ctx.onnx"), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "mlp_ctx.onnx.data"
    onnx.save(model, str(out / "mlp_ctx.onnx"))
    manifest = _manifest(out, "mlp")
    for entry in manifest["files"]:
        entry["name"] = {data: "mlp_ctx.onnx.data"}.get(entry["name"], entry["name"])
        entry["size"], entry["sha256"] = (out / entry["name"]).stat().st_size, sha256(out / entry["name"])
    (out / "mlp_ctx.manifest.json").write_text(json.dumps(manifest))
    _cli("verify", out / "mlp_ctx.onnx", "--reference", FIXTURES / "mlp.onnx", env=env)  # a good output of the old layout
    _cli("compile", FIXTURES / "mlp.onnx", "-o", out, "--ep", "cpu", "--force", env=env)
    assert sorted(os.listdir(out)) == sorted(["mlp_ctx.onnx", published(out, "mlp_ctx.onnx.data"), "mlp_ctx.manifest.json"])
