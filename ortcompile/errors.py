"""One exception hierarchy; every error knows its exit code (see docs/exit-codes)."""

from __future__ import annotations


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


class OrtCompileWarning(UserWarning):
    """Something the user may want to know that does not stop the work (the CLI prints it unless -q)."""


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


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's text: ORT messages carry multi-line tracebacks."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__
