"""Keep native libraries from writing to our stdout (it carries --json) and from flooding stderr."""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import re
import resource
import sys
from collections.abc import Iterator

from ortcompile import ortmarkers

_show_native_output = False  # set by set_ort_log_level: -v shows what native code prints
_explicit_severity: int | None = None  # bench --ort-log-level
_configured = False  # only the CLI (or a caller of set_ort_log_level) decides ORT's log level; a library user keeps theirs


DEVNULL = "devnull"  # a redirection target: /dev/null, opened for the redirection and closed after it
Target = int | str | None  # an open file descriptor, DEVNULL, or None (left alone)


@contextlib.contextmanager
def redirected(stdout: Target = None, stderr: Target = None, fds: tuple[int, int] = (1, 2)) -> Iterator[None]:
    """The one way ortcompile points file descriptors 1 and 2 elsewhere while native code runs (native libraries
    write to them directly, past sys.stdout): stdout first, then stderr (so `stdout=2` is the stderr as it was),
    both restored on exit. Python's own buffers are flushed before and after."""
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY) if DEVNULL in (stdout, stderr) else None
    moves = [(fd, devnull if target == DEVNULL else target) for fd, target in zip(fds, (stdout, stderr)) if target is not None]
    saved = [(fd, os.dup(fd)) for fd, _ in moves]
    try:
        for fd, target in moves:
            os.dup2(target, fd)  # type: ignore[arg-type]
        yield
    finally:
        sys.stdout.flush()
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)
        if devnull is not None:
            os.close(devnull)


@contextlib.contextmanager
def native_stdout_to_stderr(quiet_stderr: bool = False) -> Iterator[None]:
    """Point file descriptor 1 at stderr (or /dev/null unless -v) while native code runs.

    The QNN SDK prints banner lines with printf(); left alone they would corrupt `--json` output.
    With `quiet_stderr`, fd 2 goes to /dev/null too unless -v (Dawn prints device warnings there); only
    for short native calls during which ortcompile itself prints nothing (session creation, registration).
    """
    try:
        stdout_fd = sys.stdout.fileno()
        stderr_fd = sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):  # captured streams (tests, notebooks): nothing to guard
        yield
        return
    with redirected(stderr_fd if _show_native_output else DEVNULL, DEVNULL if quiet_stderr and not _show_native_output else None,
                    fds=(stdout_fd, stderr_fd)):
        yield


@contextlib.contextmanager
def captured_native_output() -> Iterator[io.StringIO]:
    """File descriptor 2 (ONNX Runtime's log) into the yielded buffer while native code runs; fd 1 (SDK banners
    printed with printf) is captured apart and dropped. Both are shown on stderr afterwards under -v."""
    import tempfile  # stdlib, but not needed by the --if-changed path that imports this module

    sink = io.StringIO()
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        try:
            with redirected(out_file.fileno(), err_file.fileno()):
                yield sink
        finally:
            err_file.seek(0)
            sink.write(err_file.read().decode("utf-8", errors="replace"))
            out_file.seek(0)
            banners = out_file.read()
        if _show_native_output:
            os.write(2, banners + sink.getvalue().encode())


def set_ort_log_level(verbose: bool, severity: int | None = None) -> None:
    """ORT log lines are noise unless -v was given: failures reach the user as exceptions anyway.

    Applied now if onnxruntime is loaded, else when it first is (apply_ort_log_level): an up-to-date
    `--if-changed` check must not pay for importing it.
    """
    global _show_native_output, _explicit_severity, _configured
    _configured = True
    _show_native_output = verbose or (severity is not None and severity < 3)
    _explicit_severity = severity
    if "onnxruntime" in sys.modules:
        apply_ort_log_level()


@contextlib.contextmanager
def logging_settings() -> Iterator[None]:
    """The CLI sets the log level per command; restored afterwards, so an in-process caller keeps its own."""
    global _show_native_output, _explicit_severity, _configured
    saved = (_show_native_output, _explicit_severity, _configured)
    try:
        yield
    finally:
        _show_native_output, _explicit_severity, _configured = saved


def native_output_shown() -> bool:
    """-v: native libraries' own output (EP banners, ORT warnings) is shown on stderr."""
    return _show_native_output


def apply_ort_log_level() -> None:
    if not _configured:
        return
    import onnxruntime as ort

    ort.set_default_logger_severity(_severity())


def configure_session_logging(options: object) -> None:
    """Session log severity as configured (quiet unless -v); untouched for library users who configured nothing."""
    if _configured:
        options.log_severity_level = _severity()  # type: ignore[attr-defined]


def _severity() -> int:
    """ORT log severity: warnings with -v, otherwise only fatal (errors reach us as exceptions)."""
    if _explicit_severity is not None:
        return _explicit_severity
    return 2 if _show_native_output else 4


def proc_kib_field(path: str, field: str) -> int | None:
    """A "Field:  N kB" line of a Linux /proc file (status, meminfo) in bytes; None when absent or unreadable."""
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Restart the kernel's high-water mark (VmHWM) from the current RSS (Linux >= 4.0); False if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def vm_hwm_bytes() -> int | None:
    """This address space's peak resident set (Linux VmHWM; reset by writing 5 to /proc/self/clear_refs)."""
    return proc_kib_field("/proc/self/status", "VmHWM")


def peak_rss_bytes() -> int:
    """This process's own peak resident set.

    Not ru_maxrss on Linux: exec() folds the parent's high-water mark into it, so ortcompile started by a
    big process (pytest, a build system) would report the parent's memory. VmHWM is per address space.
    """
    hwm = vm_hwm_bytes()
    if hwm is not None:
        return hwm
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is KiB on Linux, bytes on macOS
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SEVERITY = {"V": "verbose", "I": "info", "W": "warning", "E": "error", "F": "fatal"}


def clean_native_line(line: str) -> str | None:
    """One line of native output as -v shows it: no colour codes, no boilerplate (None), ORT's timestamped
    format as `onnxruntime warning (file.cc:123): message`."""
    text = _ANSI.sub("", line).strip()
    if not text or ortmarkers.any_in(text, ortmarkers.BOILERPLATE):
        return None
    match = ortmarkers.ORT_LOG_LINE.match(text)
    if match is None:
        return text
    where = match["where"].split()[0] if match["where"].strip() else ""
    return f"onnxruntime {_SEVERITY[match['severity']]}{f' ({where})' if where else ''}: {match['message']}"


class NativeOutputFilter:
    """Route file descriptors 1 and 2 of this process through a pipe whose lines are cleaned (clean_native_line)
    on their way to the real stderr: for the worker child under -v, where native libraries write directly."""

    def __init__(self) -> None:
        import threading

        self._target = os.dup(2)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._thread = threading.Thread(target=self._pump, args=(read_fd,), daemon=True, name="ortcompile-native-output")
        self._thread.start()

    def _pump(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "r", errors="replace") as lines:
            for line in lines:
                cleaned = clean_native_line(line)
                if cleaned is not None:
                    os.write(self._target, (cleaned + "\n").encode())

    def close(self, timeout: float = 1.0) -> None:
        """Flush what is in the pipe (the process is about to _exit)."""
        sys.stdout.flush()
        sys.stderr.flush()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        self._thread.join(timeout)


def route_child_output(verbose: bool) -> NativeOutputFilter | None:
    """For the worker child's whole life: it writes nothing to stdout (the parent's --json goes there): EP banners
    and ORT's log go to stderr, cleaned of colour codes and boilerplate (-v), or nowhere. Returns the filter to
    close before exiting."""
    if verbose:
        return NativeOutputFilter()
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    return None


def available_memory() -> int:
    """MemAvailable (Linux), else the physical memory: what parts may use by default."""
    available = proc_kib_field("/proc/meminfo", "MemAvailable")
    return available if available is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def return_freed_memory() -> None:
    """Give the heap glibc keeps after large frees back to the OS (malloc_trim), so that this process does not hold
    what a finished session used while a worker child compiles; a no-op where there is no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
