"""Workers forked from the zygote (ortcompile/zygote.py): a clean process, the fresh child's inheritance, crash
containment, and death with a SIGKILLed caller. Processes are the subject here, so nothing is mocked."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, cli_env

from ortcompile import zygote
from ortcompile.child import HUGE_PAGES_TUNABLE
from ortcompile.worker import Worker, WorkerCrashed


@pytest.fixture(autouse=True)
def _tests_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers unpickle this module's functions: its folder on their path (a zygote started without it is
    replaced once idle, which these tests also see)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))


def _inherited(reporter: object = None) -> dict[str, object]:
    """In the worker: what it inherited, and whether its parent ever imported onnxruntime."""
    parent = os.getppid()
    return {"pid": os.getpid(), "parent": parent, "cwd": os.getcwd(), "umask": os.umask(0o022),
            "variable": os.environ.get("ORTCOMPILE_ZYGOTE_TEST"), "tunables": os.environ.get("GLIBC_TUNABLES", ""),
            "fds": len(os.listdir("/proc/self/fd")),  # (its pipes have the numbers the caller had free)
            "parent_maps_ort": "onnxruntime_pybind11_state" in Path(f"/proc/{parent}/maps").read_text()}


def _segfault(reporter: object = None) -> None:
    ctypes.string_at(0)


def _tasks(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_a_forked_worker_inherits_what_a_fresh_one_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Worker(forked=True) as warm:  # (the zygote of this process, started now if no earlier test did)
        warm.call(_inherited, doing="warming")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "another test")  # a variable nothing reads at start-up: still a fork
    old_umask = os.umask(0o027)
    try:
        with Worker(forked=True) as forked, Worker() as fresh:
            got, reference = forked.call(_inherited, doing="asking"), fresh.call(_inherited, doing="asking")
    finally:
        os.umask(old_umask)
    assert isinstance(forked._process, zygote.Forked) and got["parent"] != os.getpid()  # a fork of the zygote
    assert got["parent"] == zygote._zygote.pid and not got["parent_maps_ort"]  # onnxruntime never loaded there
    assert _tasks(got["parent"]) == 1  # no thread in the process forks are made from
    for key in ("cwd", "umask", "tunables", "fds"):
        assert got[key] == reference[key], key
    assert got["cwd"] == str(tmp_path) and got["umask"] == 0o027 and HUGE_PAGES_TUNABLE in got["tunables"]


def test_another_start_up_environment_gets_a_zygote_of_its_own() -> None:
    """The zygote's environment was read at its start (GLIBC_TUNABLES, PYTHON*, what libraries read at import):
    another one gets a new zygote, and the old one goes once the forks it made (here a running worker) have ended."""
    with pytest.MonkeyPatch.context() as patch:
        with Worker(forked=True) as running:
            running.call(_inherited, doing="warming")
            old = zygote._zygote.pid
            patch.setenv("ORTCOMPILE_ZYGOTE_TEST", "seen")
            with Worker(forked=True) as worker:
                got = worker.call(_inherited, doing="asking")
            assert isinstance(worker._process, zygote.Forked) and got["parent"] == zygote._zygote.pid != old
            assert got["variable"] == "seen" and _alive(old)  # its fork still runs
            assert running.call(_inherited, doing="asking again")["variable"] is None
        with Worker(forked=True) as worker:  # (any next worker: the old zygote is idle now)
            assert worker.call(_inherited, doing="asking")["variable"] == "seen"
        assert not _alive(old)


def test_a_crash_in_a_fork_is_named_and_the_zygote_serves_on() -> None:
    with Worker(forked=True) as worker, pytest.raises(WorkerCrashed) as caught:
        worker.call(_segfault, doing="crashing on purpose")
    assert str(caught.value) == "the EP crashed (SIGSEGV) while crashing on purpose; nothing was published"
    assert isinstance(worker._process, zygote.Forked) and worker._process.returncode == -signal.SIGSEGV
    with Worker(forked=True) as worker:
        assert worker.call("ok".format, doing="asking again") == "ok"
        assert isinstance(worker._process, zygote.Forked)


def test_a_killed_fork_is_reported_killed() -> None:
    worker = Worker(forked=True)
    worker.call("ok".format, doing="starting")
    worker.kill()
    assert worker._process.returncode == -signal.SIGKILL and not worker.alive


_CALLER = """
import os, sys, time
from ortcompile.worker import Worker
from ortcompile import zygote
worker = Worker(forked=True)
worker.call("ok".format, doing="starting")
print(zygote._zygote.pid, worker._process.pid, flush=True)
time.sleep(600)
"""


def test_zygote_and_forks_die_with_a_sigkilled_caller() -> None:
    # a process: the subject is what happens when it is SIGKILLed
    caller = subprocess.Popen([sys.executable, "-c", _CALLER], stdout=subprocess.PIPE, text=True, cwd=REPO,
                              env=cli_env({"PYTHONPATH": str(REPO)}))
    try:
        zygote_pid, worker_pid = (int(pid) for pid in caller.stdout.readline().split())  # type: ignore[union-attr]
        assert _tasks(zygote_pid) == 1
        caller.send_signal(signal.SIGKILL)
        caller.wait(30)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in (zygote_pid, worker_pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(zygote_pid) and not _alive(worker_pid)
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()  # type: ignore[union-attr]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_fork_gets_its_pipes_at_the_callers_numbers_however_high() -> None:
    """Popen's pass_fds keeps the numbers the argv names: so does a fork, also for numbers at or above 1024 (this
    caller's next free fds), where the fork first parks what it received."""
    held = [os.open(os.devnull, os.O_RDONLY)]
    while held[-1] < 1023:
        held.append(os.open(os.devnull, os.O_RDONLY))
    try:
        with Worker(forked=True) as worker:
            assert worker.call("ok".format, doing="asking") == "ok"
            assert isinstance(worker._process, zygote.Forked)
    finally:
        for fd in held:
            os.close(fd)
