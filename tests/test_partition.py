"""--partition, split and stitch on small models (issue 13); the multi-gigabyte runs are in test_large_partition.py.

A 9 MiB MatMul/Add chain in 3 QNN partitions (Sinh between them, on the CPU EP) compiled whole and as parts of
at most 2.5 MiB of weights: 5 parts (the sizes scale together: small is faster on the simulator), stitched into one model that loads in one QNN session.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

try:
    from bigmodel import write_qnn_model
    from helpers import FIXTURES, assert_one_line_error, cpu_session, published, qnn_session, run_cli, seeded_inputs, snapshot
except ImportError:  # pragma: no cover
    from tests.bigmodel import write_qnn_model
    from tests.helpers import FIXTURES, assert_one_line_error, cpu_session, published, qnn_session, run_cli, seeded_inputs, snapshot

pytest.importorskip("onnxruntime_qnn")

BUDGET = "2560KiB"
BUDGET_BYTES = 2560 << 10
# QNN's default target (HTP v73) computes in fp16. The same ops compiled whole or as parts give the same HTP
# graphs: measured bit-identical outputs. Against the CPU EP, fp16's criterion of verify (20 dB SNR, cosine 0.995).
MIN_SNR_DB, MIN_COSINE = 20.0, 0.995


def _json(proc: Any) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_qnn_model(tmp_path_factory.mktemp("chain"), "chain", partitions=3, layers_per_partition=3, width=512).path


@pytest.fixture(scope="module")
def whole(chain: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("whole")
    _json(run_cli("compile", chain, "-o", out, "--ep", "qnn", "--json"))
    return out / "chain_ctx.onnx"


@pytest.fixture(scope="module")
def partitioned(chain: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("partitioned")
    result = _json(run_cli("compile", chain, "-o", out, "--ep", "qnn", "--partition", BUDGET, "--jobs", "2", "--json"))["outputs"][0]
    return out, result


def test_partitioned_compile_is_one_model_of_several_parts(partitioned: tuple[Path, dict[str, Any]]) -> None:
    out, result = partitioned
    parts = result["parts"]["parts"]
    assert len(parts) >= 4, "9 MiB of weights in parts of at most 2.5 MiB"
    assert all(p["weight_bytes"] <= BUDGET_BYTES for p in parts)
    assert all(p["check"] is True and p["peak_rss_bytes"] > 0 for p in parts), "every part is checked on its own when it compiles"
    assert sorted(p.name for p in out.iterdir()) == ["chain_ctx.manifest.json", "chain_ctx.onnx"], "one model, one manifest, no leftovers"
    manifest = json.loads((out / "chain_ctx.manifest.json").read_text())
    assert [p["model"] for p in manifest["parts"]] == [f"chain.part{i:02d}.onnx" for i in range(len(parts))]
    assert manifest["check"] == {"mode": "run", "passed": True, "criterion": manifest["check"]["criterion"], "inputs": "generated (seeded)"}
    assert manifest["nodes"]["remaining_ops"] == {"Sinh": 2}, "the CPU nodes between QNN partitions stay where they were"
    assert manifest["options"]["partition"] == {"budget": BUDGET_BYTES, "max_context_size": None}


def test_the_stitched_check_feeds_the_users_inputs_and_reports_the_applied_budget(chain: Path, tmp_path: Path) -> None:
    """--input reaches the check of the stitched model (the parts never see it), and the result names the budget split
    applied, `auto` resolved to the default context size."""
    source = cpu_session(chain)
    [spec] = source.get_inputs()
    np.save(tmp_path / "x.npy", np.full(spec.shape, 0.5, dtype=np.float32))
    out = tmp_path / "out"
    result = _json(run_cli("compile", chain, "-o", out, "--ep", "qnn", "--partition", "auto", "--input", f"{spec.name}={tmp_path / 'x.npy'}",
                           "--json"))["outputs"][0]
    assert result["parts"]["budget_bytes"] == 1 << 30
    assert f"{spec.name}: given (x.npy)" in result["check"]["notes"]
    manifest = json.loads((out / "chain_ctx.manifest.json").read_text())
    assert manifest["check"]["inputs"] == "given and generated (seeded)"


def test_partitioned_output_computes_what_the_whole_compile_does(chain: Path, whole: Path, partitioned: tuple[Path, dict[str, Any]]) -> None:
    out, _ = partitioned
    stitched, single, source = qnn_session(out / "chain_ctx.onnx"), qnn_session(whole), cpu_session(chain)
    for seed in (0, 1):
        feed = seeded_inputs(source, seed)
        reference = source.run(None, feed)[0].astype(np.float64).ravel()
        got, expected = stitched.run(None, feed)[0], single.run(None, feed)[0]
        np.testing.assert_array_equal(got, expected)
        got = got.astype(np.float64).ravel()
        snr_db = 10 * np.log10(np.sum(reference**2) / np.sum((got - reference) ** 2))
        cosine = got @ reference / (np.linalg.norm(got) * np.linalg.norm(reference))
        assert snr_db >= MIN_SNR_DB and cosine >= MIN_COSINE, (snr_db, cosine)


def test_split_compile_stitch_gives_the_bytes_of_partition(chain: Path, partitioned: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    out, _ = partitioned
    parts, compiled, stitched = tmp_path / "parts", tmp_path / "compiled", tmp_path / "stitched"
    split = _json(run_cli("split", chain, "-o", parts, "--ep", "qnn", "--partition", BUDGET, "--json"))
    names = [Path(p["model"]).name for p in split["parts"]]
    assert names == [f"chain.part{i:02d}.onnx" for i in range(len(names))]
    assert (parts / "chain.skeleton.onnx").is_file() and (parts / "chain.parts.mk").is_file()
    for name in names:  # each part is a standalone model: any machine could compile it
        onnx.checker.check_model(str(parts / name))
        _json(run_cli("compile", parts / name, "-o", compiled, "--ep", "qnn", "--allow-partial", "--json"))
    _json(run_cli("stitch", parts / "chain.parts.json", "--parts", compiled, "-o", stitched, "--json"))
    assert snapshot(stitched) == snapshot(out), "split + compile + stitch must give the bytes --partition gives, manifest included"


def test_make_fragment_compiles_the_parts_in_parallel_and_stitches(chain: Path, partitioned: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.fail("make is not installed (CI installs it): the Make fragment cannot be tested")
    out, _ = partitioned
    _json(run_cli("split", chain, "-o", "parts", "--ep", "qnn", "--partition", BUDGET, "--stitch-output", "built", "--json", cwd=tmp_path))
    ortcompile = f"ORTCOMPILE={sys.executable} -m ortcompile"  # this interpreter, whatever PATH says
    proc = subprocess.run(["make", "-f", "parts/chain.parts.mk", "-j", "2", ortcompile], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("-m ortcompile compile") == 5 and "-m ortcompile stitch" in proc.stdout
    assert snapshot(tmp_path / "built") == snapshot(out)
    again = subprocess.run(["make", "-f", "parts/chain.parts.mk", ortcompile], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "ortcompile" not in again.stdout, "nothing to do when every part and the stitch are current"


def test_stitch_refuses_missing_and_foreign_parts(chain: Path, tmp_path: Path) -> None:
    parts, compiled = tmp_path / "parts", tmp_path / "compiled"
    _json(run_cli("split", chain, "-o", parts, "--ep", "qnn", "--partition", "5MiB", "--target", "sm8650", "--json"))
    _json(run_cli("compile", parts / "chain.part00.onnx", "-o", compiled, "--ep", "qnn", "--target", "sm8650", "--allow-partial", "--json"))
    missing = run_cli("stitch", parts / "chain.parts.json", "--parts", compiled, "-o", tmp_path / "out")
    assert missing.returncode == 2
    line = assert_one_line_error(missing.stderr, f"part chain.part01.onnx is not compiled: {compiled / 'chain.part01_ctx.onnx'} is missing")
    command = shlex.split(line.split("; compile it with: ", 1)[1])  # the exact command, with the planned options: it works as given
    assert command[:4] == ["ortcompile", "compile", str(parts / "chain.part01.onnx"), "-o"] and "sm8650" in command
    for _ in range(4):  # the remaining parts, each compiled by the command the refusal gives, until stitch has them all
        _json(run_cli(*command[1:], "--json"))
        stitched = run_cli("stitch", parts / "chain.parts.json", "--parts", compiled, "-o", tmp_path / "out", "--json")
        if stitched.returncode == 0:
            break
        command = shlex.split(assert_one_line_error(stitched.stderr, "is not compiled").split("; compile it with: ", 1)[1])
    _json(stitched)
    _json(run_cli("compile", parts / "chain.part01.onnx", "-o", compiled, "--ep", "cpu", "--force", "--json"))
    foreign = run_cli("stitch", parts / "chain.parts.json", "--parts", compiled, "-o", tmp_path / "out2")
    assert foreign.returncode == 2 and "part chain.part01.onnx was not compiled as planned" in foreign.stderr
    assert not (tmp_path / "out2").exists(), "a refused stitch leaves no output directory"
    not_a_plan = run_cli("stitch", chain, "--parts", compiled, "-o", tmp_path / "out")
    assert not_a_plan.returncode == 3 and "not a parts plan written by ortcompile split" in not_a_plan.stderr


def _failing_tail_model(path: Path) -> Path:
    """Two 4 MiB layers, then the HTP graph that fails to finalize (helpers.finalize_failing_model): with parts of
    5 MiB, the second part (the second layer and the tail) fails while the first compiles."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((1024, 1024)) / 32).astype(np.float32), f"W{i}") for i in range(2)]
    inits += [numpy_helper.from_array((rng.standard_normal((1024, 16)) / 32).astype(np.float32), "Wt"),
              numpy_helper.from_array(np.array([1, 1, 4, 4], np.int64), "shape"), numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), "k")]
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["h0"]), helper.make_node("MatMul", ["h0", "W1"], ["h1"]),
             helper.make_node("MatMul", ["h1", "Wt"], ["a"]), helper.make_node("Relu", ["a"], ["b"]), helper.make_node("Sinh", ["b"], ["c"]),
             helper.make_node("Reshape", ["c", "shape"], ["d"]),
             helper.make_node("ConvTranspose", ["d", "k"], ["y"], strides=[7, 7], output_padding=[6, 6])]
    graph = helper.make_graph(nodes, "tail", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 30, 30])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path), save_as_external_data=True, location=f"{path.name}.data", size_threshold=1024)
    return path


def test_a_failing_part_fails_the_compile_naming_it_and_publishes_nothing(tmp_path: Path) -> None:
    model = _failing_tail_model(tmp_path / "tail.onnx")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("unrelated")
    proc = run_cli("compile", model, "-o", out, "--ep", "qnn", "--partition", "5MiB")
    assert proc.returncode == 1, proc.stderr
    assert "part tail.part01.onnx: qnn: compilation failed: Failed to finalize QNN graph" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"], "no output, no staging directory, no parts left behind"


def test_shared_weights_are_stored_once(tmp_path: Path) -> None:
    """One 4 MiB weight read by the first and the last layer: both parts carry it, the stitched data holds it once."""
    rng = np.random.default_rng(1)
    weights = {n: (rng.standard_normal((1024, 1024)) / 32).astype(np.float32) for n in ("A", "B", "C")}
    nodes = [helper.make_node("MatMul", ["x", "A"], ["h0"]), helper.make_node("MatMul", ["h0", "B"], ["h1"]),
             helper.make_node("MatMul", ["h1", "C"], ["h2"]), helper.make_node("MatMul", ["h2", "A"], ["y"])]
    graph = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1024])],
                              [numpy_helper.from_array(w, n) for n, w in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = tmp_path / "shared.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="shared.onnx.data")
    result = _json(run_cli("compile", path, "-o", tmp_path / "out", "--ep", "cpu", "--partition", "5MiB", "--json"))["outputs"][0]
    assert len(result["parts"]["parts"]) >= 3
    data = tmp_path / "out" / published(tmp_path / "out", "shared_ctx.onnx.data")
    assert 3 * 4 << 20 <= data.stat().st_size < 4 * 4 << 20, "A is read by two parts but stored once"
    feed = {"x": np.random.default_rng(2).standard_normal((1, 1024)).astype(np.float32)}
    np.testing.assert_array_equal(cpu_session(tmp_path / "out" / "shared_ctx.onnx").run(None, feed)[0], cpu_session(path).run(None, feed)[0])


def test_inspect_shows_the_parts(partitioned: tuple[Path, dict[str, Any]]) -> None:
    out, _ = partitioned
    proc = run_cli("inspect", out / "chain_ctx.onnx")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("part ")]
    assert len(lines) >= 4 and lines[0].startswith("part       chain.part00.onnx: nodes 0-")
    report = _json(run_cli("inspect", out / "chain_ctx.onnx", "--json"))
    assert [p["model"] for p in report["parts"]][:2] == ["chain.part00.onnx", "chain.part01.onnx"]


@pytest.mark.parametrize("args, needle", [
    (["--jobs", "2"], "--jobs/--memory-budget schedule the parts of --partition"),
    (["--partition", "0B"], "--partition"),
])
def test_partition_usage_errors(chain: Path, tmp_path: Path, args: list[str], needle: str) -> None:
    proc = run_cli("compile", chain, "-o", tmp_path / "out", "--ep", "qnn", *args)
    assert proc.returncode == 2 and needle in proc.stderr
    assert not (tmp_path / "out").exists()


def test_share_weights_with_partition_is_refused(tmp_path: Path) -> None:
    """A --share-weights batch compiles each model whole: with --partition it would record a budget it never applied."""
    models = [shutil.copyfile(FIXTURES / n, tmp_path / n) for n in ("mlp.onnx", "split.onnx")]
    for option in (["--partition", "1KiB"], ["--max-context-size", "1MiB"]):
        proc = run_cli("compile", *models, "-o", tmp_path / "out", "--ep", "cpu", "--share-weights", *option)
        assert proc.returncode == 2, proc.stderr
        assert_one_line_error(proc.stderr, "--share-weights compiles each model whole: it cannot be combined with --partition")
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["compile", "split"])
def test_partition_of_a_dynamic_model_without_pins_is_a_usage_error(tmp_path: Path, command: str) -> None:
    """Exit 2 and the pins to add, as everywhere else a model's dynamic dims stop a compile (pass-through included)."""
    model = shutil.copyfile(FIXTURES / "dynamic.onnx", tmp_path / "dynamic.onnx")
    proc = run_cli(command, model, "-o", tmp_path / "out", "--ep", "cpu", "--partition", "1KiB")
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, "these inputs are still dynamic: x[batch,256]; add --fix-dim batch=N")
    assert not (tmp_path / "out").exists()
    pinned = run_cli(command, model, "-o", tmp_path / "out", "--ep", "cpu", "--partition", "1KiB", "--fix-dim", "batch=2", "-q")
    assert pinned.returncode == 0, pinned.stderr


def test_a_wrong_input_is_refused_before_any_part_compiles(tmp_path: Path) -> None:
    model = shutil.copyfile(FIXTURES / "split.onnx", tmp_path / "split.onnx")
    np.save(tmp_path / "x.npy", np.zeros((1, 255), np.float32))  # the model's input is [1, 256]
    proc = run_cli("compile", model, "-o", tmp_path / "out", "--ep", "qnn", "--partition", "1KiB", "--verify", "--input", f"x={tmp_path / 'x.npy'}", "-v")
    assert proc.returncode == 2, proc.stderr
    assert "input 'x' (x.npy) has shape [1, 255], the model needs tensor(float)[1,256]" in proc.stderr.splitlines()[-1]
    assert "compiling part" not in proc.stderr and "splitting" in proc.stderr
    assert not (tmp_path / "out").exists()



def test_the_check_never_takes_a_spare_worker_a_parts_thread_started() -> None:
    """A worker child dies (PR_SET_PDEATHSIG, SIGKILL) when the *thread* that started it ends, not the process. The
    parts compile in pool threads, and a part's worker retiring starts the spare; taken by the stitched model's check
    on the main thread, it was killed when the pool's threads ended: "crashed (SIGKILL) while running the compiled
    dynamic_ctx.onnx" (seen twice in test_partition_of_a_dynamic_model_without_pins_is_a_usage_error)."""
    from ortcompile.worker import expect_more_workers, fresh_worker, retire_worker

    fresh_worker("drained", None, False).close()  # whatever spare this process holds: the thread below starts the next
    started, release = threading.Event(), threading.Event()

    def part_thread() -> None:
        expect_more_workers()
        retire_worker(False)  # a part's worker retired: the spare starts, its life tied to this thread
        started.set()
        release.wait()

    thread = threading.Thread(target=part_thread)
    thread.start()
    started.wait()
    worker = fresh_worker("the check", None, False)
    try:
        assert worker.call("ok".format, doing="checking") == "ok"  # the child is up (and armed its death signal)
        release.set()
        thread.join()
        time.sleep(0.2)
        assert worker.call("ok".format, doing="checking") == "ok", "the worker outlives the part's thread"
    finally:
        release.set()
        worker.close()


def test_a_cut_whose_part_fails_leaves_later_compiles_of_the_process_alone(tmp_path: Path) -> None:
    """--cpu-nodes naming one MatMul of three cuts the graph; the tail's part fails to finalize, so the cut gives way
    to moving every MatMul, which fails the same way (exit 1). The failed part's cancel must not outlive it: the next
    compile in this process succeeds (it said 'cancelled while compiling' once)."""
    model = _failing_tail_model(tmp_path / "tail.onnx")
    failed = run_cli("compile", model, "-o", tmp_path / "out", "--ep", "qnn", "--cpu-nodes", "h0")
    assert failed.returncode == 1, failed.stderr
    assert "cannot cut the graph around h0" in failed.stderr and "Failed to finalize QNN graph" in failed.stderr
    after = run_cli("compile", FIXTURES / "mlp.onnx", "-o", tmp_path / "after", "--ep", "qnn")
    assert after.returncode == 0, after.stderr


def test_a_part_whose_check_fails_is_refused_naming_the_node(tmp_path: Path) -> None:
    """A part checked on its own (generated inputs) that fp16 gets wrong: Log(x*x + 1e-10) on inputs scaled by 1e-3
    underflows on the HTP. The part's refusal names the node and a step --partition takes (it was an internal
    AttributeError when no fp16 lint had read the part's graph)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(1e-3, np.float32), "small"), numpy_helper.from_array(np.array(1e-10, np.float32), "eps"),
             numpy_helper.from_array((rng.standard_normal((64, 16)) * 0.1).astype(np.float32), "W")]
    nodes = [helper.make_node("Mul", ["x", "small"], ["s"], name="shrink"), helper.make_node("Mul", ["s", "s"], ["p"], name="square"),
             helper.make_node("Add", ["p", "eps"], ["pe"], name="add_eps"), helper.make_node("Log", ["pe"], ["l"], name="log"),
             helper.make_node("MatMul", ["l", "W"], ["y"], name="proj")]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "tiny.onnx"))
    proc = run_cli("compile", tmp_path / "tiny.onnx", "-o", tmp_path / "out", "--ep", "qnn", "--partition", "1KB")
    assert proc.returncode == 1, proc.stderr
    line = assert_one_line_error(proc.stderr, "part tiny.part00.onnx: tiny.part00.onnx: not published: output 'l' differs")
    assert "first diverging node: 'log'" in line and "--cpu-nodes log" in line and "Error:" not in line
    assert "--fallback auto" not in line  # (refused with --partition)
    assert not (tmp_path / "out").exists()


def test_the_parts_plan_split_keeps_is_the_one_stitch_reads(chain: Path, tmp_path: Path) -> None:
    """split makes its parts plan as a record and writes it (no read-back): the record must be what the one reader
    (PartsPlan.load, every field checked) reads from the file, for `ortcompile split` (digests, each part's files)
    and for --partition's own plan (linked parts: no digests, no part files)."""
    from ortcompile.compile.partsplan import PartsPlan
    from ortcompile.compile.split import split_model, split_to
    from ortcompile.options import CompileOptions, PartitionOptions
    from ortcompile.plan.planner import plan_source

    options = CompileOptions(ep="qnn", partition=PartitionOptions(BUDGET_BYTES))
    published_split = split_to(chain, tmp_path / "split", options)
    assert published_split.parts_plan.digest.files and published_split.parts_plan.part_files
    assert PartsPlan.load(published_split.plan_file) == published_split.parts_plan
    (tmp_path / "own").mkdir()
    own = split_model(plan_source(chain, options), tmp_path / "own", BUDGET_BYTES, link_sources=True)
    assert not own.parts_plan.digest.files and own.parts_plan.part_files is None and len(own.parts) == 5
    assert PartsPlan.load(own.plan_file, internal=True) == own.parts_plan


def test_parts_at_once_default_to_the_cpus_this_process_may_run_on() -> None:
    """Without --jobs, parts compile as many at once as the CPUs the process may run on (`taskset`, a cpuset,
    pytest -n's share), not os.cpu_count(): two QNN compiles on one allowed CPU only take turns, at twice the memory."""
    from ortcompile.compile.partpool import default_jobs

    found: list[int] = []

    def on_one_cpu() -> None:  # a thread's affinity is its own: pytest's thread keeps its CPUs
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        found.append(default_jobs())

    thread = threading.Thread(target=on_one_cpu)
    thread.start()
    thread.join()
    assert found == [1]
    assert default_jobs() == len(os.sched_getaffinity(0))
