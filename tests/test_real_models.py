"""Real models from PyPI wheels (tests/corpus.py), compiled as a user would: the table in docs/real-models.md, kept true.

For every row of the table (each corpus model with QNN and with --ep cpu, with the pins a user would give, plus
the commands the error messages suggest), the command runs for real and must end as the table says:

- "compiled ..." / "re-laid out": exit 0, the EPContext count the table gives, and the output **loads with plain
  onnxruntime on its EP** (QNN: no CPU fallback unless the table lists CPU nodes) and its outputs on realistic
  inputs match the source on the CPU EP under the verify criterion for the EP's precision;
- "compiled ..., wrong on realistic inputs": a known false pass (issue 21), kept visible: exit 0, it loads, and its
  outputs on realistic inputs do **not** match (this row fails the day the check catches it: update the table);
- "exit N: ...": that exit code, one `ortcompile: error:` line that starts with the documented text, and nothing
  left in the output directory.

Never published-but-unloadable: every exit 0 is loaded and run here. CI sets `CI`, which makes a missing corpus a
failure, not a skip. Time and peak RSS in the table come from `python bench/real_models.py` (not checked here).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import corpus
import numpy as np
import pytest
from helpers import CliResult, cpu_session, qnn_session

from ortcompile.readback.compare import compare_output
from ortcompile.readback.criteria import criterion_for

pytestmark = pytest.mark.corpus

DOC = Path(__file__).resolve().parent.parent / "docs" / "real-models.md"
ROW = re.compile(r"^\| (?P<model>[\w./-]+) \| (?P<ep>\w+) \| `(?P<command>[^`]+)` \| (?P<outcome>[^|]+) \|", re.M)
COMPILED = re.compile(r"compiled: (?P<nodes>\d+) EPContext(?: \+ (?P<cpu>\d+) CPU nodes)?(?P<wrong>, wrong on realistic inputs)?$")
EXTRA_FLAGS = ("--freeze", "--inputs", "--fallback")  # options beyond the pins that make another row of the same model


@dataclass(frozen=True)
class Row:
    model: str
    ep: str
    command: str
    outcome: str

    @property
    def id(self) -> str:
        extra = " ".join(a for a in self.command.split()[5:] if a.startswith(EXTRA_FLAGS))
        return f"{self.model}-{self.ep}{'-' + extra.replace(' ', '') if extra else ''}"


def table() -> list[Row]:
    return [Row(m["model"], m["ep"], m["command"], m["outcome"].strip()) for m in ROW.finditer(DOC.read_text())]


def test_the_table_covers_the_whole_corpus_with_both_eps() -> None:
    listed = {(r.model, r.ep) for r in table()}
    assert listed == {(m.id, ep) for m in corpus.models() for ep in ("qnn", "cpu")}


def test_no_row_publishes_an_output_that_does_not_load() -> None:
    """Every exit-0 row is loaded and run by test_row; here: the table itself says nothing else is possible."""
    for row in table():
        assert row.outcome.startswith(("compiled: ", "re-laid out", "exit ")), row


@pytest.mark.parametrize("row", table(), ids=lambda r: r.id)
def test_row(row: Row, documented_compile: Any) -> None:
    model = corpus.require_model(row.model)
    # the command with the model, a fresh out/ and realistic.npz swapped in, run once per session (conftest.py):
    # test_verify_real_models verifies the same outputs
    proc, out = documented_compile(row.model, row.command)
    if row.outcome.startswith("exit "):
        _assert_refused(row, proc, out)
    else:
        assert proc.returncode == 0, proc.stderr[-2000:]
        result = json.loads(proc.stdout)["outputs"][0]
        _assert_compiled(row, model, result)


def _assert_refused(row: Row, proc: CliResult, out: Path) -> None:
    code, _, message = row.outcome.partition(": ")
    assert proc.returncode == int(code.split()[1]), proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ortcompile: error: ")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    expected = message.rstrip(" .…").removesuffix("...").strip()
    assert errors[0][len("ortcompile: error: "):].startswith(expected), (errors[0], expected)
    assert not out.exists() or list(out.iterdir()) == [], sorted(out.iterdir())  # nothing published, nothing left


def _assert_compiled(row: Row, model: corpus.CorpusModel, result: dict[str, Any]) -> None:
    compiled = Path(result["model"])
    if row.ep == "cpu":
        assert row.outcome == "re-laid out" and result["epcontext_nodes"] == 0
        session = cpu_session(compiled)
        criterion = criterion_for("fp32", "verify")
    else:
        match = COMPILED.match(row.outcome)
        assert match, row.outcome
        assert result["epcontext_nodes"] == int(match["nodes"])
        assert sum(result["remaining_ops"].values()) == int(match["cpu"] or 0)
        session = qnn_session(compiled, allow_cpu_nodes=bool(match["cpu"]))
        criterion = criterion_for("fp16", "verify")
    feeds = corpus.make_inputs(model, "realistic")
    names = [o.name for o in session.get_outputs()]
    got = dict(zip(names, session.run(names, _for(session, feeds))))
    reference = cpu_session(model.path)
    want = dict(zip(names, reference.run(names, _for(reference, feeds))))
    failures = [c.to_json() for c in (compare_output(n, got[n], want[n], criterion) for n in names) if not c.ok]
    if row.ep != "cpu" and match["wrong"]:  # the known false pass: published, loads, and computes something else
        assert failures, f"{row.id} is right on realistic inputs now: the table says 'wrong on realistic inputs'"
        return
    assert not failures, failures
    if row.ep == "cpu" and "--fix-" not in row.command:  # re-laid weights, the graph as it was: bit-identical outputs
        assert all(np.array_equal(got[n], want[n], equal_nan=True) for n in names)  # (pinned shapes may pick other kernels)


def _for(session: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The realistic inputs this session takes (a frozen input the compiled model ignores is still fed: it is there)."""
    wanted = {i.name for i in session.get_inputs()}
    return {k: v for k, v in feeds.items() if k in wanted}
