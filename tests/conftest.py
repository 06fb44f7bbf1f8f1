"""Fixtures for the small suite (real onnxruntime, real QNN EP; no mocks)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import FIXTURES, register_qnn


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
