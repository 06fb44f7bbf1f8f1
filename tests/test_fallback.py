"""When the NPU computes something else (issue 21): the refusal names the diverging node and the next step;
`--fallback auto` and `--cpu-nodes` move nodes to the CPU EP and publish a model that is correct on realistic inputs.

Real QNN (HTP simulator, fp16) against the CPU EP. Each model passes the check on generated white noise and fails it
on realistic inputs (tests/fp16models.py): the ending must be published-and-correct or refused-naming-the-node, never
published-and-wrong. Correct is judged as an app sees it: the published model in plain onnxruntime on QNN, against
the source on the CPU EP, on realistic inputs the compile never saw (other seeds), by verify's fp16 SNR (20 dB).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fp16models import gem_model, log_frontend_model, save_npy, small_images, tones_over_silence
from genmodels import run_cli
from helpers import cpu_session, qnn_session

FP16_SNR_DB = 20.0  # verify's fp16 criterion (readback/criteria.py)


def _snr_db(got: np.ndarray, want: np.ndarray) -> float:
    noise = float(np.sum((got.astype(np.float64) - want) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(want.astype(np.float64) ** 2)) / noise)


def _published_snr(model: Path, source: Path, inputs: list[np.ndarray]) -> float:
    """Worst SNR of the published model (plain onnxruntime on QNN) against the source on the CPU EP."""
    compiled, reference = qnn_session(model), cpu_session(source)
    return min(_snr_db(compiled.run(None, {"x": x})[0], reference.run(None, {"x": x})[0]) for x in inputs)


def _manifest(out: Path, stem: str) -> dict:
    return json.loads((out / f"{stem}_ctx.manifest.json").read_text())


@pytest.fixture(scope="module")
def frontend(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("frontend")
    return log_frontend_model(directory / "frontend.onnx"), save_npy(directory / "tones.npy", tones_over_silence(0))


@pytest.fixture(scope="module")
def gem(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("gem")
    return gem_model(directory / "gem.onnx"), save_npy(directory / "images.npy", small_images(0))


def test_refused_by_default_naming_the_node_and_the_next_step(frontend: tuple[Path, Path], tmp_path: Path) -> None:
    model, tones = frontend
    result = run_cli("compile", model, "-o", tmp_path / "out", "--ep", "qnn", "--input", f"x={tones}", "-v")
    assert result.returncode == 1, result.stderr
    error = next(line for line in result.stderr.splitlines() if line.startswith("ortcompile: error:"))
    assert "not published" in error and "first diverging node: 'log' (Log on QNN" in error
    assert "--fallback auto" in error and "--cpu-nodes log" in error
    # the fp16 lint warned before the compile, naming the node
    assert "warning: frontend.onnx: fp16: log (Log)" in result.stderr and "[tiny-epsilon]" in result.stderr
    assert not (tmp_path / "out" / "frontend_ctx.onnx").exists()
    # -v: the node-by-node table
    assert "  DIFF log (Log, QNN): SNR" in result.stderr and "  ok   square (Mul, QNN)" in result.stderr


def test_refusal_json_carries_the_divergence_table(frontend: tuple[Path, Path], tmp_path: Path) -> None:
    model, tones = frontend
    result = run_cli("compile", model, "-o", tmp_path / "out", "--ep", "qnn", "--input", f"x={tones}", "--json")
    assert result.returncode == 1
    error = json.loads(result.stdout)["error"]
    assert "first diverging node: 'log'" in error["message"]
    table = error["fallback"]["divergence"][0]
    assert [r["node"] for r in table["first"]] == ["log"]
    assert {r["node"]: r["ok"] for r in table["rows"]}["square"] is True and {r["node"]: r["ok"] for r in table["rows"]}["log"] is False
    assert error["fallback"]["worst_snr_db_before"] < FP16_SNR_DB


def test_quiet_keeps_the_lint_warning_and_drops_the_rest(frontend: tuple[Path, Path], tmp_path: Path) -> None:
    """-q hides progress, never a warning (cli.md): with --check load this model is published wrong, and the lint
    line is the only thing that says so."""
    model, _ = frontend
    result = run_cli("-q", "compile", model, "-o", tmp_path / "out", "--ep", "qnn", "--check", "load")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["ortcompile: warning: frontend.onnx: fp16: log (Log): Log of (Add 1e-10): 1e-10 is below "
                                          "fp16's smallest normal 6.1e-05 (flushed to 0 on an fp16 EP: the guard is gone) [tiny-epsilon]"]


def test_log_frontend_fallback_auto_publishes_a_correct_model(frontend: tuple[Path, Path], tmp_path: Path) -> None:
    model, tones = frontend
    out = tmp_path / "out"
    result = run_cli("compile", model, "-o", out, "--ep", "qnn", "--input", f"x={tones}", "--fallback", "auto")
    assert result.returncode == 0, result.stderr
    assert "moved to the CPU EP: Add, Log, Mul (--fallback auto, 1 round); 3 nodes in 1 CPU partition; check worst SNR" in result.stdout
    record = _manifest(out, "frontend")["cpu_nodes"]
    assert record["op_types"] == ["Add", "Log", "Mul"] and record["nodes"] == ["square", "add_eps", "log"] and record["partitions"] == 1
    assert record["rounds"][0]["first"] == ["log"]
    assert record["worst_snr_db_before"] < FP16_SNR_DB <= record["worst_snr_db_after"]
    realistic = [tones_over_silence(seed) for seed in (1, 2, 3)]
    assert _published_snr(out / "frontend_ctx.onnx", model, realistic) >= FP16_SNR_DB
    noise = [np.random.default_rng(seed).standard_normal((1, 64, 128)).astype(np.float32) for seed in (4, 5)]
    assert _published_snr(out / "frontend_ctx.onnx", model, noise) >= FP16_SNR_DB


def test_gem_pooling_fallback_auto_from_the_config_file(gem: tuple[Path, Path], tmp_path: Path) -> None:
    model, images = gem
    out = tmp_path / "out"
    config = tmp_path / "ortcompile.toml"
    config.write_text('fallback = "auto"\n')
    result = run_cli("compile", model, "-o", out, "--ep", "qnn", "--input", f"x={images}", "--config", config)
    assert result.returncode == 0, result.stderr
    manifest = _manifest(out, "gem")
    record = manifest["cpu_nodes"]
    assert manifest["options"]["fallback"] == "auto"
    assert record["op_types"] == ["Pow", "ReduceMean"] and record["nodes"] == ["gem_pow", "gem_mean", "gem_root"]
    assert record["rounds"][0]["first"] == ["gem_pow"]
    assert record["worst_snr_db_before"] < FP16_SNR_DB <= record["worst_snr_db_after"]
    assert _published_snr(out / "gem_ctx.onnx", model, [small_images(seed) for seed in (1, 2, 3)]) >= FP16_SNR_DB


def test_cpu_nodes_by_op_type_name_and_glob(frontend: tuple[Path, Path], tmp_path: Path) -> None:
    model, tones = frontend
    out = tmp_path / "out"
    result = run_cli("compile", model, "-o", out, "--ep", "qnn", "--input", f"x={tones}",
                     "--cpu-nodes", "op:Log", "--cpu-nodes", "add_eps", "--cpu-nodes", "squ*")
    assert result.returncode == 0, result.stderr
    assert "moved to the CPU EP: Add, Log, Mul (--cpu-nodes); 3 nodes in 1 CPU partition" in result.stdout
    manifest = _manifest(out, "frontend")
    assert manifest["options"]["cpu_nodes"] == ["op:Log", "add_eps", "squ*"]
    assert manifest["cpu_nodes"]["requested"] == ["op:Log", "add_eps", "squ*"] and manifest["cpu_nodes"]["rounds"] == []
    assert _published_snr(out / "frontend_ctx.onnx", model, [tones_over_silence(seed) for seed in (1, 2)]) >= FP16_SNR_DB


def test_cpu_nodes_naming_no_node_is_a_usage_error(frontend: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = frontend
    result = run_cli("compile", model, "-o", tmp_path / "out", "--ep", "qnn", "--cpu-nodes", "logg")
    assert result.returncode == 2
    assert "--cpu-nodes logg: no node of frontend.onnx matches" in result.stderr


def test_bad_fallback_in_the_config_names_the_key(frontend: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = frontend
    config = tmp_path / "ortcompile.toml"
    config.write_text('fallback = "sometimes"\n')
    result = run_cli("compile", model, "-o", tmp_path / "out", "--ep", "qnn", "--config", config)
    assert result.returncode == 2 and "fallback" in result.stderr


def test_a_user_pin_too_narrow_is_widened_over_rounds(frontend: tuple[Path, Path], tmp_path: Path) -> None:
    """`--cpu-nodes log` alone makes it worse (the EP flushes the epsilon before the CPU's Log: -inf); --fallback auto
    then moves what feeds the CPU node (Add), then the lint pattern's rest (Mul), and publishes a correct model."""
    model, tones = frontend
    out = tmp_path / "out"
    result = run_cli("compile", model, "-o", out, "--ep", "qnn", "--input", f"x={tones}", "--cpu-nodes", "log", "--fallback", "auto", "-v")
    assert result.returncode == 0, result.stderr
    assert "(on the CPU EP already" not in result.stderr  # published: no refusal
    assert "fallback: moving Add to the CPU EP" in result.stderr and "fallback: moving Mul to the CPU EP" in result.stderr
    record = _manifest(out, "frontend")["cpu_nodes"]
    assert [r["op_types"] for r in record["rounds"]] == [["Log"], ["Add", "Log"]]
    assert record["op_types"] == ["Add", "Log", "Mul"] and record["requested"] == ["log"]
    assert _published_snr(out / "frontend_ctx.onnx", model, [tones_over_silence(seed) for seed in (1, 2)]) >= FP16_SNR_DB


def test_fallback_auto_needs_a_check_that_runs(frontend: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = frontend
    result = run_cli("compile", model, "-o", tmp_path / "out", "--ep", "qnn", "--fallback", "auto", "--check", "load")
    assert result.returncode == 2 and "--fallback auto" in result.stderr and "--check load" in result.stderr


def test_fallback_auto_with_partition_is_refused_before_any_work(frontend: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = frontend
    result = run_cli("compile", model, "-o", tmp_path / "out", "--ep", "qnn", "--fallback", "auto", "--partition", "auto")
    assert result.returncode == 2 and "--partition" in result.stderr
    assert not (tmp_path / "out").exists()


def test_python_api_fallback_auto_result(gem: tuple[Path, Path], tmp_path: Path) -> None:
    from ortcompile import CompileOptions, compile_model
    from ortcompile.errors import OrtCompileWarning
    from ortcompile.readback.given import Given

    model, images = gem
    with pytest.warns(OrtCompileWarning, match=r"gem_pow \(Pow\): GeM pooling"):  # the lint, before the compile
        result = compile_model(model, tmp_path / "out", CompileOptions(ep="qnn", fallback="auto", inputs={"x": Given(np.load(images))}))
    assert result.fallback is not None and result.fallback["op_types"] == ["Pow", "ReduceMean"]
    assert result.fallback["summary"].startswith("moved to the CPU EP: Pow, ReduceMean (--fallback auto, 1 round)")
    assert result.fallback["divergence"][0]["first"][0]["node"] == "gem_pow"
