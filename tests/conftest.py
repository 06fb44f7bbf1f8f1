"""Fixtures for the small suite (real onnxruntime, real QNN EP; no mocks)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import FIXTURES, register_qnn

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
