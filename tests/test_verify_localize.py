"""`ortcompile verify` localizes its own failures (issue 21), as the pre-publish check does: a model published wrong
(compiled with --check load: nothing compared) fails verify on realistic inputs, and the failure names the first
diverging node of the source on the EP and the compile options that keep it off the EP; -v and --json carry the
node-by-node table.

Real QNN (HTP simulator, fp16) against the CPU EP, on the two fp16-fragile patterns of tests/fp16models.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fp16models import gem_model, log_frontend_model, save_npy, small_images, tones_over_silence
from helpers import run_cli

from ortcompile.readback.verify import verify_model


def _published_unchecked(model: Path, out: Path) -> Path:
    """What a user gets with --check load: published, never compared (the lint warns; nothing stops it)."""
    result = run_cli("-q", "compile", model, "-o", out, "--ep", "qnn", "--check", "load")
    assert result.returncode == 0, result.stderr
    return out / f"{model.stem}_ctx.onnx"


@pytest.fixture(scope="module")
def frontend(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    directory = tmp_path_factory.mktemp("frontend")
    model = log_frontend_model(directory / "frontend.onnx")
    return model, _published_unchecked(model, directory / "out"), save_npy(directory / "tones.npy", tones_over_silence(0))


def test_failed_verify_names_the_first_diverging_node_and_the_next_step(frontend: tuple[Path, Path, Path]) -> None:
    source, compiled, tones = frontend
    result = run_cli("verify", compiled, "--reference", source, "--input", f"x={tones}", "-v")
    assert result.returncode == 5, result.stderr
    error = next(line for line in result.stderr.splitlines() if line.startswith("ortcompile: error:"))
    assert error.startswith("ortcompile: error: output 'y' differs from the source on the CPU EP (seed 0): SNR ")
    assert "; first diverging node: 'log' (Log on QNN: SNR " in error
    assert "; next: compile with --fallback auto to move it to the CPU EP, or --cpu-nodes log; --inputs DIR" in error
    assert "--check load" not in error  # a verify's next steps: publishing anyway is what went wrong here
    # -v: the table, node by node, before the result line
    lines = result.stdout.splitlines()
    assert "diverges   first diverging node: 'log' (Log on QNN: SNR" in result.stdout
    assert any(line.startswith("  ok   square (Mul, QNN): SNR") for line in lines)
    assert any(line.startswith("  DIFF log (Log, QNN): SNR") for line in lines)
    assert lines[-1].startswith("result     FAILED: ") and "first diverging node: 'log'" in lines[-1]


def test_json_carries_the_divergence_table(frontend: tuple[Path, Path, Path]) -> None:
    source, compiled, tones = frontend
    result = run_cli("verify", compiled, "--reference", source, "--input", f"x={tones}", "--json")
    assert result.returncode == 5
    report = json.loads(result.stdout)  # one document: the report, whose failure is the error line
    divergence = report["divergence"]
    assert [r["node"] for r in divergence["first"]] == ["log"] and divergence["error"] == ""
    ok = {r["node"]: r["ok"] for r in divergence["rows"]}
    assert ok["square"] and ok["add_eps"] and not ok["log"]
    assert divergence["first"][0]["snr_db"] < 20.0 and divergence["first"][0]["ep"] == "QNNExecutionProvider"
    assert "first diverging node: 'log'" in report["failure"]


def test_a_passing_verify_localizes_nothing(frontend: tuple[Path, Path, Path]) -> None:
    """White noise (the generated input) is where this front end agrees: nothing to localize, no extra compile."""
    source, compiled, _ = frontend
    report = verify_model(compiled, source)
    assert report.ok and report.divergence is None and report.to_json()["divergence"] is None


def test_gem_pooling_verified_on_dim_images(tmp_path: Path) -> None:
    """The Python API: GeM pooling published unchecked, verified on dim images; localized to its first Pow."""
    source = gem_model(tmp_path / "gem.onnx")
    compiled = _published_unchecked(source, tmp_path / "out")
    report = verify_model(compiled, source, inputs={"x": small_images(0)})
    assert not report.ok and report.divergence is not None
    assert [r.node for r in report.divergence.first] == ["gem_pow"]
    assert "first diverging node: 'gem_pow' (Pow on QNN: SNR" in report.failure()
    assert "compile with --fallback auto to move it to the CPU EP, or --cpu-nodes gem_pow" in report.failure()


def test_compile_verify_of_a_partition_offers_only_what_partition_takes(frontend: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """compile --partition --check load --verify: verify refuses after a load check, and its next step is --cpu-nodes,
    never --fallback auto (which --partition refuses)."""
    source, _, tones = frontend
    result = run_cli("compile", source, "-o", tmp_path / "out", "--ep", "qnn", "--partition", "1MB", "--check", "load", "--verify",
                     "--input", f"x={tones}")
    assert result.returncode == 5 and not (tmp_path / "out" / "frontend_ctx.onnx").exists()
    error = next(line for line in result.stderr.splitlines() if line.startswith("ortcompile: error:"))
    assert "first diverging node: 'log'" in error and "; next: compile with --cpu-nodes log to keep it on the CPU EP; --inputs DIR" in error
    assert "--fallback" not in error


def test_verify_of_a_partitioned_output_offers_what_its_compile_takes(frontend: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """`ortcompile verify` of an output compiled with --partition (its manifest says so): the next step is
    --cpu-nodes, never --fallback auto, which that compile would refuse."""
    source, _, tones = frontend
    published = run_cli("-q", "compile", source, "-o", tmp_path / "out", "--ep", "qnn", "--partition", "1MB", "--check", "load")
    assert published.returncode == 0, published.stderr
    result = run_cli("verify", tmp_path / "out" / "frontend_ctx.onnx", "--reference", source, "--input", f"x={tones}")
    assert result.returncode == 5, result.stderr
    error = next(line for line in result.stderr.splitlines() if line.startswith("ortcompile: error:"))
    assert "; next: compile with --cpu-nodes log to keep it on the CPU EP; --inputs DIR" in error and "--fallback" not in error
