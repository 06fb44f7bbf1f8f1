"""Fixtures for the small suite (real onnxruntime, real QNN EP; no mocks)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from bigmodel import BigModel, write_cpu_model
from helpers import FIXTURES, CliResult, register_qnn, run_cli

# Modules whose assertions are about the RSS of this (pytest's) process run first. What other modules do here (sessions,
# compiles, in-process CLI runs) changes how freed memory is reused, and with it the RSS growth they measure: after
# test_sharing (before or after its CLI calls ran in-process) a CPU session holding 4.0 MiB of weights read 5.7 MiB,
# and test_residency's exact LRU sequence and its flat-RSS check failed; alone, or first, the footprints are the weight
# bytes to within 0.1 MiB.
MEASURE_THIS_PROCESS = ("test_residency.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in MEASURE_THIS_PROCESS)  # a stable sort: the rest keep their order


@pytest.fixture(scope="session", autouse=True)
def _qnn_registered() -> None:
    """Register the QNN plugin in the test process once (the library does the same when it compiles)."""
    register_qnn()


@pytest.fixture
def fixture_copy(tmp_path: Path):
    """Copy a checked-in fixture into tmp_path/src (tests never touch fixtures/ or its directory)."""

    def copy(name: str) -> Path:
        target = tmp_path / "src" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(FIXTURES / name, target)
        return target

    return copy


@pytest.fixture(scope="session")
def documented_compile(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], tuple[CliResult, Path]]:
    """documented_compile(model_id, command) -> (result, out): a command of docs/real-models.md's table
    (`ortcompile compile MODEL.onnx -o out/ ...`, run in this process with `--json`) once per session, its `out/` a
    directory of its own and its `realistic.npz` the model's realistic inputs. test_real_models judges each command's
    outcome; test_verify_real_models verifies the same outputs instead of compiling them again (the OCR detector and
    rxnmap take tens of seconds each on the simulator). Callers only read the output: copy it to change it."""
    import corpus

    root = tmp_path_factory.mktemp("documented")
    done: dict[str, tuple[CliResult, Path]] = {}

    def compile_once(model_id: str, command: str) -> tuple[CliResult, Path]:
        if command not in done:
            model = corpus.require_model(model_id)
            where = root / str(len(done))
            where.mkdir()
            out = where / "out"
            realistic = where / corpus.REALISTIC_FILE  # a user's own sample: the realistic inputs, as an .npz
            np.savez(realistic, **corpus.make_inputs(model, "realistic"))
            swap = {f"{model.name}.onnx": str(model.path), "out/": str(out), corpus.REALISTIC_FILE: str(realistic)}
            args = [swap.get(a, a) for a in command.split()[2:]]  # after "ortcompile compile"
            done[command] = (run_cli("compile", *args, "--json"), out)  # in this process: the outcome is the subject
        return done[command]

    return compile_once


@pytest.fixture(scope="session")
def big_cpu_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BigModel]:
    """tests/bigmodel.py's 2.4 GB CPU model (a MatMul/Add chain over the protobuf limit), written once per session:
    test_large compiles it with the CLI, test_buffers_large with compile_to_buffers (each wrote its own copy before:
    2.4 GB more to write, 1-4 s). Callers only read it; it is deleted when the session ends."""
    directory = tmp_path_factory.mktemp("bigcpu-src")
    yield write_cpu_model(directory)
    shutil.rmtree(directory, ignore_errors=True)
