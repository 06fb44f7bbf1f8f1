"""`ortcompile verify` and `ortcompile compile --verify`: a compiled model must compute what its source computes.

The compiled outputs come from the real compiler (QNN's HTP simulator, which computes in fp16 for the default
target, and is therefore judged by the fp16 parity criterion; the CPU EP, judged by the fp32 tolerance, where a
test needs symbolic dims to survive compilation). Damage is real too: bytes flipped in data files, ops swapped in
the graph, files truncated or deleted. Each test asserts exit codes, the one-line error, and the numbers in the
JSON report. User inputs, the criteria's options and run-time EP failures: tests/test_verify_inputs.py; the
real-model corpus: tests/test_verify_real_models.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import CliResult, published, run_cli, without_progress
from onnx import numpy_helper

from ortcompile.readback.feeds import make_feeds, read_hints, specs_from_session
from ortcompile.readback.nextsteps import next_steps

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"

# QNN (HTP simulator, compiling for the default X Elite target: float16 arithmetic as on the device) against the
# CPU EP, measured on the fixtures: max abs diff 3.3e-4 .. 8.6e-4 (outputs up to ~2.9), SNR 63.7 .. 67.8 dB.
# Never exactly 0 on generated inputs, which is what makes `--precision fp32 --rtol 0 --atol 0` a real,
# reproducible verification failure. 5e-3 is 6x the worst seen.
QNN_NOISE_BOUND = 5e-3

TOP_KEYS = {"format", "ok", "compiled", "reference", "reference_note", "ep", "criterion", "integrity", "dims", "guessed_dims", "inputs",
            "session_seconds", "load_speedup", "runs", "input_sets", "warning", "divergence", "failure"}
CRITERION_KEYS = {"kind", "precision", "purpose", "rtol", "atol", "min_snr_db", "min_psnr_db", "min_cosine", "min_top1",
                  "min_equal_fraction", "why", "describe"}
INTEGRITY_KEYS = {"path", "found", "hashed", "ok", "problems", "files", "referenced_files_problems"}
INTEGRITY_FILE_KEYS = {"name", "role", "size", "actual_size", "sha256_ok", "status"}
RUN_KEYS = {"seed", "set", "outputs"}
VERIFY_NEXT = "; " + next_steps("verify")  # every failed verify ends with what to do next
VERIFY_NEXT_CPU = "; " + next_steps("verify", can_pin=False)  # the CPU EP cannot keep nodes off it: no --cpu-nodes/--fallback
OUTPUT_KEYS = {"name", "shape", "dtype", "max_abs", "max_rel", "mismatches", "total", "reason", "ok",
               "criterion", "exact", "snr_db", "psnr_db", "cosine", "top1", "top1_rows", "topk", "nonfinite", "note"}

# The default criteria, as the report gives them (readback/criteria.py; the numbers are explained in docs/verify.md).
FP16_WHY = "the EP computes in fp16: correct outputs differ from the fp32 CPU reference by fp16 rounding; release gate"
FP16_CRITERION = {
    "kind": "parity", "precision": "fp16", "purpose": "verify", "rtol": 0.05, "atol": 0.005, "min_snr_db": 20.0, "min_psnr_db": None,
    "min_cosine": 0.995, "min_top1": 1.0, "min_equal_fraction": 0.99, "why": FP16_WHY,
    "describe": ("parity: every element within rtol=0.05 atol=0.005, else SNR >= 20 dB, cosine >= 0.995, decisive top-1 agreement >= 1; "
                 f"integers equal on >= 0.99 of elements (fp16 verify: {FP16_WHY})"),
}
FP32_WHY = "the EP computes in fp32: it differs from the CPU EP by summation order only; release gate"
FP32_CRITERION = {
    "kind": "tolerance", "precision": "fp32", "purpose": "verify", "rtol": 0.001, "atol": 0.0001, "min_snr_db": None, "min_psnr_db": None,
    "min_cosine": None, "min_top1": None, "min_equal_fraction": 1.0, "why": FP32_WHY,
    "describe": f"tolerance: every element within rtol=0.001 atol=0.0001 (fp32 verify: {FP32_WHY})",
}


# ---------------------------------------------------------------- helpers


def run(*args: object) -> CliResult:
    """In this process (CliRunner): verify's and compile's sessions run in their own worker children anyway."""
    return run_cli(*args)


def verify_json(model: Path, reference: Path, *extra: object, code: int = 0) -> dict:
    proc = run("verify", model, "--reference", reference, "--json", *extra)
    assert proc.returncode == code, proc.stderr
    return json.loads(proc.stdout)


def compile_to(source: Path, out: Path, *extra: object) -> Path:
    proc = run("compile", source, "-o", out, "-q", *extra)
    assert proc.returncode == 0, proc.stderr
    return out / f"{source.stem}_ctx.onnx"


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refresh_manifest(model: Path) -> None:
    """Record the current size and sha256 of every listed file: the tampering is invisible to integrity."""
    path = model.with_name(model.name[: -len(".onnx")] + ".manifest.json")
    manifest = json.loads(path.read_text())
    for entry in manifest["files"]:
        target = model.parent / entry["name"]
        entry["size"], entry["sha256"] = target.stat().st_size, sha256_of(target)
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def error_line(proc: CliResult) -> str:
    """The one line ortcompile prints on failure (native libraries may log other lines; no traceback)."""
    assert "Traceback" not in proc.stderr
    errors = [line for line in without_progress(proc.stderr) if line.startswith("ortcompile: error")]  # (progress, warnings aside)
    assert len(errors) == 1, proc.stderr
    return errors[0]


def copy_output(model: Path, tmp_path: Path) -> Path:
    target = tmp_path / model.parent.name
    shutil.copytree(model.parent, target)
    return target / model.name


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("verify-built")
    unchecked = ("--check", "none")  # what these tests run is verify itself, on every output
    return {
        "mlp": compile_to(FIXTURES / "mlp.onnx", base / "mlp", *unchecked),  # 1 EPContext node, blob embedded
        "split": compile_to(FIXTURES / "split.onnx", base / "split", "--embed", "never", *unchecked),  # 3 nodes, a _qnn blob, W_mod in .data
        "dynamic": compile_to(FIXTURES / "dynamic.onnx", base / "dynamic", "--fix-dim", "batch=1", *unchecked),
        "dynamic_cpu": compile_to(FIXTURES / "dynamic.onnx", base / "dynamic_cpu", "--ep", "cpu", *unchecked),  # 'batch' stays symbolic
        "mixed_cpu": compile_to(FIXTURES / "mixed.onnx", base / "mixed_cpu", "--ep", "cpu", *unchecked),  # 'n' stays symbolic
    }


# ---------------------------------------------------------------- good outputs pass


@pytest.mark.parametrize("name", ["mlp", "split", "dynamic"])
def test_good_qnn_outputs_pass(built: dict[str, Path], name: str) -> None:
    model, source = built[name], FIXTURES / f"{name}.onnx"
    report = verify_json(model, source)
    assert report["ok"] is True and report["failure"] == ""
    assert (report["compiled"], report["reference"], report["ep"]) == (str(model), str(source), "QNNExecutionProvider")
    assert report["criterion"] == FP16_CRITERION  # QNN's HTP computes in float16: the fp16 parity criterion
    integrity = report["integrity"]
    assert (integrity["found"], integrity["hashed"], integrity["ok"], integrity["problems"]) == (True, True, True, [])
    assert integrity["referenced_files_problems"] == []
    assert all(f["sha256_ok"] is True and f["status"] == "ok" for f in integrity["files"])

    [run_] = report["runs"]
    [out] = run_["outputs"]
    assert run_["seed"] == 0
    assert (out["name"], out["shape"], out["dtype"], out["total"], out["mismatches"], out["ok"], out["reason"]) == (
        "y", [1, 256], "float32", 256, 0, True, "")
    assert 0 < out["max_abs"] < QNN_NOISE_BOUND  # the simulator really ran: not bit-identical to the CPU EP
    assert 0 < out["max_rel"] < 0.1  # float16 on the HTP: measured 0.030 .. 0.086, on elements near zero
    assert (out["criterion"], out["exact"], out["nonfinite"], out["note"]) == ("parity", False, 0, "")
    assert 60 < out["snr_db"] < 75 and out["psnr_db"] > out["snr_db"]  # measured 65.7 .. 67.8 dB: fp16 rounding
    assert 0.99999 < out["cosine"] < 1
    # seed 0's single row is a near-tie for its winner (no decisive row): top-1 is null, the top-5 sets agree
    assert (out["top1"], out["top1_rows"], out["topk"]) == (None, 0, 1.0)

    seconds = report["session_seconds"]
    assert set(seconds) == {"compiled", "source_on_ep", "source_on_cpu"}
    assert all(value > 0 for value in seconds.values())
    # source_on_ep / compiled, from the unrounded times: within what rounding both to 1 ms (and the ratio to 0.01) allows
    on_ep, compiled = seconds["source_on_ep"], seconds["compiled"]
    assert (on_ep - 5e-4) / (compiled + 5e-4) - 0.005 <= report["load_speedup"] <= (on_ep + 5e-4) / (compiled - 5e-4) + 0.005
    assert report["dims"] == ({"batch": 1} if name == "dynamic" else {})  # dynamic: the compile's pin, not a guess
    assert (report["guessed_dims"], report["inputs"]) == ({}, [])  # float inputs, no guess: nothing to say


def test_json_schema_keys_are_exactly_the_documented_ones(built: dict[str, Path]) -> None:
    report = verify_json(built["split"], FIXTURES / "split.onnx", "--runs", "2")
    assert set(report) == TOP_KEYS
    assert report["format"] == "ortcompile-verify/2"
    assert set(report["criterion"]) == CRITERION_KEYS
    assert set(report["integrity"]) == INTEGRITY_KEYS
    assert report["integrity"]["files"] and all(set(f) == INTEGRITY_FILE_KEYS for f in report["integrity"]["files"])
    assert len(report["runs"]) == 2 and all(set(r) == RUN_KEYS for r in report["runs"])
    assert all(set(o) == OUTPUT_KEYS for r in report["runs"] for o in r["outputs"])
    assert set(report["session_seconds"]) == {"compiled", "source_on_ep", "source_on_cpu"}


def test_text_report(built: dict[str, Path]) -> None:
    proc = run("verify", built["split"], "--reference", FIXTURES / "split.onnx")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "integrity  ok: 3 files, sizes and sha256"
    assert lines[1].startswith("load       compiled ") and " on QNNExecutionProvider, source " in lines[1] and "on the same EP" in lines[1]
    assert lines[2] == f"criterion  {FP16_CRITERION['describe']}"  # which criterion applied, and why
    assert re.fullmatch(r"output     y seed=0: ok, max abs [0-9.e-]+, 0/256 outside tolerance, SNR \d\d\.\d dB, cosine 1\.00000", lines[3]), lines[3]
    assert lines[4:] == ["result     ok"]
    quiet = run("verify", built["split"], "--reference", FIXTURES / "split.onnx", "-q")
    assert (quiet.returncode, quiet.stdout) == (0, "")


def test_no_time_source_skips_the_source_on_ep_session(built: dict[str, Path]) -> None:
    report = verify_json(built["mlp"], FIXTURES / "mlp.onnx", "--no-time-source")
    assert report["ok"] is True
    assert set(report["session_seconds"]) == {"compiled", "source_on_cpu"}
    assert report["load_speedup"] is None


def test_ep_defaults_to_the_one_in_the_manifest(built: dict[str, Path]) -> None:
    """Compiled with --ep cpu: verified on the CPU EP though --ep auto would pick QNN here."""
    report = verify_json(built["dynamic_cpu"], FIXTURES / "dynamic.onnx")
    assert report["ep"] == "CPUExecutionProvider" and report["ok"] is True
    assert report["criterion"] == FP32_CRITERION  # the CPU EP computes in fp32: today's tolerance
    [out] = report["runs"][0]["outputs"]
    assert (out["max_abs"], out["exact"], out["criterion"]) == (0.0, True, "tolerance")  # same EP, same weights: bit-identical
    assert out["snr_db"] is None and out["psnr_db"] is None  # exact: +inf, which JSON cannot hold
    # The source is not loaded a second time on the CPU EP just to time it: comparing two CPU loads means nothing.
    assert set(report["session_seconds"]) == {"compiled", "source_on_cpu"}
    assert report["load_speedup"] is None


def test_ep_that_cannot_run_the_epcontext_nodes_fails_clearly(built: dict[str, Path]) -> None:
    proc = run("verify", built["split"], "--reference", FIXTURES / "split.onnx", "--ep", "cpu")
    assert proc.returncode == 1  # a session that cannot be created is no verdict on the outputs: not exit 5
    line = error_line(proc)
    assert line.startswith("ortcompile: error: the compiled split_ctx.onnx: session creation failed: EPContext node generated by 'QNNExecutionProvider'")
    assert "internal error" not in proc.stderr


# ---------------------------------------------------------------- wrong outputs fail with exit 5


def _split_input_seed0() -> np.ndarray:
    """The input verify generates for seed 0 (from the compiled model's inputs, which are the source's here)."""
    session = ort.InferenceSession(str(FIXTURES / "split.onnx"), providers=["CPUExecutionProvider"])
    return make_feeds(specs_from_session(session), seed=0, hints=read_hints(FIXTURES / "split.onnx")).arrays["x"]


def test_flipped_weight_byte_in_data_file_fails_with_exit_5(built: dict[str, Path], tmp_path: Path) -> None:
    """W_mod (the divisor of the CPU-side Mod) lives in split_ctx.<digest>.data. Flip one exponent bit of the
    element that matters most for seed 0's input, update the manifest so integrity passes: only the
    output comparison can catch it."""
    model = copy_output(built["split"], tmp_path)
    source = onnx.load_model(str(FIXTURES / "split.onnx"))
    weights = {t.name: numpy_helper.to_array(t) for t in source.graph.initializer}
    b = np.maximum(_split_input_seed0() @ weights["W1"], 0)
    k = int(np.argmax(np.fmod(b, weights["W_mod"])[0]))  # the element whose Mod result is largest
    assert np.fmod(b, weights["W_mod"])[0, k] > 0.1

    proto = onnx.load_model(str(model), load_external_data=False)
    tensor = next(t for t in proto.graph.initializer if t.name == "W_mod")
    fields = {e.key: e.value for e in tensor.external_data}
    data = model.parent / fields["location"]
    position = int(fields.get("offset", 0)) + 4 * k + 3  # little-endian float32: byte 3 holds sign and exponent
    raw = bytearray(data.read_bytes())
    raw[position] ^= 0x40 if raw[position] & 0x40 else 0x20  # clears a high exponent bit: the value becomes tiny
    data.write_bytes(bytes(raw))
    flipped = np.frombuffer(bytes(raw[position - 3 : position + 1]), dtype="<f4")[0]
    assert weights["W_mod"][0, k] >= 0.5 and abs(flipped) < 1e-10
    refresh_manifest(model)

    proc = run("verify", model, "--reference", FIXTURES / "split.onnx", "--json")
    assert proc.returncode == 5
    report = json.loads(proc.stdout)
    assert report["integrity"]["ok"] is True  # the manifest was updated: integrity cannot see the change
    assert report["ok"] is False and report["criterion"] == FP16_CRITERION
    [out] = report["runs"][0]["outputs"]
    # measured 198/256 outside the fp16 escape, max abs 0.154, SNR 12.5 dB (correct: 65.7 dB), cosine 0.9715
    assert out["ok"] is False and out["mismatches"] > 100 and out["max_abs"] > 0.05
    assert out["snr_db"] < 15 and out["cosine"] < 0.99
    line = error_line(proc)
    assert line.startswith(f"ortcompile: error: output 'y' differs from the source on the CPU EP (seed 0): SNR {out['snr_db']:.1f} dB < 20 dB; "
                           f"max abs diff {out['max_abs']:.3g}, {out['mismatches']}/256 elements outside rtol=0.05 atol=0.005; ")
    # localized on the source (tests/test_verify_localize.py): the EP computes it right, the compiled file is what differs
    assert "every node agrees on the EP with the CPU EP" in line and "next: compile it again from the source" in line
    # Judged as an fp32 EP, the same change fails on every element, as verify always reported it.
    fp32 = run("verify", model, "--reference", FIXTURES / "split.onnx", "--precision", "fp32", "--no-time-source")
    assert fp32.returncode == 5
    assert error_line(fp32) == ("ortcompile: error: output 'y' differs from the source on the CPU EP (seed 0): "
                                f"256/256 elements outside rtol=0.001 atol=0.0001, max abs diff {out['max_abs']:.3g}{VERIFY_NEXT}")


def test_changed_op_in_compiled_graph_fails_with_exit_5(built: dict[str, Path], tmp_path: Path) -> None:
    """The CPU-side Sinh becomes Cosh in the compiled graph (manifest updated): every output element moves."""
    model = copy_output(built["split"], tmp_path)
    proto = onnx.load_model(str(model), load_external_data=False)
    [node] = [n for n in proto.graph.node if n.op_type == "Sinh"]
    node.op_type = "Cosh"
    onnx.save_model(proto, str(model))
    refresh_manifest(model)

    proc = run("verify", model, "--reference", FIXTURES / "split.onnx", "--json")
    assert proc.returncode == 5
    report = json.loads(proc.stdout)
    assert report["integrity"]["ok"] is True
    [out] = report["runs"][0]["outputs"]
    assert out["mismatches"] > 200 and out["max_abs"] > 0.1
    assert out["snr_db"] < 10 and out["cosine"] < 0.9  # another function: far from fp16 noise
    assert report["failure"] == error_line(proc).removeprefix("ortcompile: error: ")
    assert report["failure"].startswith("output 'y' differs from the source on the CPU EP (seed 0): SNR ")
    text = run("verify", model, "--reference", FIXTURES / "split.onnx")
    assert text.returncode == 5
    assert any(line.startswith("output     y seed=0: MISMATCH, max abs ") for line in text.stdout.splitlines())
    assert text.stdout.splitlines()[-1] == f"result     FAILED: {report['failure']}"


def test_int64_and_bool_outputs_are_compared_exactly(built: dict[str, Path], tmp_path: Path) -> None:
    """ArgMax -> ArgMin changes the int64 output, Greater -> Less the bool one; y and y16 stay equal."""
    model = copy_output(built["mixed_cpu"], tmp_path)
    proto = onnx.load_model(str(model), load_external_data=False)
    swaps = {"ArgMax": "ArgMin", "Greater": "Less"}
    for node in proto.graph.node:
        node.op_type = swaps.get(node.op_type, node.op_type)
    onnx.save_model(proto, str(model))
    refresh_manifest(model)

    proc = run("verify", model, "--reference", FIXTURES / "mixed.onnx", "--json")
    assert proc.returncode == 5, proc.stderr
    outputs = {o["name"]: o for o in json.loads(proc.stdout)["runs"][0]["outputs"]}
    assert {n: o["dtype"] for n, o in outputs.items()} == {"y": "float32", "y16": "float16", "top": "int64", "pos": "bool"}
    assert outputs["y"]["ok"] and outputs["y16"]["ok"] and outputs["y"]["exact"]
    assert (outputs["top"]["mismatches"], outputs["top"]["total"]) == (1, 1) and outputs["top"]["max_abs"] >= 1
    assert 0 < outputs["pos"]["mismatches"] <= 16 and outputs["pos"]["max_abs"] == 1.0
    assert not outputs["top"]["exact"] and outputs["top"]["snr_db"] is None  # integers: equal or not, no metrics
    assert error_line(proc) == f"ortcompile: error: output 'top' differs from the source on the CPU EP (seed 0): 1/1 elements differ{VERIFY_NEXT_CPU}"
    # Judged as fp16 parity, integer outputs may differ on at most 1% of their elements: one of one still fails.
    fp16 = run("verify", model, "--reference", FIXTURES / "mixed.onnx", "--precision", "fp16")
    assert fp16.returncode == 5
    assert error_line(fp16) == ("ortcompile: error: output 'top' differs from the source on the CPU EP (seed 0): "
                                f"1/1 elements differ (at most 0.01 of them may){VERIFY_NEXT_CPU}")


def test_zero_tolerance_catches_qnn_float_noise(built: dict[str, Path]) -> None:
    """Judged as an fp32 EP (element by element), tolerance 0 makes QNN's fp16 rounding a mismatch."""
    report = verify_json(built["split"], FIXTURES / "split.onnx", "--precision", "fp32", "--rtol", "0", "--atol", "0", code=5)
    assert report["criterion"] == {**FP32_CRITERION, "rtol": 0.0, "atol": 0.0,
                                   "describe": f"tolerance: every element within rtol=0 atol=0 (fp32 verify: {FP32_WHY})"}
    [out] = report["runs"][0]["outputs"]
    assert out["mismatches"] > 100 and 0 < out["max_abs"] < QNN_NOISE_BOUND
    assert "outside rtol=0.0 atol=0.0" in report["failure"]
    # An absolute tolerance above the measured noise accepts the same output.
    assert verify_json(built["split"], FIXTURES / "split.onnx", "--precision", "fp32", "--rtol", "0", "--atol", str(QNN_NOISE_BOUND))["ok"] is True


def test_zero_tolerance_under_fp16_parity_leaves_snr_and_cosine_to_decide(built: dict[str, Path]) -> None:
    """Under QNN's own fp16 criterion rtol/atol are only the elementwise escape: with 0/0 every element is outside it,
    and the output still passes on SNR (65.7 dB) and cosine; a stricter --min-snr then fails it."""
    report = verify_json(built["split"], FIXTURES / "split.onnx", "--rtol", "0", "--atol", "0")
    [out] = report["runs"][0]["outputs"]
    assert (report["criterion"]["kind"], report["criterion"]["rtol"], report["criterion"]["atol"]) == ("parity", 0.0, 0.0)
    assert out["ok"] is True and out["mismatches"] == 256 and out["snr_db"] > 60
    strict = verify_json(built["split"], FIXTURES / "split.onnx", "--rtol", "0", "--atol", "0", "--min-snr", "90", code=5)
    [out] = strict["runs"][0]["outputs"]
    assert strict["failure"].startswith(f"output 'y' differs from the source on the CPU EP (seed 0): SNR {out['snr_db']:.1f} dB < 90 dB; "
                                        f"max abs diff {out['max_abs']:.3g}, 256/256 elements outside rtol=0 atol=0; first diverging node: ")


# ---------------------------------------------------------------- integrity first


@pytest.mark.parametrize(("victim", "cut"), [("split_ctx.onnx.data", 1000), ("split_ctx_qnn.bin", 4096)])
def test_truncated_file_fails_integrity_before_anything_runs(built: dict[str, Path], tmp_path: Path, victim: str, cut: int) -> None:
    model = copy_output(built["split"], tmp_path)
    victim = published(model.parent, victim)
    path = model.parent / victim
    size = path.stat().st_size
    os.truncate(path, size - cut if victim.endswith(".bin") else cut)
    now = path.stat().st_size
    proc = run("verify", model, "--reference", FIXTURES / "split.onnx", "--json")
    assert proc.returncode == 5
    report = json.loads(proc.stdout)
    assert report["integrity"]["ok"] is False
    assert report["session_seconds"] == {} and report["runs"] == []  # no session was opened
    assert (report["dims"], report["guessed_dims"], report["inputs"]) == ({}, {}, [])  # and no input was made
    assert next(f for f in report["integrity"]["files"] if f["name"] == victim)["status"] == f"size {now}, manifest says {size}"
    line = error_line(proc)
    assert line.startswith(f"ortcompile: error: integrity check failed: {victim}: size {now}, manifest says {size}")


def test_missing_file_fails_integrity(built: dict[str, Path], tmp_path: Path) -> None:
    model = copy_output(built["split"], tmp_path)
    data = published(model.parent, "split_ctx.onnx.data")
    (model.parent / data).unlink()
    proc = run("verify", model, "--reference", FIXTURES / "split.onnx")
    assert proc.returncode == 5
    line = error_line(proc)
    assert line.startswith(f"ortcompile: error: integrity check failed: {data}: missing")
    assert f"  problem  {data}: missing" in proc.stdout.splitlines()


def test_missing_file_without_manifest_fails_integrity(built: dict[str, Path], tmp_path: Path) -> None:
    model = copy_output(built["split"], tmp_path)
    blob = published(model.parent, "split_ctx_qnn.bin")
    (model.parent / blob).unlink()
    model.with_name("split_ctx.manifest.json").unlink()
    proc = run("verify", model, "--reference", FIXTURES / "split.onnx", "--json")
    assert proc.returncode == 5
    report = json.loads(proc.stdout)
    assert report["integrity"]["found"] is False and report["runs"] == []
    [problem] = report["integrity"]["referenced_files_problems"]
    assert problem.startswith(f"EP context file '{blob}' (node ") and problem.endswith(") is missing")
    assert error_line(proc) == f"ortcompile: error: integrity check failed: {problem}"


def test_same_size_corruption_fails_on_sha256(built: dict[str, Path], tmp_path: Path) -> None:
    model = copy_output(built["split"], tmp_path)
    blob = model.parent / published(model.parent, "split_ctx_qnn.bin")
    raw = bytearray(blob.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    blob.write_bytes(bytes(raw))
    proc = run("verify", model, "--reference", FIXTURES / "split.onnx", "--json")
    assert proc.returncode == 5
    entry = next(f for f in json.loads(proc.stdout)["integrity"]["files"] if f["name"] == blob.name)
    assert (entry["sha256_ok"], entry["status"]) == (False, "sha256 differs from the manifest")
    assert error_line(proc) == f"ortcompile: error: integrity check failed: {blob.name}: sha256 differs from the manifest"


def test_missing_model_or_reference_is_invalid_input(built: dict[str, Path], tmp_path: Path) -> None:
    absent = tmp_path / "absent_ctx.onnx"
    proc = run("verify", absent, "--reference", FIXTURES / "split.onnx")
    assert proc.returncode == 3 and error_line(proc) == f"ortcompile: error: {absent}: no such file"
    proc = run("verify", built["split"], "--reference", tmp_path / "absent.onnx")
    assert proc.returncode == 3 and error_line(proc) == f"ortcompile: error: {tmp_path / 'absent.onnx'}: no such file"


# ---------------------------------------------------------------- --seed, --runs, --dim, input dtypes


def test_runs_use_consecutive_seeds_and_each_seed_is_reproducible(built: dict[str, Path]) -> None:
    report = verify_json(built["split"], FIXTURES / "split.onnx", "--seed", "5", "--runs", "3")
    assert [r["seed"] for r in report["runs"]] == [5, 6, 7]
    by_seed = {r["seed"]: r["outputs"][0] for r in report["runs"]}
    alone = verify_json(built["split"], FIXTURES / "split.onnx", "--seed", "6", "--no-time-source")["runs"]
    assert [r["seed"] for r in alone] == [6]
    assert alone[0]["outputs"][0] == by_seed[6]  # same seed, same inputs, same numbers
    # Different seeds feed different inputs: the QNN-vs-CPU noise lands differently (measured 3.6e-7 vs 2.4e-7).
    assert by_seed[5]["max_abs"] != by_seed[6]["max_abs"] or by_seed[5]["max_rel"] != by_seed[6]["max_rel"]
    assert run("verify", built["split"], "--reference", FIXTURES / "split.onnx", "--runs", "0").returncode == 2


def test_dynamic_compiled_with_fixed_batch_reports_the_dims_it_used(built: dict[str, Path]) -> None:
    """Compiled with --fix-dim batch=1: verify pins batch=1 in every session (the source on QNN compiles too)
    and reports it, not as a guess; a --dim that contradicts the compiled shape is a usage error, not a 'mismatch'.
    --fix-dim, verify's old name for --dim, still works (hidden)."""
    for flag in ("--dim", "--fix-dim"):
        report = verify_json(built["dynamic"], FIXTURES / "dynamic.onnx", flag, "batch=1")
        assert (report["dims"], report["guessed_dims"]) == ({"batch": 1}, {})
    lines = run("verify", built["dynamic"], "--reference", FIXTURES / "dynamic.onnx").stdout.splitlines()
    assert "dims       batch=1 (--dim to set)" in lines

    for flag in ("--dim", "--fix-dim"):
        proc = run("verify", built["dynamic"], "--reference", FIXTURES / "dynamic.onnx", flag, "batch=3")
        assert proc.returncode == 2
        assert error_line(proc) == "ortcompile: error: --dim batch=3 conflicts with the compiled model, which has batch=1 fixed"
    proc = run("verify", built["dynamic"], "--reference", FIXTURES / "dynamic.onnx", "--dim", "seq=3")
    assert proc.returncode == 2
    assert error_line(proc) == "ortcompile: error: --dim seq: the source has no symbolic dimension 'seq' (it has: batch)"


def test_dim_on_a_model_that_stayed_dynamic(built: dict[str, Path]) -> None:
    """Compiled with --ep cpu, 'batch' stayed symbolic and nothing pins it: verify guesses 1 (the leading axis) and
    says so; --dim sets it, and it is no longer a guess."""
    default = verify_json(built["dynamic_cpu"], FIXTURES / "dynamic.onnx")
    assert (default["dims"], default["guessed_dims"], default["inputs"]) == ({"batch": 1}, {"batch": 1}, ["guessed dims: batch=1"])
    assert default["runs"][0]["outputs"][0]["shape"] == [1, 256]
    lines = run("verify", built["dynamic_cpu"], "--reference", FIXTURES / "dynamic.onnx").stdout.splitlines()
    assert lines[1:3] == ["dims       batch=1 (guessed) (--dim to set)", "inputs     guessed dims: batch=1"]
    three = verify_json(built["dynamic_cpu"], FIXTURES / "dynamic.onnx", "--dim", "batch=3")
    assert (three["dims"], three["guessed_dims"], three["inputs"]) == ({"batch": 3}, {}, [])
    [out] = three["runs"][0]["outputs"]
    assert (out["shape"], out["total"], out["ok"]) == ([3, 256], 768, True)


MIXED_EDGE_NOTES = ["padded ids: idx: in-table ids, then id 0 (padding) from position 3 of 5", "input sets: seed 0, seed 1, padded ids"]
MIXED_NOTES = ["idx: uniform in [0, 8) (indices into Gather on 'table' (8 along axis 0))", "mask: all true (a bool input: nothing masked out)"]


def test_mixed_dtypes_verify_and_report_dims(built: dict[str, Path]) -> None:
    report = verify_json(built["mixed_cpu"], FIXTURES / "mixed.onnx", "--dim", "n=5", "--runs", "2")
    assert report["ok"] is True and (report["dims"], report["guessed_dims"]) == ({"n": 5}, {})
    assert report["inputs"] == [*MIXED_NOTES, *MIXED_EDGE_NOTES]  # how the generated integer and bool inputs were chosen
    assert report["input_sets"] == ["seed 0", "seed 1", "padded ids"]  # idx indexes a table: its padded ids are an edge set
    for run_ in report["runs"]:
        assert [(o["name"], o["dtype"], o["shape"]) for o in run_["outputs"]] == [
            ("y", "float32", [1, 16]), ("y16", "float16", [1, 16]), ("top", "int64", [1]), ("pos", "bool", [1, 16])]
    # n is the length of a rank-1 index input: a sequence, guessed 256 (feeds.SEQUENCE_EXTENT), and reported as a guess
    default = verify_json(built["mixed_cpu"], FIXTURES / "mixed.onnx")
    assert (default["dims"], default["guessed_dims"]) == ({"n": 256}, {"n": 256})
    assert default["inputs"] == ["guessed dims: n=256", *MIXED_NOTES, "padded ids: idx: in-table ids, then id 0 (padding) from position 128 of 256",
                                 "input sets: seed 0, padded ids"]


def test_generated_inputs_cover_every_fixture_dtype() -> None:
    session = ort.InferenceSession(str(FIXTURES / "mixed.onnx"), providers=["CPUExecutionProvider"])
    specs, hints = specs_from_session(session), read_hints(FIXTURES / "mixed.onnx")
    made = make_feeds(specs, seed=11, hints=hints)
    feeds = made.arrays
    assert (made.dims, made.guessed) == ({"n": 256}, {"n": 256})
    assert {k: (v.dtype, v.shape) for k, v in feeds.items()} == {
        "x": (np.dtype(np.float32), (1, 16)), "h": (np.dtype(np.float16), (1, 16)),
        "idx": (np.dtype(np.int64), (256,)), "mask": (np.dtype(np.bool_), (1, 16))}
    assert np.all(np.abs(feeds["x"]) <= 1) and np.all(np.abs(feeds["h"].astype(np.float32)) <= 1)

    feeds64 = make_feeds(specs, seed=11, dims={"n": 64}, hints=hints)
    assert (feeds64.dims, feeds64.guessed) == ({"n": 64}, {}) and feeds64.arrays["idx"].shape == (64,)
    assert set(np.unique(feeds64.arrays["idx"])) <= set(range(8))  # valid rows of the 8-row table, all of them used
    assert len(np.unique(feeds64.arrays["idx"])) > 4  # not the [0, 4) of inputs without a hint
    assert feeds64.arrays["mask"].all()  # a bool input: nothing masked out
    session.run(None, feeds64.arrays)  # the generated feeds are accepted by ONNX Runtime as they are

    again = make_feeds(specs, seed=11, hints=hints).arrays
    other = make_feeds(specs, seed=12, hints=hints).arrays
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)
    assert not np.array_equal(feeds["x"], other["x"])


# ---------------------------------------------------------------- compile --verify


def test_compile_verify_failure_publishes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run("compile", FIXTURES / "split.onnx", "-o", out, "--verify", "--precision", "fp32", "--rtol", "0", "--atol", "0")
    assert proc.returncode == 5
    line = error_line(proc)
    assert line.startswith("ortcompile: error: not published: output 'y' differs from the source on the CPU EP (seed 0): ")
    assert "outside rtol=0.0 atol=0.0" in line
    assert not out.exists()  # the failed run created it, and removed it again: nothing published, nothing left


def test_compile_verify_failure_keeps_the_previous_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    compile_to(FIXTURES / "split.onnx", out)  # blob embedded (--embed auto): no _qnn.<digest>.bin
    before = snapshot(out)
    assert not [n for n in before if "_qnn" in n]
    # A --force rebuild with --embed never would add split_ctx_qnn.<digest>.bin and change the model and manifest.
    proc = run("compile", FIXTURES / "split.onnx", "-o", out, "--force", "--embed", "never", "--verify", "--precision", "fp32", "--rtol", "0", "--atol", "0")
    assert proc.returncode == 5
    assert "not published" in error_line(proc)
    assert snapshot(out) == before
    assert verify_json(out / "split_ctx.onnx", FIXTURES / "split.onnx")["ok"] is True

    # Control: the same rebuild with a passing verification does replace it.
    proc = run("compile", FIXTURES / "split.onnx", "-o", out, "--force", "--embed", "never", "--verify", "-v")
    assert proc.returncode == 0, proc.stderr
    assert published(out, "split_ctx_qnn.bin") in snapshot(out) and snapshot(out) != before
    verified = [line for line in proc.stderr.splitlines() if line.startswith("ortcompile: verified: ")]
    assert len(verified) == 1 and "outputs match the source on the CPU EP (max abs diff " in verified[0]
    assert verified[0].endswith("; parity), in the pre-publish check (one comparison)")


def test_compile_verify_dynamic_with_fix_dim_publishes_a_verifiable_output(tmp_path: Path) -> None:
    proc = run("compile", FIXTURES / "dynamic.onnx", "-o", tmp_path, "--fix-dim", "batch=1", "--verify", "--json")
    assert proc.returncode == 0, proc.stderr
    [result] = json.loads(proc.stdout)["outputs"]
    assert result["epcontext_nodes"] == 1
    # one comparison, in the pre-publish check (by --verify's criterion): verify adds no second session pair
    assert result["check"]["mode"] == "run" and result["check"]["ok"] and result["timings"]["check"] > 0
    assert result["timings"]["verify"] == 0.0
    report = verify_json(tmp_path / "dynamic_ctx.onnx", FIXTURES / "dynamic.onnx")
    assert report["ok"] is True and (report["dims"], report["guessed_dims"]) == ({"batch": 1}, {})


# ---------------------------------------------------------------- outputs the compiled model lost or renamed


def _edit_outputs(model: Path, rename: dict[str, str], drop: set[str]) -> None:
    proto = onnx.load_model(str(model), load_external_data=False)
    for node in proto.graph.node:
        node.output[:] = [rename.get(o, o) for o in node.output]
    kept = [o for o in proto.graph.output if o.name not in drop]
    for output in kept:
        output.name = rename.get(output.name, output.name)
    del proto.graph.output[:]
    proto.graph.output.extend(kept)
    onnx.save_model(proto, str(model))
    refresh_manifest(model)


def test_compiled_model_missing_an_output_fails(built: dict[str, Path], tmp_path: Path) -> None:
    """A compiled model that computes fewer things is not the same model, even if what it computes matches."""
    model = copy_output(built["mixed_cpu"], tmp_path)
    _edit_outputs(model, {}, {"pos"})
    proc = run("verify", model, "--reference", FIXTURES / "mixed.onnx")
    assert proc.returncode == 5
    assert error_line(proc) == ("ortcompile: error: the compiled model has outputs ['top', 'y', 'y16'] "
                                "but the source has ['pos', 'top', 'y', 'y16']")


def test_renamed_output_fails_with_valid_json(built: dict[str, Path], tmp_path: Path) -> None:
    model = copy_output(built["mixed_cpu"], tmp_path)
    _edit_outputs(model, {"pos": "positive"}, set())
    proc = run("verify", model, "--reference", FIXTURES / "mixed.onnx", "--json")
    assert proc.returncode == 5
    report = json.loads(proc.stdout, parse_constant=lambda token: pytest.fail(f"not JSON: {token}"))
    assert report["ok"] is False
    assert "'pos'" in report["failure"] and "'positive'" in report["failure"]


def test_reshaped_output_is_reported_with_its_shapes(built: dict[str, Path], tmp_path: Path) -> None:
    """ArgMax keepdims 0 -> 1: 'top' becomes int64[1, 1]. Not comparable element by element: null diffs, a reason."""
    model = copy_output(built["mixed_cpu"], tmp_path)
    proto = onnx.load_model(str(model), load_external_data=False)
    [argmax] = [n for n in proto.graph.node if n.op_type == "ArgMax"]
    next(a for a in argmax.attribute if a.name == "keepdims").i = 1
    onnx.save_model(proto, str(model))
    refresh_manifest(model)
    proc = run("verify", model, "--reference", FIXTURES / "mixed.onnx", "--json")
    assert proc.returncode == 5
    report = json.loads(proc.stdout, parse_constant=lambda token: pytest.fail(f"not JSON: {token}"))
    top = next(o for o in report["runs"][0]["outputs"] if o["name"] == "top")
    assert (top["shape"], top["max_abs"], top["max_rel"], top["ok"]) == ([1, 1], None, None, False)
    assert top["reason"] == "the compiled model gives int64[1, 1], the source int64[1]"
    assert error_line(proc) == f"ortcompile: error: output 'top' differs from the source on the CPU EP (seed 0): {top['reason']}{VERIFY_NEXT_CPU}"


def test_docs_describe_every_json_key_and_option() -> None:
    """docs/verify.md is the schema's reference: a key or option added without documenting it fails here."""
    doc = (ROOT / "docs" / "verify.md").read_text()
    keys = (TOP_KEYS | CRITERION_KEYS | INTEGRITY_KEYS | INTEGRITY_FILE_KEYS | RUN_KEYS | OUTPUT_KEYS
            | {"compiled", "source_on_ep", "source_on_cpu"})
    undocumented = sorted(k for k in keys if f"`{k}`" not in doc and f'"{k}"' not in doc)
    assert undocumented == []
    help_options = run("verify", "--help").stdout.partition("Options:")[2]
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-z])\b", help_options))
    assert options >= {"--reference", "--seed", "--runs", "--dim", "--input", "--inputs", "--precision", "--rtol", "--atol", "--min-snr",
                       "--min-cosine", "--min-top1", "--no-time-source"}
    assert "--fix-dim" not in options  # hidden: the old name of --dim
    assert sorted(o for o in options | {"--fix-dim"} if f"`{o}" not in doc) == []
    # The defaults the doc gives for each precision are the ones the code applies.
    for criterion in (FP16_CRITERION, FP32_CRITERION):
        assert criterion["describe"].split(" (")[0] in doc
