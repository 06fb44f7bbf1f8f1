"""Fixtures for the small suite (real onnxruntime, real QNN EP; no mocks)."""

from __future__ import annotations

import pytest
from helpers import register_qnn


@pytest.fixture(scope="session", autouse=True)
def _qnn_registered() -> None:
    """Register the QNN plugin in the test process once (the library does the same when it compiles)."""
    register_qnn()

