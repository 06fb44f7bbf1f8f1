"""The one way ortcompile starts a child process, and how a child ends (a leaf: imports nothing of ortcompile).

Every child runs native code that may crash instead of raising; a crash ends the child, never ortcompile. `launch`
builds the command line of every child (the serving Worker of worker.py, and the one-shot children of the option
and library probes, the compatibility check and the load probe), `ended` names how one died in every message,
`stop` cleans up after every one, and `die_with_parent` is the first thing every child does.
One-shot children run through `run_child` and answer with `answer_parent` (one marked JSON line on stdout:
any size, read after the child ended); the Worker answers pickled over its own pipes (worker.py). A one-shot child
asked with `fork=True` is a fork of the command line's process (`allow_forks`) while no EP has compiled or run in
it (`note_ep_ran_here`): it starts with onnxruntime imported and the EP registered, where a fresh interpreter
spends ~0.2 CPU s on both.
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any, NoReturn

from ortcompile.jsonedge import JsonObject

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
# glibc (>= 2.35) maps what malloc takes from the kernel with transparent huge pages when asked: an EP's compile
# allocates and fills gigabytes of buffers, and with 4 KiB pages the kernel's page faults and zeroing cost as much
# CPU as a quarter of the compile (measured with QNN: 2.3 of 9.9 CPU s on a 0.8 GB model; same blob, peak RSS
# within its run-to-run spread). Older glibc and other C libraries ignore the variable.
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"


def launch(entry: str, *args: str, pass_fds: tuple[int, ...] = (), capture: bool = False,
           env: dict[str, str] | None = None) -> subprocess.Popen[Any]:
    """The one way ortcompile starts a child: `entry` ("package.module:function") in a plain interpreter that imports
    only ortcompile, with `args` in its argv; stdin never shared; with `capture`, stdout and stderr piped as text.

    Not multiprocessing's spawn, which re-runs the caller's __main__ in the child (an unguarded script, a notebook
    or `python -` would break). Two ways to answer: a serving Worker talks over pipes in `pass_fds` (pickled calls,
    progress, results); a one-shot child (run_child) prints one marked JSON line (answer_parent). `env`: the child's
    whole environment (default: this process's)."""
    module, function = entry.split(":")
    command = [sys.executable, "-c", f"from {module} import {function}; {function}()", *args]
    piped = subprocess.PIPE if capture else None
    return subprocess.Popen(command, pass_fds=pass_fds, stdin=subprocess.DEVNULL, stdout=piped, stderr=piped, text=capture, close_fds=True,
                            env=env)


def huge_page_env(environ: Any) -> dict[str, str]:
    """`environ` with glibc's malloc asked for transparent huge pages (HUGE_PAGES_TUNABLE), for the compile worker;
    a GLIBC_TUNABLES the user set is kept, and one that already says how malloc uses huge pages wins."""
    env = dict(environ)
    tunables = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" not in tunables:
        env["GLIBC_TUNABLES"] = f"{tunables}:{HUGE_PAGES_TUNABLE}" if tunables else HUGE_PAGES_TUNABLE
    return env


def ended(returncode: int) -> str:
    """How a child that did not answer ended, as every message names it: the signal's name ("SIGSEGV"), else its exit code."""
    return signal.Signals(-returncode).name if returncode < 0 else f"exit code {returncode}"


def stop(child: subprocess.Popen[Any]) -> None:
    """Clean-up of every child: kill it if it still runs, and reap it (no zombie, its pipes closed)."""
    if child.poll() is None:
        child.kill()
    child.wait()
    for stream in (child.stdout, child.stderr):
        if stream is not None:
            stream.close()


@dataclass(frozen=True)
class ChildRun:
    """How a one-shot child ended: its answer (the last marked JSON line on stdout), or how it died without one."""

    answer: JsonObject | None
    crash: str | None  # "SIGSEGV", "exit code 3", "no answer within 600 s"; None when it answered
    stderr: str
    returncode: int | None  # None: it was killed for the timeout

    @property
    def killed_by_signal(self) -> bool:
        return self.returncode is not None and self.returncode < 0


_forks_allowed = False  # this process is ortcompile's command line (allow_forks): nothing runs an EP here unnoticed
_ep_ran_here = False  # an EP compiled or ran a session in this process (not only registered): no fork asks it anything


def allow_forks() -> None:
    """Say that this process is ortcompile's own command line: whatever runs an EP in it builds its options with
    eps.sessionopts (which notes it), so a fork of it carries no EP state unless noted. Not in an application's
    process, which may have used the EP through onnxruntime directly (measured: a fork of such a process gets
    another compatibility verdict than a fresh child)."""
    global _forks_allowed
    _forks_allowed = True


def note_ep_ran_here() -> None:
    """Say that an EP other than the CPU's is used in this process: a fork of it would carry the EP's state (QNN's
    compatibility check segfaults in a process that compiled with it), so one-shot children start fresh from now on."""
    global _ep_ran_here
    _ep_ran_here = True


def run_child(main: str, spec: JsonObject, mark: str, timeout: float, fork: bool = False) -> ChildRun:
    """Run `main` ("package.module:function") in a fresh interpreter with `spec` as JSON in argv[1]: a crash in native
    code there ends the child, never ortcompile. The child answers with `answer_parent(mark, ...)`. With `fork`
    (a caller whose process has at most registered the EP), a fork of this process runs it instead when this is
    ortcompile's command line (allow_forks) and no EP has run here: the same answer, crash containment and time
    bound, without a new interpreter's imports."""
    if fork and _forks_allowed and not _ep_ran_here:
        return _run_forked(main, spec, mark, timeout)
    child = launch(main, json.dumps(spec), capture=True)
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(child)
        return ChildRun(None, f"no answer within {timeout:.0f} s", "", None)
    finally:
        stop(child)  # interrupted (Ctrl-C) while waiting: the child goes too
    return _answer_of(stdout, stderr, child.returncode, mark)


def _answer_of(stdout: str, stderr: str, returncode: int, mark: str) -> ChildRun:
    answers = [line[len(mark):] for line in stdout.splitlines() if line.startswith(mark)]
    if returncode != 0 or not answers:
        return ChildRun(None, ended(returncode), stderr, returncode)
    return ChildRun(json.loads(answers[-1]), None, stderr, returncode)


def _run_forked(main: str, spec: JsonObject, mark: str, timeout: float) -> ChildRun:
    """run_child in a fork: its stdout and stderr go to files of its own (never this process's streams), it ends
    through `leave` as a fresh child does, and it is killed at the time bound or when the wait is interrupted."""
    module, function = main.split(":")
    entry = getattr(importlib.import_module(module), function)
    sys.stdout.flush()  # (the fork's copies of these buffers are never written to our streams, but say nothing twice)
    sys.stderr.flush()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            _forked_child(entry, json.dumps(spec), out.fileno(), err.fileno(), parent)
        returncode = _wait(pid, timeout)
        if returncode is None:
            return ChildRun(None, f"no answer within {timeout:.0f} s", "", None)
        out.seek(0)
        err.seek(0)
        stdout, stderr = (f.read().decode("utf-8", errors="replace") for f in (out, err))
    return _answer_of(stdout, stderr, returncode, mark)


def _forked_child(entry: Any, spec: str, out: int, err: int, parent: int) -> NoReturn:
    """The fork's side: what a fresh child's `python -c` would do, with the parent's signal handlers undone."""
    code = 0
    try:
        die_with_parent(parent)
        _name_process(entry.__module__.rsplit(".", 1)[-1])  # ps and /proc/PID/comm tell the fork from its parent
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # the parent's handlers (staging clean-up) are not the fork's
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        faulthandler.disable()  # (enabled here, it would write a crash's dump to the parent's stderr)
        os.dup2(out, 1)
        os.dup2(err, 2)
        # sys.stdout may be anything in this process (pytest's capture, a notebook's stream): the fork's are its fds
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115 (lives until os._exit)
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)  # noqa: SIM115
        sys.argv = [sys.argv[0], spec]
        entry()
    except BaseException:  # as an interpreter reports an uncaught exception: the traceback, exit code 1
        traceback.print_exc()
        code = 1
    leave(code)


def _name_process(name: str) -> None:
    try:
        ctypes.CDLL(None).prctl(_PR_SET_NAME, name.encode()[:15])
    except (OSError, AttributeError):
        pass  # not Linux: the name is only for people looking


def _wait(pid: int, timeout: float) -> int | None:
    """The fork's return code (negative: the signal that ended it), or None once it was killed at `timeout`."""
    deadline = time.monotonic() + timeout
    pause, done = 0.001, 0
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() >= deadline:
                return None
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
    finally:
        if not done:  # the time bound, or interrupted (Ctrl-C) while waiting: the fork goes too
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def answer_parent(mark: str, answer: JsonObject) -> NoReturn:
    """The child side of run_child: one marked JSON line on stdout, then leave without EP teardown (some plugins
    abort in their static destructors)."""
    sys.stdout.write(mark + json.dumps(answer) + "\n")
    leave()


def leave(code: int = 0) -> NoReturn:
    """How every child ends: Python's buffers flushed, then out without EP teardown (some plugins abort in their
    static destructors, see cli.run), so the parent sees the answer and the exit code, never a late crash."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def die_with_parent(parent_pid: int) -> None:
    """A SIGKILLed parent must not leave an EP compiling into a staging directory nobody owns. Every child
    ortcompile starts calls this first (the option and library probes of eps/validate.py too)."""
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: the parent's kill on exit still applies
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
