"""The pre-publish check's CPU reference runs beside the EP's runs for a small source (issue 22, readback/reference.py).

One real QNN compile (HTP simulator) of a fixture: the check reports where its time went (--json, -v), and the
same comparison with the reference run after the EP's gives the very same numbers.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from helpers import FIXTURES, run_cli

from ortcompile.eps.request import EpRequest
from ortcompile.progress import SilentReporter
from ortcompile.readback.check import check_request
from ortcompile.readback.parity import run_parity


def test_the_reference_beside_the_ep_run_gives_the_sequential_verdict(tmp_path: Path) -> None:
    source = FIXTURES / "mlp.onnx"
    proc = run_cli("compile", source, "-o", tmp_path / "out", "--ep", "qnn", "--json", "-v")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)["outputs"][0]
    check = result["check"]
    assert set(check["seconds"]) == {"compiled", "run", "source_on_cpu", "source_run"}
    assert check["seconds"]["compiled"] > 0 and check["seconds"]["run"] > 0  # (a KB-sized reference may round to 0 ms)
    assert result["timings"]["check"] >= check["seconds"]["compiled"] + check["seconds"]["run"]
    runs = check["run_seconds"]  # one run of the compiled model per input set: the check's cost
    assert len(runs) == len(check["input_sets"]) > 1 and all(r > 0 for r in runs)
    assert sum(runs) <= check["seconds"]["run"] + 0.002 * len(runs)  # (each rounded to the ms)
    assert check["cpu_seconds"] > 0
    each = sum(runs) / len(runs)
    line = re.search(r"check: loads, runs and agrees with the source on the CPU EP on \d+ input sets \(.*; load \d+\.\d\ds, "
                     r"run \d+\.\d\ds \((\d+\.\d\d)s a set\), source on the CPU \d+\.\d\ds beside the run; \d+\.\d\ds, CPU (\d+\.\d\d)s\)",
                     proc.stderr)
    assert line, proc.stderr
    assert abs(float(line[1]) - each) < 0.01 and abs(float(line[2]) - check["cpu_seconds"]) < 0.01

    compiled = tmp_path / "out" / "mlp_ctx.onnx"
    beside = check_request(compiled, source, EpRequest("qnn"), "run", check["criterion"]["precision"], check["dims"])
    assert beside.concurrent_reference  # a KB-sized source
    after = run_parity(dataclasses.replace(beside, concurrent_reference=False), SilentReporter())
    again = run_parity(beside, SilentReporter())
    assert after.ok and again.ok and not after.concurrent_reference and again.concurrent_reference
    assert [o.to_json() for o in after.outputs] == [o.to_json() for o in again.outputs] == check["outputs"]  # the simulator is deterministic: the same numbers
    assert after.sets == again.sets == check["input_sets"]
