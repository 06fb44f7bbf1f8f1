"""A clean interpreter from which worker children are forked, for a process that asks for several of them.

A fresh worker interpreter spends ~0.3 CPU s importing numpy, onnx and ortcompile's modules before its first call;
a fork of a process that has them imported spends ~0.035 s (importing onnxruntime itself). The zygote is that
process: launched once per process (child.launch, with the worker's environment, so glibc's huge pages are asked
at exec), it imports and then only forks, one child per request. It never imports onnxruntime (whose import
starts a telemetry thread and opens its database) nor runs an EP, so a fork carries no EP state and no thread:
numpy's BLAS threads are stopped by OpenBLAS's own fork handler before every fork. Each fork serves as a fresh
worker (worker.main); a crash in it ends that fork only.

Life: the zygote dies with the thread that launched it (a thread of its own that lives as long as the zygote),
each fork with the zygote (PR_SET_PDEATHSIG both): a SIGKILLed parent leaves neither behind. The zygote ignores
Ctrl-C as a worker does. A request carries what a fresh child would have inherited at its launch: the fork's pipes
(at the same fd numbers), the caller's fds 1 and 2, its directory, umask and environment. The answer is the fork's
pid and a pidfd (signals never reach a reused pid); its exit status comes back on a pipe of its own once the zygote
has reaped it, so a crash is named by its signal as for a child of the caller's own.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ortcompile.child import die_with_parent, launch, leave

# Variables a process changes while nothing reads them at start-up (pytest sets this one around every test): a
# zygote launched with another value still serves, and the fork gets the caller's value.
VOLATILE_VARIABLES = frozenset({"PYTEST_CURRENT_TEST"})
_ANSWER_TIMEOUT = 60.0


class Forked:
    """A forked child as the caller sees it, with what worker.py and child.stop use of a Popen."""

    stdout = stderr = None

    def __init__(self, pid: int, pidfd: int | None, status: int) -> None:
        self.pid, self._pidfd, self._status = pid, pidfd, status
        self.returncode: int | None = None
        self._lock = threading.Lock()  # (the status is read and its fds closed once, whoever asks)

    def poll(self) -> int | None:
        return self._read_status(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._read_status(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
        return code

    def kill(self) -> None:
        if self.returncode is not None:
            return
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone, not yet reaped

    def _read_status(self, timeout: float | None) -> int | None:
        with self._lock:
            return self._read_status_locked(timeout)

    def _read_status_locked(self, timeout: float | None) -> int | None:
        if self.returncode is None and _readable(self._status, timeout):
            data = os.read(self._status, 16)
            # no status: the zygote died before it reaped the fork, which its death signal (SIGKILL) ended
            self.returncode = int(data) if data else -signal.SIGKILL
            for fd in (self._status, self._pidfd):
                if fd is not None:
                    os.close(fd)
        return self.returncode


def _readable(fd: int, timeout: float | None) -> bool:
    """select.poll, not select.select: a caller with many files open has fds above select's 1024."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else timeout * 1000))


class _Zygote:
    """The caller's side: the launched zygote and its socket; one request at a time."""

    def __init__(self, env: dict[str, str], preload: Sequence[str]) -> None:
        self.env = env
        self._socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._socket.settimeout(_ANSWER_TIMEOUT)
        self._lock = threading.Lock()
        launched: list[subprocess.Popen[Any] | BaseException] = []
        ready = threading.Event()

        def hold() -> None:  # the zygote's death signal follows this thread, so it waits as long as the zygote lives
            try:
                process = launch("ortcompile.zygote:main", str(theirs.fileno()), str(os.getpid()), *preload,
                                 pass_fds=(theirs.fileno(),), env=env)
            except BaseException as exc:  # (an OSError: reported to the caller, who launches fresh workers)
                launched.append(exc)
                ready.set()
                return
            launched.append(process)
            ready.set()
            process.wait()

        threading.Thread(target=hold, name="ortcompile-zygote", daemon=True).start()
        ready.wait()
        theirs.close()
        if isinstance(launched[0], BaseException):
            raise launched[0]
        self.process = launched[0]
        self.broken = False
        self._forks: list[Forked] = []  # the forks it made that may still run

    @property
    def pid(self) -> int:
        return self.process.pid

    def serves(self, env: dict[str, str]) -> bool:
        return self.usable and _without_volatile(env) == _without_volatile(self.env)

    @property
    def usable(self) -> bool:
        return not self.broken and self.process.poll() is None

    def idle(self) -> bool:
        """Every fork it made has ended as its owner saw (worker.py reaps each through child.stop; read without
        polling, which would wait on an owner's call in progress)."""
        self._forks = [fork for fork in self._forks if fork.returncode is None]
        return not self._forks

    def close(self) -> None:
        """Ends it and the forks it still has, and reaps it (/usr/bin/time of this process then counts its CPU)."""
        self._socket.close()  # the zygote kills and reaps its forks, then leaves, when it reads the end of its socket
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def fork(self, entry: str, args: Sequence[str], pass_fds: Sequence[int], env: dict[str, str]) -> Forked | None:
        """`entry` in a fork with `args` as its argv; None when the zygote cannot serve (gone, or no directory)."""
        try:
            request = {"entry": entry, "argv": list(args), "fds": list(pass_fds), "cwd": os.getcwd(), "umask": _umask(),
                       "env": env}
        except OSError:  # the directory was removed: a fresh child inherits that, a fork cannot be sent there
            return None
        status_read, status_write = os.pipe()
        with self._lock:
            try:
                socket.send_fds(self._socket, [json.dumps(request).encode()], [status_write, 1, 2, *pass_fds])
                answer, fds, _, _ = socket.recv_fds(self._socket, 64, 1)
            except OSError:  # (a timeout too) the zygote is gone or stuck: fresh children from now on
                answer, fds = b"", []
            finally:
                os.close(status_write)
            if not answer:
                self.broken = True
                for fd in (status_read, *fds):
                    os.close(fd)
                return None
            fork = Forked(json.loads(answer)["pid"], fds[0] if fds else None, status_read)
            self._forks.append(fork)
        return fork


def _without_volatile(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name not in VOLATILE_VARIABLES}


def _umask() -> int:
    with open("/proc/self/status", encoding="ascii") as status:  # (reading it by setting it would race other threads)
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    raise OSError("no Umask in /proc/self/status")


_zygote: _Zygote | None = None
_retiring: list[_Zygote] = []  # zygotes of an earlier environment, closed once the forks they made have ended
_failed = False
_zygote_lock = threading.Lock()


def spawn(entry: str, args: Callable[[int], Sequence[str]], pass_fds: Sequence[int], env: dict[str, str],
          preload: Sequence[str]) -> Forked | None:
    """`entry` ("package.module:function") in a fork of this process's zygote for `env` (launched with it and
    `preload` imported when there is none yet); `args(parent_pid)` its argv. Another environment (a test or a service
    set a variable) gets a zygote of its own; the earlier one is closed once its forks (a spare worker) have ended.
    None when no zygote can be launched or one stopped answering: the caller launches a fresh child."""
    global _zygote, _failed
    with _zygote_lock:
        _retiring[:] = [old for old in _retiring if not _closed_if_idle(old)]
        if _failed or (_zygote is not None and not _zygote.usable):  # it died or broke: fresh children from now on
            _failed = True
            return None
        if _zygote is not None and not _zygote.serves(env):
            if not _closed_if_idle(_zygote):
                _retiring.append(_zygote)
            _zygote = None
        if _zygote is None:
            try:
                _zygote = _Zygote(env, preload)
            except OSError:
                _failed = True
                return None
            atexit.register(_zygote.close)
        return _zygote.fork(entry, args(_zygote.pid), pass_fds, env)


def _closed_if_idle(zygote: _Zygote) -> bool:
    if not zygote.idle():
        return False
    atexit.unregister(zygote.close)
    zygote.close()
    return True


def _forget_in_fork() -> None:
    global _zygote, _retiring, _failed, _zygote_lock
    _zygote, _retiring, _failed, _zygote_lock = None, [], True, threading.Lock()  # a fork does not own its parent's


os.register_at_fork(after_in_child=_forget_in_fork)


def main() -> None:
    """The zygote: `python -c "...main()" SOCKET_FD PARENT_PID MODULE...`."""
    control, parent = socket.socket(fileno=int(sys.argv[1])), int(sys.argv[2])
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 1)  # as a worker, it writes nothing to the caller's stdout
    for module in sys.argv[3:]:
        importlib.import_module(module)
    if "onnxruntime" in sys.modules:  # its import starts a thread and opens a database: no clean fork after it
        leave(3)
    _serve(control)


def _serve(control: socket.socket) -> None:
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # (a handler, so that the wakeup fd hears of each exit)
    statuses: dict[int, int] = {}  # fork's pid -> the write end of its status pipe
    while True:
        readable = select.select([control, wake_read], [], [])[0]
        if wake_read in readable:
            os.read(wake_read, 4096)
            _reap(statuses)
        if control in readable:
            message, fds, _, _ = socket.recv_fds(control, 1 << 20, 64)
            if not message:
                break  # the caller closed its end (it exited)
            request = json.loads(message)
            pid = os.fork()
            if pid == 0:
                _become(request, fds, [control.fileno(), wake_read, wake_write, *statuses.values()])
            for fd in fds[1:]:
                os.close(fd)
            statuses[pid] = fds[0]
            pidfd = _pidfd(pid)
            with contextlib.suppress(OSError):  # (the caller gave up waiting: it reads the end of the socket next)
                socket.send_fds(control, [json.dumps({"pid": pid}).encode()], [] if pidfd is None else [pidfd])
            if pidfd is not None:
                os.close(pidfd)
    for pid in statuses:  # the caller exited or let it go: what it forked goes too
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _reap(statuses, wait=True)
    leave()


def _reap(statuses: dict[int, int], wait: bool = False) -> None:
    while statuses:
        try:
            pid, status = os.waitpid(-1, 0 if wait else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = statuses.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):  # the caller no longer listens
                os.write(fd, str(os.waitstatus_to_exitcode(status)).encode())
            os.close(fd)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):  # Linux before 5.3: the caller signals the pid
        return None


def _become(request: dict[str, Any], fds: list[int], zygotes: list[int]) -> None:
    """The fork's side: what a fresh `python -c` child would have inherited, then its entry; never returns.
    (Ctrl-C stays ignored, as the worker asks at once: a fork never prints a KeyboardInterrupt of the user's.)"""
    code = 0
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in (*zygotes, fds[0]):
            os.close(fd)
        os.dup2(fds[1], 1)
        os.dup2(fds[2], 2)
        # the caller's pipes at the fd numbers its argv names, as Popen's pass_fds: parked above them first
        above = max([1023, *request["fds"]]) + 1  # (a caller with many files open passes high numbers)
        parked = [fcntl.fcntl(fd, fcntl.F_DUPFD, above) for fd in fds[3:]]
        for fd in fds[1:]:
            os.close(fd)
        for old, wanted in zip(parked, request["fds"], strict=True):
            os.dup2(old, wanted)
            os.close(old)
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["-c", *request["argv"]]
        module, function = request["entry"].split(":")
        getattr(importlib.import_module(module), function)()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # as an interpreter reports an uncaught exception: the traceback, exit code 1
        traceback.print_exc()
        code = 1
    leave(code)
