"""The pre-publish check and --verify open the compiled model once (issue 22, goal 3).

`compile --check load --verify` proves the load with verify's own session: the check opens it in the worker child
and leaves it open there for verify's run (readback/parity.open_for_run). The default check with --verify is the
one parity pass (verify adds no session). Counted in the code path: every worker call that loads or compares returns
a ParityReport saying how many sessions it opened on the compiled model; a spy around Worker.call (the real call
runs: ONNX Runtime and the QNN EP's simulator as they are) collects them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnxruntime_qnn
import pytest
from helpers import FIXTURES, run_cli

from ortcompile.readback.parity import ParityReport
from ortcompile.worker import Worker

SPLIT = FIXTURES / "split.onnx"  # 3 QNN partitions with Mod and Sinh on the CPU EP between them


@pytest.fixture
def reports(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ParityReport]]:
    """(function, report) of every worker call of the test that returned a load check or a comparison of a model
    the test compiles (not of a --partition part, MODEL.partNN_ctx.onnx, checked on its own as it compiles)."""
    calls: list[tuple[str, ParityReport]] = []
    real = Worker.call

    def spy(self: Worker, func: Any, *args: Any, doing: str) -> Any:
        result = real(self, func, *args, doing=doing)
        if isinstance(result, ParityReport) and ".part" not in doing:
            calls.append((func.__name__, result))
        return result

    monkeypatch.setattr(Worker, "call", spy)
    return calls


def sessions(reports: list[tuple[str, ParityReport]]) -> int:
    """Sessions opened on the compiled model (a report without the count, from before it was kept, opened one)."""
    return sum(getattr(report, "compiled_sessions", 1) for _, report in reports)


def test_load_check_with_verify_opens_the_compiled_model_once(tmp_path: Path, reports: list[tuple[str, ParityReport]]) -> None:
    out = tmp_path / "out"
    result = run_cli("compile", SPLIT, "-o", out, "--ep", "qnn", "--check", "load", "--verify", "-v", "--json")
    assert result.returncode == 0, result.stderr
    assert sessions(reports) == 1
    assert [(name, report.mode) for name, report in reports] == [("open_for_run", "load"), ("run_parity", "run")]
    (_, loaded), (_, verified) = reports
    assert verified.ok and len(verified.runs) == 1 and verified.outputs  # verify's comparison ran, on its seed-0 inputs
    assert verified.seconds["compiled"] == loaded.seconds["compiled"]  # the one session's load time, carried over
    assert verified.placement == loaded.placement == {"QNNExecutionProvider": {"EPContext": 3}, "CPUExecutionProvider": {"Mod": 1, "Sinh": 1}}
    # What the user sees is the load check's, then verify's, as before
    manifest = json.loads((out / "split_ctx.manifest.json").read_text())
    assert manifest["check"] == {"mode": "load", "passed": True}
    [document] = json.loads(result.stdout)["outputs"]
    assert document["check"]["mode"] == "load" and document["check"]["outputs"] == [] and document["check"]["input_sets"] == []
    assert document["timings"]["verify"] > 0
    lines = [line for line in result.stderr.splitlines() if line.startswith(("ortcompile: check:", "ortcompile: verif"))]
    assert [line.split(" (")[0] for line in lines] == ["ortcompile: check: loads on its EP", "ortcompile: verifying against the source",
                                                      "ortcompile: verified: outputs match the source on the CPU EP"]


def test_a_verify_failure_after_the_load_check_is_judged_on_the_same_session(tmp_path: Path, reports: list[tuple[str, ParityReport]]) -> None:
    out = tmp_path / "out"
    result = run_cli("compile", SPLIT, "-o", out, "--ep", "qnn", "--check", "load", "--verify", "--precision", "fp32", "--rtol", "0", "--atol", "0")
    assert result.returncode == 5
    error = next(line for line in result.stderr.splitlines() if line.startswith("ortcompile: error:"))
    assert error.startswith("ortcompile: error: not published: output 'y' differs from the source on the CPU EP (seed 0): ")
    assert "outside rtol=0.0 atol=0.0" in error
    assert not out.exists()
    assert sessions(reports) == 1 and [name for name, _ in reports] == ["open_for_run", "run_parity"]


def test_the_default_check_with_verify_is_the_one_parity_pass(tmp_path: Path, reports: list[tuple[str, ParityReport]]) -> None:
    result = run_cli("compile", SPLIT, "-o", tmp_path / "out", "--ep", "qnn", "--verify", "--json")
    assert result.returncode == 0, result.stderr
    assert sessions(reports) == 1
    [(name, check)] = reports
    assert name == "run_parity" and check.mode == "run" and check.criterion is not None and check.criterion.purpose == "check"
    assert len(check.run_seconds) == len(check.sets) > 1  # every input set run once, on that one session
    [document] = json.loads(result.stdout)["outputs"]
    assert document["timings"]["verify"] == 0.0


def test_a_partitioned_model_checked_with_verify_is_the_one_parity_pass(tmp_path: Path, reports: list[tuple[str, ParityReport]]) -> None:
    """The stitched model's check judges by --verify's criterion, as a whole model's does: verify adds no session pair."""
    result = run_cli("compile", FIXTURES / "mlp.onnx", "-o", tmp_path / "out", "--ep", "qnn", "--partition", "2", "--verify", "-v", "--json")
    assert result.returncode == 0, result.stderr
    assert sessions(reports) == 1
    [(name, check)] = reports
    assert name == "run_parity" and check.mode == "run" and check.ok and len(check.run_seconds) == len(check.sets) > 1
    [document] = json.loads(result.stdout)["outputs"]
    assert document["epcontext_nodes"] == 4 and document["timings"]["verify"] == 0.0
    assert "in the pre-publish check (one comparison)" in result.stderr and "verifying against the source" not in result.stderr


def test_a_check_that_verify_would_not_repeat_keeps_its_own_session(tmp_path: Path, reports: list[tuple[str, ParityReport]]) -> None:
    """verify leaves out a recorded option that loads a library (backend_path): its session is not the check's, so the
    load check opens its own, as before (and the warning that verify ignores the option is said once)."""
    backend = f"backend_path={onnxruntime_qnn.get_qnn_htp_path()}"
    result = run_cli("compile", SPLIT, "-o", tmp_path / "out", "--ep", "qnn", "--ep-option", backend, "--check", "load", "--verify")
    assert result.returncode == 0, result.stderr
    assert [(name, report.mode) for name, report in reports] == [("run_parity", "load"), ("run_parity", "run")]
    assert sessions(reports) == 2
    assert result.stderr.count("ignoring the recorded ep_options backend_path=") == 1
