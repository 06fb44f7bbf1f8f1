"""A compile hashes its inputs (for the manifest's input record) beside its passes (issue 22, goal 2).

Pass-through (`--ep cpu`) does all its work in this process: the data pass copies and hashes the weights, and the
source's own sha256 is the second pass over the same bytes. finish waits for both, so the input's hash runs at the
process's own priority there (at idle priority it finished alone after the copy on a 2-core machine); the
pre-publish check still starts after it, so that the hash's mmap windows and the check's session are never held at
once (a batch's peak memory: test_incremental). While an EP compiles in the worker child,
the input's hash keeps idle priority and fills the gaps. Seen from inside the digest thread (the real hash runs).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import assert_one_line_error, check_output_dir, cli_env, run_cli, weights_model

from ortcompile.compile import finish
from ortcompile.output import digest


def _model(tmp_path: Path) -> Path:
    """Weights in an external data file of ~2.3 MiB (over the hash cache's 1 MiB floor, so it is remembered)."""
    rng = np.random.default_rng(3)
    model = tmp_path / "src" / "w.onnx"
    model.parent.mkdir()
    weights_model(model, {"A": rng.standard_normal((384, 768)).astype(np.float32), "B": rng.integers(-9, 9, (4096,)).astype(np.int32)},
                  external_data=True)
    return model


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _wrap_input_hash(monkeypatch: pytest.MonkeyPatch, before: Callable[[Path], None]) -> None:
    real = digest._size_and_sha256

    def hashed(path: Path) -> tuple[int, str]:
        before(path)
        return real(path)

    monkeypatch.setattr(digest, "_size_and_sha256", hashed)


def _nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.parametrize(("ep", "idle"), [("cpu", False), ("qnn", True)])
def test_input_hash_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ep: str, idle: bool) -> None:
    model = _model(tmp_path)
    seen: dict[str, int] = {}
    _wrap_input_hash(monkeypatch, lambda path: seen.setdefault(path.name, _nice_of_this_thread()))
    result = run_cli("compile", model, "-o", tmp_path / "out", "--ep", ep, env=cli_env({"XDG_CACHE_HOME": str(tmp_path / "xdg")}))
    assert result.returncode == 0, result.stderr
    assert set(seen) == {"w.onnx", "w.onnx.weights"}  # both hashed in the digest thread (the cache was empty)
    expected = 19 if idle else _nice_of_this_thread()
    assert seen == {"w.onnx": expected, "w.onnx.weights": expected}



def test_a_shared_weights_pass_through_batch_hashes_its_inputs_at_normal_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _model(tmp_path)
    second = tmp_path / "src" / "v.onnx"
    weights_model(second, {"C": np.random.default_rng(4).standard_normal((512, 640)).astype(np.float32)}, external_data=True)
    seen: dict[str, int] = {}
    _wrap_input_hash(monkeypatch, lambda path: seen.setdefault(path.name, _nice_of_this_thread()))
    result = run_cli("compile", first, second, "-o", tmp_path / "out", "--ep", "cpu", "--share-weights",
                     env=cli_env({"XDG_CACHE_HOME": str(tmp_path / "xdg")}))
    assert result.returncode == 0, result.stderr
    nice = _nice_of_this_thread()
    assert seen == {"w.onnx": nice, "w.onnx.weights": nice, "v.onnx": nice, "v.onnx.weights": nice}

def test_pass_through_check_starts_after_the_input_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The input's hash of the data file is finished before the pre-publish check starts (the two are never in
    memory at once). The manifest is then the same as ever: the inputs' and the outputs' sha256 are hashlib's over
    the files."""
    model = _model(tmp_path)
    check_started = threading.Event()
    started_before_hash_ended: list[bool] = []
    real_hash = digest._size_and_sha256

    def hashed(path: Path) -> tuple[int, str]:
        result = real_hash(path)
        if path.suffix == ".weights":
            time.sleep(0.5)  # a slow disk: a check that did not wait would start in this time
            started_before_hash_ended.append(check_started.is_set())
        return result

    monkeypatch.setattr(digest, "_size_and_sha256", hashed)
    real_check = finish.run_check

    def run_check(*args: Any, **kwargs: Any) -> Any:
        check_started.set()
        return real_check(*args, **kwargs)

    monkeypatch.setattr(finish, "run_check", run_check)
    out = tmp_path / "out"
    result = run_cli("compile", model, "-o", out, "--ep", "cpu", env=cli_env({"XDG_CACHE_HOME": str(tmp_path / "xdg")}))
    assert result.returncode == 0, result.stderr
    assert started_before_hash_ended == [False]
    manifest = check_output_dir(out, "w")  # every published file's size and sha256 (hashlib) as the manifest says
    assert manifest["check"]["passed"] is True
    assert [f["role"] for f in manifest["files"]].count("data") == 1
    inputs = {f["name"]: f["sha256"] for f in manifest["input"]["files"]}
    assert inputs == {"w.onnx": _sha256(model), "w.onnx.weights": _sha256(model.parent / "w.onnx.weights")}
    assert json.loads((out / "w_ctx.manifest.json").read_text()) == manifest


@pytest.mark.parametrize("ep", ["cpu", "qnn"])
def test_a_failed_input_hash_fails_the_compile_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ep: str) -> None:
    """An I/O error while the digest thread reads the data file (injected: a disk cannot be made to fail here) is an
    input error with one line, not an internal error (exit 70, as it was), and nothing is published or left staged."""
    model = _model(tmp_path)

    def failing(path: Path) -> None:
        if path.suffix == ".weights":
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))

    _wrap_input_hash(monkeypatch, failing)
    out = tmp_path / "out"
    result = run_cli("compile", model, "-o", out, "--ep", ep, env=cli_env({"XDG_CACHE_HOME": str(tmp_path / "xdg")}))
    assert result.returncode == 3, result.stderr
    assert_one_line_error(result.stderr, "w.onnx.weights: cannot read the input to record its sha256: Input/output error")
    assert not out.exists()
