"""One exception hierarchy; every error knows its exit code (see docs/exit-codes)."""

from __future__ import annotations

import errno

from ortcompile import ortmarkers


class OrtCompileError(Exception):
    """Base of every error ortcompile reports to a user. The message is one line."""

    exit_code = 1

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail  # extra context shown with -v

    def __reduce__(self) -> tuple[type, tuple[str, str | None]]:
        return (type(self), (self.message, self.detail))  # keeps `detail` across a process boundary


class CompilationFailed(OrtCompileError):
    """The EP failed, or compiled nothing when compilation was required."""

    exit_code = 1


class UsageError(OrtCompileError):
    """Options that cannot work together or do not parse (click's own errors also exit 2)."""

    exit_code = 2


class InvalidModel(OrtCompileError):
    """The input model is unreadable, inconsistent or unsafe."""

    exit_code = 3


class OutputError(OrtCompileError):
    """The output cannot be written: exists without --force, no space, permissions."""

    exit_code = 4


class VerificationFailed(OrtCompileError):
    """A compiled model does not match its manifest or its reference outputs."""

    exit_code = 5


class InternalError(OrtCompileError):
    """A bug in ortcompile (any exception that is not one of these classes): its own exit code, so a script can tell
    "the tool broke" from "the compile failed" (70: sysexits' EX_SOFTWARE)."""

    exit_code = 70


class OrtCompileWarning(UserWarning):
    """Something the user may want to know that does not stop the work (the CLI prints it, -q too)."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM: the run stops, nothing is published, exit 128 + signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class EpUnavailable(UsageError):
    """The requested execution provider is not installed or claims no device here."""


class ComponentMissing(CompilationFailed):
    """A library the EP needs is not on this machine (a GPU driver, a device compiler): exit 1.

    The message names the library and where it comes from; nothing was written.
    """


def shorten(text: str, limit: int = 300) -> str:
    """At most `limit` characters, cut at a word boundary with an ellipsis: never mid-word."""
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit - 1)
    return text[: cut if cut > limit // 2 else limit - 1].rstrip(" ,;:") + " …"


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's text: ORT messages carry multi-line tracebacks."""
    text = str(exc).strip()
    return shorten(text.splitlines()[0], limit) if text else type(exc).__name__


def ort_reason(error: BaseException | str, limit: int = 400) -> str:
    """The root cause in an ONNX Runtime / EP error, on one line.

    ORT wraps the cause in a status header, a source location and context ("Load model from X failed:
    This is an invalid model. In Node, (...) , Error <cause>"); the full text stays available for -v.
    """
    text = " ".join(str(error).split())
    text = ortmarkers.SOURCE_LOCATION.sub("", ortmarkers.ORT_STATUS.sub("", text))
    text = ortmarkers.SOURCE_SIGNATURE.sub("", ortmarkers.LOAD_FAILED.sub("", text))
    if ortmarkers.CAUSE_SEPARATOR in text:
        text = text.rsplit(ortmarkers.CAUSE_SEPARATOR, 1)[1]
    return shorten(text or type(error).__name__, limit)


def output_error(exc: OSError, what: str) -> OutputError:
    """Turn the OS's reason into a one-line message that says what to do."""
    hints = {
        errno.ENOSPC: "no space left on the device; free some space or choose another -o",
        errno.EDQUOT: "disk quota exceeded; free some space or choose another -o",
        errno.EACCES: "permission denied; choose a writable -o",
        errno.EPERM: "operation not permitted; choose a writable -o",
        errno.EROFS: "read-only filesystem; choose a writable -o",
    }
    reason = hints.get(exc.errno or 0, exc.strerror or str(exc))
    return OutputError(f"cannot write {what}: {reason}")
