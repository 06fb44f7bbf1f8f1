"""Run EP work in a child process: a crash in native code ends the child, never ortcompile.

EPs can die instead of raising (a SIGSEGV while compiling, an abort in a destructor). Everything that
drives an EP — the prepare step, ONNX Runtime's compile, the pre-publish load and run — happens in a
`Worker`, a spawned child that serves calls over a pipe. The parent reports the child's death as a
one-line error naming the signal and what the child was doing, and removes the staging directory.

A fresh child per compile is also what makes outputs deterministic: the QNN backend keeps
process-global counters that end up in its context binary (a model compiled after another one in the
same process gets different bytes), and memory the EP held is returned to the OS when the child ends.
A process that asks for several workers gets each after its first as a fork of its zygote (zygote.py): still a
fresh child in which no EP has run, without a new interpreter's imports.

The child never outlives the parent (PR_SET_PDEATHSIG), ignores Ctrl-C (the parent decides), and sends
progress events (stages, bytes written) back for the parent's reporter to render.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from ortcompile import zygote
from ortcompile.child import die_with_parent, ended, huge_page_env, launch, leave, stop
from ortcompile.errors import CompilationFailed, InternalError
from ortcompile.native import reset_peak_rss, route_child_output, set_ort_log_level, vm_hwm_bytes
from ortcompile.progress import Reporter, SilentReporter

_POLL_SECONDS = 0.1
# What a zygote imports before it forks workers: what the calls need, by name (this leaf cannot import them), none
# of which imports onnxruntime at its top (its import starts a thread: each fork imports it, ~0.035 CPU s).
ZYGOTE_PRELOAD = ("numpy", "onnx", "ortcompile.worker", "ortcompile.compile.epstep", "ortcompile.compile.ortstep",
                  "ortcompile.compile.prepare", "ortcompile.readback.parity", "ortcompile.readback.placement",
                  "ortcompile.readback.reference", "ortcompile.run.load")


crash_contained = False  # this process is a disposable child whose crash its parent reports: libraries load without a probe


def mark_crash_contained() -> None:
    """Say that this process is a disposable child (a worker, a probe of eps/validate.py)."""
    global crash_contained
    crash_contained = True


NOT_PUBLISHED = "; nothing was published"  # how a crashed worker's message ends


class WorkerCrashed(CompilationFailed):
    """The child died from a signal or exited without answering."""

    signal: int | None = None  # the signal it died of (SIGKILL: killed, e.g. out of memory; SIGSEGV, SIGABRT...: a bug)
    compiled_failed: bool = False  # it crashed in the EP on a compiled model the check loaded or ran (finish.py marks it)


class ChildTraceback(Exception):
    """Where an error handed back by the child was raised: its formatted traceback, the cause of the error the
    parent re-raises, so --debug shows the child's frames (not only `raise payload` here)."""

    def __str__(self) -> str:
        return "in the worker child:\n" + str(self.args[0]).rstrip()


class Worker:
    """A child process that runs module-level functions: `worker.call(func, *args, doing="compiling x")`.

    It starts importing onnxruntime, onnx and numpy at once, so a worker started before the parent's own
    planning is ready by the time it is needed.
    """

    def __init__(self, label: str = "the EP", reporter: Reporter | None = None, verbose: bool = False, forked: bool = False) -> None:
        """With `forked`, the child is a fork of this process's zygote (zygote.py: a process that asks for several
        workers), else (or when no zygote serves) a fresh interpreter."""
        self.label = label  # who might crash, for the message: "the QNN EP"
        self.reporter = reporter or SilentReporter()
        self.verbose = verbose
        self.starter = threading.get_ident()  # the child dies when this *thread* ends (PR_SET_PDEATHSIG, _die_with_parent)
        from_parent, to_child = os.pipe()
        from_child, to_parent = os.pipe()
        env = huge_page_env(os.environ)

        def args(parent: int) -> tuple[str, ...]:
            return str(from_parent), str(to_parent), str(parent), "1" if verbose else "0"

        process = zygote.spawn("ortcompile.worker:main", args, (from_parent, to_parent), env, ZYGOTE_PRELOAD) if forked else None
        self._process: subprocess.Popen[Any] | zygote.Forked = process or launch(
            "ortcompile.worker:main", *args(os.getpid()), pass_fds=(from_parent, to_parent), env=env)
        os.close(from_parent)
        os.close(to_parent)
        self._conn = _Duplex(Connection(from_child, writable=False), Connection(to_child, readable=False))
        self.peak_rss_bytes = 0  # the child's peak during the last call (VmHWM, reset at each call)
        self._advance: Callable[[int], None] = lambda n: None

    def call(self, func: Callable[..., Any], *args: Any, doing: str) -> Any:
        """Run `func(*args, reporter=...)` in the child and return its result (or raise its exception)."""
        self.peak_rss_bytes = 0
        try:
            self._conn.send(("call", func, args))
        except (BrokenPipeError, OSError):
            raise self._crashed(doing) from None
        while True:
            if not self._conn.poll(_POLL_SECONDS):
                if _cancelled.is_set():
                    self.kill()
                    raise CompilationFailed(f"cancelled while {doing}")
                if self._process.poll() is not None and not self._conn.poll(0):
                    raise self._crashed(doing)
                self.reporter.tick()
                continue
            try:
                kind, payload, peak = self._conn.recv()
            except (EOFError, OSError):
                raise self._crashed(doing) from None
            self.peak_rss_bytes = max(self.peak_rss_bytes, peak)
            if kind == "progress":
                self._relay(*payload)
            elif kind == "error":
                error, child_traceback = payload
                raise error from ChildTraceback(child_traceback)
            else:
                return payload

    def _relay(self, event: str, *args: Any) -> None:
        """A progress event from the child, rendered by this process's reporter."""
        if event == "bytes_bar":
            self._advance = self.reporter.bytes_bar(*args)
        elif event == "advance":
            self._advance(*args)
        else:
            getattr(self.reporter, event)(*args)

    def _crashed(self, doing: str) -> WorkerCrashed:
        try:
            code = self._process.wait(2)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            how = "stopped answering"
        elif code < 0:
            how = f"crashed ({ended(code)})"
        else:
            how = f"exited with code {code}"
        crashed = WorkerCrashed(f"{self.label} {how} while {doing}{NOT_PUBLISHED}")
        crashed.signal = -code if code is not None and code < 0 else None
        return crashed

    def close(self) -> None:
        """Ask the child to leave; kill it if it does not (an EP stuck in native code)."""
        if self._process.poll() is None:
            try:
                self._conn.send(("exit", None, None))
                self._process.wait(5)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        stop(self._process)
        self._conn.close()

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.kill()  # interrupted or failed: the child's half-done work goes with the staging directory


class _PipeReporter:
    """The child's reporter: every event goes to the parent, which renders it."""

    def __init__(self, conn: _Duplex) -> None:
        self._conn = conn

    def _send(self, *event: Any) -> None:
        self._conn.send(("progress", event, _peak_rss()))

    def stage(self, name: str) -> None:
        self._send("stage", name)

    def detail(self, message: str) -> None:
        self._send("detail", message)

    def bytes_bar(self, description: str, total: int) -> Callable[[int], None]:
        self._send("bytes_bar", description, total)
        return lambda n: self._send("advance", n)

    def tick(self) -> None:
        pass

    def close(self) -> None:
        self._send("close")


class _Duplex:
    """Two one-way pipes as one connection (what os.pipe gives a child that was started with exec)."""

    def __init__(self, reader: Connection, writer: Connection) -> None:
        self._reader, self._writer = reader, writer

    def send(self, obj: Any) -> None:
        self._writer.send(obj)

    def recv(self) -> Any:
        return self._reader.recv()

    def poll(self, timeout: float = 0.0) -> bool:
        return self._reader.poll(timeout)

    def close(self) -> None:
        self._reader.close()
        self._writer.close()


_spare: Worker | None = None  # a fresh, unused worker kept warm for the next compile of this process
_started = 0
_more_expected = False
_atexit_registered = False
_spare_lock = threading.Lock()  # parts of a --partition compile ask for workers from several threads
_cancelled = threading.Event()  # set by cancel_all: every waiting call kills its child and raises


def cancel_all() -> None:
    """Stop every worker call in this process (another part failed, or the user interrupted): children are killed."""
    _cancelled.set()


def reset_cancel() -> None:
    _cancelled.clear()


def fresh_worker(label: str, reporter: Reporter | None, verbose: bool) -> Worker:
    """A worker that has run nothing yet: the warm spare when there is one, else a new one.

    From this process's second worker on (or its first, when more are expected), it is a fork of the zygote.
    A spare is started when a worker retires (`retire_worker`) in a process that asks for more than one (a batch,
    the parts of --partition, a test suite, a service compiling many models), so the next compile finds its
    worker's imports done. Started at retirement, not beside a running worker, it never adds a process to the
    peak of a compile. A spare is never reused after a call: every compile still gets a fresh EP state.

    A spare serves only the thread that started it: the kernel kills a child when the thread that started it ends,
    so another thread's spare could die under its new user (the parts of --partition retire their workers on pool
    threads; the stitched model's check runs on the caller's thread).
    """
    global _spare, _started
    with _spare_lock:
        worker = None
        if _spare is not None and _spare.starter == threading.get_ident():
            worker, _spare = _spare, None
        if worker is None or not worker.alive or worker.verbose != verbose:
            if worker is not None:
                worker.kill()
            worker = Worker(verbose=verbose, forked=_started > 0 or _more_expected)  # the process's second: a fork
        _started += 1
    worker.label, worker.reporter = label, reporter or SilentReporter()
    return worker


def expect_more_workers() -> None:
    """Say that this process will ask for another worker (a batch with models left): the first retirement starts a spare."""
    global _more_expected
    _more_expected = True


def retire_worker(verbose: bool) -> None:
    """A compile's worker has exited: start the spare for the next one, if this process asks for several."""
    global _spare
    with _spare_lock:
        if _spare is not None and not _spare.alive:  # another thread's, gone with that thread
            _spare.kill()
            _spare = None
        if _spare is None and (_started > 1 or _more_expected):
            if not _atexit_registered:
                _register_kill_spare()
            _spare = Worker(verbose=verbose, forked=True)


class Workers:
    """The worker child of a compile (or of a batch that must share one): started early, or when first needed."""

    def __init__(self, verbose: bool, reporter: Reporter, label: str = "the EP") -> None:
        self.verbose, self.reporter, self.label = verbose, reporter, label
        self._worker: Worker | None = None

    def start(self) -> None:
        if self._worker is None:
            self._worker = fresh_worker(self.label, self.reporter, self.verbose)

    def get(self) -> Worker:
        self.start()
        assert self._worker is not None
        self._worker.label = self.label
        return self._worker

    def renew(self) -> None:
        """Retire the worker: the next `get` starts a fresh one (a new compile gets a fresh EP state)."""
        if self._worker is not None:
            self._worker.__exit__(None, None, None)
            self._worker = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._worker is not None:
            self._worker.__exit__(*exc_info)
            retire_worker(self.verbose)


def _register_kill_spare() -> None:
    global _atexit_registered
    atexit.register(_kill_spare)
    _atexit_registered = True


def _kill_spare() -> None:
    if _spare is not None:
        _spare.kill()


def main() -> None:
    """The child's entry point: `python -c "...main()" READ_FD WRITE_FD PARENT_PID VERBOSE`."""
    read_fd, write_fd, parent_pid, verbose = (int(a) for a in sys.argv[1:5])
    _serve(_Duplex(Connection(read_fd, writable=False), Connection(write_fd, readable=False)), parent_pid, bool(verbose))


def _serve(conn: _Duplex, parent_pid: int, verbose: bool) -> None:
    """The child's loop: one call at a time until asked to exit or the pipe closes."""
    die_with_parent(parent_pid)
    mark_crash_contained()  # a library named by path loads here without a probe child of its own: a crash is reported
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    native_filter = route_child_output(verbose)
    set_ort_log_level(verbose)
    import numpy  # noqa: F401  # what every call needs, loaded while the parent is still planning
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401

    reporter = _PipeReporter(conn)
    while True:
        try:
            kind, func, args = conn.recv()
        except (EOFError, OSError):
            break
        if kind != "call":
            break
        reset_peak_rss()  # each call's answer carries its own peak, so stages are measured apart
        try:
            answer = ("result", func(*args, reporter=reporter), _peak_rss())
        except BaseException as exc:  # handed to the parent, which raises it
            answer = ("error", (exc, traceback.format_exc()), _peak_rss())
        try:
            conn.send(answer)
        except Exception as exc:  # an unpicklable result or exception: say what it was
            error = InternalError(f"internal error: cannot hand back {type(exc).__name__}: {exc}")
            conn.send(("error", (error, traceback.format_exc()), _peak_rss()))
    if native_filter is not None:
        native_filter.close()  # flushes, then what is left in its pipe
    leave()


def _peak_rss() -> int:
    return vm_hwm_bytes() or 0

