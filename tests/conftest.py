"""Fixtures for the small suite (real onnxruntime, real QNN EP; no mocks)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bigmodel import BigModel, write_cpu_model
from helpers import FIXTURES, CliResult, register_qnn, run_cli

# Modules whose assertions are about the RSS of this (pytest's) process run first. What other modules do here (sessions,
# compiles, in-process CLI runs) changes how freed memory is reused, and with it the RSS growth they measure: after
# test_sharing (before or after its CLI calls ran in-process) a CPU session holding 4.0 MiB of weights read 5.7 MiB,
# and test_residency's exact LRU sequence and its flat-RSS check failed; alone, or first, the footprints are the weight
# bytes to within 0.1 MiB. test_webgpu's budgets come from footprints measured the same way. Under `-n 2` each of them
# starts a worker process of its own (the first two work units).
MEASURE_THIS_PROCESS = ("test_residency.py", "test_webgpu.py")

# Files whose tests run as one work unit under `pytest -n 2` (pytest-xdist), on one worker. "documented":
# test_verify_real_models verifies the outputs of documented_compile, a session fixture that test_real_models fills
# (the OCR detector's QNN compile and check alone are ~2.5 minutes): on two workers each would compile them. "large":
# every file with a test marked large, so that no two > 2 GB compiles run at once (a QNN compile peaks at ~3.9x its
# model: two would not fit in 24 GiB), and test_large and test_buffers_large read one big_cpu_model.
SHARED_UNITS = {"test_real_models.py": "documented", "test_verify_real_models.py": "documented",
                "test_large.py": "large", "test_buffers_large.py": "large", "test_large_partition.py": "large",
                "test_kill.py": "large"}


def work_unit(nodeid: str) -> str:
    """The work unit of a test under `-n 2`: its file (module fixtures are built once), or its SHARED_UNITS unit."""
    name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return SHARED_UNITS.get(name, name)


def _run_order(item: pytest.Item) -> int:
    # The modules that measure this process first; then the shared units, the longest, so that no worker is left alone with
    # one of them at the end; then the rest in their collection order. Under `-n 2` units are handed out in this order.
    if item.path.name in MEASURE_THIS_PROCESS:
        return MEASURE_THIS_PROCESS.index(item.path.name)
    return len(MEASURE_THIS_PROCESS) + (0 if work_unit(item.nodeid) in SHARED_UNITS.values() else 1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_run_order)  # a stable sort: within a rank the items keep their order
    strays = sorted({item.path.name for item in items if item.get_closest_marker("large") and work_unit(item.nodeid) != "large"})
    if strays:  # two large tests on two workers at once would exhaust the memory
        raise pytest.UsageError(f"tests marked large in {', '.join(strays)}: add the file to SHARED_UNITS in tests/conftest.py")


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: pytest without xdist never calls it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`pytest -n 2`: each work unit (work_unit) goes whole to one worker, the units in the collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # xdist would otherwise hand out the units with the most tests first
    return WorkUnitScheduling(config, log)


def worker_cpus(index: int, workers: int, cpus: list[int]) -> set[int]:
    """The CPUs of pytest-xdist worker `index` of `workers`: a share of `cpus` of its own, or one shared round-robin
    when there are more workers than CPUs."""
    return set(cpus[index::workers]) if workers <= len(cpus) else {cpus[index % len(cpus)]}


def pytest_configure(config: pytest.Config) -> None:
    # Under `-n N` each worker and every process it starts runs on CPUs of its own. The HTP simulator's helper threads
    # spin while its calling thread computes, so on all cores one worker's simulator runs took half of the other's core
    # (the whole suite 0.80-0.90x pinned; the figures, and why ortcompile itself pins nothing: docs/performance.md,
    # "2026-12-06 (sixth)").
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        cpus = sorted(os.sched_getaffinity(0))
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        os.sched_setaffinity(0, worker_cpus(int(worker.removeprefix("gw")), workers, cpus))


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
