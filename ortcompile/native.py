"""Keep native libraries from writing to our stdout (it carries --json) and from flooding stderr."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

_show_native_output = False  # set by set_ort_log_level: -v shows what native code prints


@contextlib.contextmanager
def native_stdout_to_stderr() -> Iterator[None]:
    """Point file descriptor 1 at stderr (or /dev/null unless -v) while native code runs.

    The QNN SDK prints banner lines with printf(); left alone they would corrupt `--json` output.
    """
    try:
        stdout_fd = sys.stdout.fileno()
        stderr_fd = sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):  # captured streams (tests, notebooks): nothing to guard
        yield
        return
    sys.stdout.flush()
    saved = os.dup(stdout_fd)
    sink = stderr_fd if _show_native_output else os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(sink, stdout_fd)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, stdout_fd)
        os.close(saved)
        if sink != stderr_fd:
            os.close(sink)


def set_ort_log_level(verbose: bool) -> None:
    """ORT log lines are noise unless -v was given: failures reach the user as exceptions anyway."""
    import onnxruntime as ort

    global _show_native_output
    _show_native_output = verbose
    ort.set_default_logger_severity(2 if verbose else 4)


def session_log_level() -> int:
    """Per-session ORT log severity: warnings with -v, otherwise only fatal (errors reach us as exceptions)."""
    return 2 if _show_native_output else 4
