"""One-shot children as forks (child.run_child(fork=True)): the command line asks the compatibility check and the
option check in a fork of itself, which has onnxruntime imported and the EP registered, instead of a fresh
interpreter (~0.2 CPU s each).

A fork must answer as the fresh child does, keep crashes and hangs out of this process, never write to this
process's streams, and never be used once an EP has compiled or run here (QNN's compatibility check segfaults in a
process that compiled with it), nor in a process that is not ortcompile's command line (an application may have used
the EP through onnxruntime directly: a fork of this pytest process, after other test files ran QNN here, got another
verdict than a fresh child). Those are what these tests hold, with the real QNN EP.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import FIXTURES

from ortcompile import CompileOptions, child, compile_model
from ortcompile.child import answer_parent, run_child
from ortcompile.eps import check_compatibility, resolve
from ortcompile.eps.sessionopts import session_options

MARK = "test-fork: "
FRESH_INTERPRETER_CPU = 0.08  # a fresh child imports onnxruntime before it answers: >= 0.1 CPU s on this machine


def answer_with_noise() -> None:
    """An entry that writes to both streams, natively too, before it answers."""
    print("noise on stdout")
    print("noise on stderr", file=sys.stderr)
    os.write(1, b"native noise on fd 1\n")
    answer_parent(MARK, {"pid": os.getpid(), "argv": sys.argv[1]})


def crash() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def hang() -> None:
    """Says where it runs (argv[1]: a file to write its pid to), then never answers."""
    Path(json.loads(sys.argv[1])["pid_file"]).write_text(str(os.getpid()))
    time.sleep(600)


def raise_error() -> None:
    raise RuntimeError("the entry failed")


def _children_cpu(work: Callable[[], object]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    work()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


@pytest.fixture
def no_ep_ran_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the command line is until an EP runs in it (for entries that touch no EP: this pytest process may have run
    QNN sessions in earlier tests)."""
    monkeypatch.setattr(child, "_forks_allowed", True)
    monkeypatch.setattr(child, "_ep_ran_here", False)


@pytest.fixture(scope="module")
def qnn_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fork") / "out"
    return compile_model(FIXTURES / "mlp.onnx", out, CompileOptions(ep="qnn", check="none")).model_path


def test_a_fork_answers_and_never_writes_to_our_streams(no_ep_ran_here: None, capfd: pytest.CaptureFixture[str]) -> None:
    run = run_child(f"{__name__}:answer_with_noise", {"x": 1}, MARK, timeout=60, fork=True)
    assert run.crash is None and run.returncode == 0
    assert run.answer is not None and run.answer["pid"] != os.getpid() and run.answer["argv"] == '{"x": 1}'
    assert "noise on stderr" in run.stderr
    seen = capfd.readouterr()
    assert "noise" not in seen.out and "noise" not in seen.err


def test_a_crashing_fork_is_reported_by_its_signal(no_ep_ran_here: None) -> None:
    run = run_child(f"{__name__}:crash", {}, MARK, timeout=60, fork=True)
    assert run.answer is None and run.crash == "SIGSEGV" and run.killed_by_signal


def test_a_fork_that_raises_ends_with_exit_code_1_and_its_traceback(no_ep_ran_here: None) -> None:
    run = run_child(f"{__name__}:raise_error", {}, MARK, timeout=60, fork=True)
    assert run.answer is None and run.crash == "exit code 1" and "RuntimeError: the entry failed" in run.stderr


def test_a_hanging_fork_is_killed_at_the_time_bound(no_ep_ran_here: None, tmp_path: Path) -> None:
    clock = time.monotonic()
    run = run_child(f"{__name__}:hang", {"pid_file": str(tmp_path / "pid")}, MARK, timeout=1, fork=True)
    assert run.answer is None and run.crash == "no answer within 1 s" and run.returncode is None
    assert time.monotonic() - clock < 10
    pid = int((tmp_path / "pid").read_text())
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped: no zombie left
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


VERDICTS_FROM_A_CLEAN_PROCESS = r"""
import json, resource, sys
from ortcompile import child
from ortcompile.eps import check_compatibility, resolve

def children_cpu(work):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = work()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return result, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime

resolve("qnn")  # what the command line has done when it asks: registered the EP, listed its devices
library, library_cpu = children_cpu(lambda: check_compatibility(sys.argv[1], fork=True).to_json())  # not the CLI: fresh
child.allow_forks()
forked, fork_cpu = children_cpu(lambda: check_compatibility(sys.argv[1], fork=True).to_json())
fresh, fresh_cpu = children_cpu(lambda: check_compatibility(sys.argv[1]).to_json())
print(json.dumps({"library": library, "forked": forked, "fresh": fresh, "cpu": [library_cpu, fork_cpu, fresh_cpu]}))
"""


def test_the_compatibility_verdict_from_a_fork_is_the_fresh_childs(qnn_model: Path) -> None:
    # a process: what a fork carries is the state of the process it is forked from
    run = subprocess.run([sys.executable, "-c", VERDICTS_FROM_A_CLEAN_PROCESS, str(qnn_model)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout.splitlines()[-1])
    library_cpu, fork_cpu, fresh_cpu = answer["cpu"]
    assert answer["forked"] == answer["fresh"] == answer["library"]
    assert answer["fresh"]["eps"][0]["verdict"] == "unknown" and "NPU" in answer["fresh"]["eps"][0]["reason"]  # (QNN judges NPUs only)
    assert library_cpu > FRESH_INTERPRETER_CPU > fork_cpu and fresh_cpu > FRESH_INTERPRETER_CPU, answer["cpu"]


def test_no_fork_once_an_ep_runs_here(qnn_model: Path, no_ep_ran_here: None) -> None:
    session_options(resolve("qnn"))  # what every compile, session and probe with the EP builds first
    assert child._ep_ran_here
    cpu = _children_cpu(lambda: check_compatibility(qnn_model, fork=True))
    assert cpu > FRESH_INTERPRETER_CPU


def test_the_cpu_ep_leaves_forks_allowed(no_ep_ran_here: None) -> None:
    session_options(None)
    session_options(resolve("cpu"))
    assert not child._ep_ran_here
