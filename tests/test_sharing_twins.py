"""A --share-weights batch on QNN's HTP simulator, which cannot load a shared EP context: the pre-publish check runs
on each model compiled without sharing (ortcompile/compile/twins.py), so an fp16-fragile model is refused rather
than published unchecked; a good batch records what its check ran on. Real QNN; small models built here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fp16models import log_frontend_model, save_npy, tones_over_silence
from helpers import FIXTURES, assert_one_line_error, run_cli, without_progress

TWIN = "the model compiled without --share-weights: QNN's HTP simulator cannot load shared EP contexts on this machine"


@pytest.fixture(scope="module")
def fragile_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """Two models sharing the Log(x*x + 1e-10) front end's weights, and tones over silence that expose it."""
    directory = tmp_path_factory.mktemp("fragile")
    first = log_frontend_model(directory / "front.onnx")
    second = directory / "again.onnx"
    shutil.copy(first, second)
    return first, second, save_npy(directory / "tones.npy", tones_over_silence(0))


def test_a_batch_whose_model_fp16_gets_wrong_is_refused_naming_the_twin_and_the_way_out(fragile_pair: tuple[Path, Path, Path],
                                                                                        tmp_path: Path) -> None:
    first, second, tones = fragile_pair
    out = tmp_path / "out"
    result = run_cli("compile", first, second, "-o", out, "--ep", "qnn", "--share-weights", "--input", f"x={tones}")
    assert result.returncode == 1, result.stderr
    line = assert_one_line_error(result.stderr, "front.onnx: not published: output 'y' differs from the source", f"(checked on {TWIN})")
    assert "first diverging node: 'log'" in line
    assert "next: compile front.onnx without --share-weights and with --fallback auto (or --cpu-nodes NODE)" in line
    assert "not checked before publishing" not in result.stderr and not out.exists()


def test_a_good_batch_is_published_with_its_check_made_on_the_twins(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_cli("compile", FIXTURES / "mlp.onnx", FIXTURES / "dynamic.onnx", "-o", out, "--ep", "qnn", "--share-weights",
                     "--fix-dim", "batch=1", "-v")
    assert result.returncode == 0, result.stderr
    assert not any("not checked before publishing" in line for line in without_progress(result.stderr))
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".onnx")) == ["dynamic_ctx.onnx", "mlp_ctx.onnx"]  # no twin published
    for stem in ("mlp", "dynamic"):
        check = json.loads((out / f"{stem}_ctx.manifest.json").read_text())["check"]
        assert check["mode"] == "run" and check["passed"] is True and check["on"] == TWIN


def test_a_load_only_check_is_not_made_on_twins(tmp_path: Path) -> None:
    """Opening a twin proves nothing of the shared context: --check load keeps the warning, and compiles once."""
    out = tmp_path / "out"
    result = run_cli("compile", FIXTURES / "mlp.onnx", FIXTURES / "dynamic.onnx", "-o", out, "--ep", "qnn", "--share-weights",
                     "--fix-dim", "batch=1", "--check", "load")
    assert result.returncode == 0, result.stderr
    assert "mlp_ctx.onnx, dynamic_ctx.onnx: not checked before publishing: QNN's HTP simulator cannot load" in result.stderr
    assert "compiled without sharing" not in result.stderr
    assert json.loads((out / "mlp_ctx.manifest.json").read_text())["check"]["mode"] == "none"
