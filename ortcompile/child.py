"""The one way ortcompile starts a child process, and how a child ends (a leaf: imports nothing of ortcompile).

Every child runs native code that may crash instead of raising; a crash ends the child, never ortcompile. `launch`
builds the command line of every child (the serving Worker of worker.py, and the one-shot children of the option
and library probes, the compatibility check and the load probe), `ended` names how one died in every message,
`stop` cleans up after every one, and `die_with_parent` is the first thing every child does.
One-shot children run through `run_child` and answer with `answer_parent` (one marked JSON line on stdout:
any size, read after the child ended); the Worker answers pickled over its own pipes (worker.py).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

from ortcompile.jsonedge import JsonObject

_PR_SET_PDEATHSIG = 1
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


def run_child(main: str, spec: JsonObject, mark: str, timeout: float) -> ChildRun:
    """Run `main` ("package.module:function") in a fresh interpreter with `spec` as JSON in argv[1]: a crash in native
    code there ends the child, never ortcompile. The child answers with `answer_parent(mark, ...)`."""
    child = launch(main, json.dumps(spec), capture=True)
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(child)
        return ChildRun(None, f"no answer within {timeout:.0f} s", "", None)
    finally:
        stop(child)  # interrupted (Ctrl-C) while waiting: the child goes too
    answers = [line[len(mark):] for line in stdout.splitlines() if line.startswith(mark)]
    if child.returncode != 0 or not answers:
        return ChildRun(None, ended(child.returncode), stderr, child.returncode)
    return ChildRun(json.loads(answers[-1]), None, stderr, child.returncode)


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
