"""What the CLI prints, and the one place where errors become a message and an exit code.

Scripts read stdout (a summary line per result, or one JSON document with --json) and the exit code;
people read stderr (one `ortcompile: error: ...` line, `ortcompile: warning: ...` lines, progress).
-q/-v/--json/--debug are accepted before and after the command name.
"""

from __future__ import annotations

import json
import sys
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import click

from ortcompile.errors import InternalError, OrtCompileError, OrtCompileWarning
from ortcompile.jsonedge import JsonObject

EXIT_USAGE = 2
EXIT_INTERNAL = InternalError.exit_code


@dataclass
class Output:
    """The global output options of one invocation (the group's and the command's, either place)."""

    quiet: bool = False
    verbose: bool = False
    as_json: bool = False
    debug: bool = False
    printed_json: bool = False  # a command's JSON result is out: an error after it must not add a second document

    def reporter(self) -> Any:
        from ortcompile.progress import TerminalReporter

        return TerminalReporter(show_progress=not self.quiet and not self.as_json, verbose=self.verbose)

    def json(self, document: Any) -> None:
        """JSON for scripts: strict RFC 8259 (a NaN or infinity is a bug, not output)."""
        click.echo(json.dumps(document, indent=2, allow_nan=False))
        self.printed_json = True

    def lines(self, lines: list[str] | str) -> None:
        if not self.quiet:
            click.echo("\n".join(lines) if isinstance(lines, list) else lines)

    def result(self, document: Any, lines: list[str] | str) -> None:
        """The command's result: JSON, or text lines unless -q."""
        if self.as_json:
            self.json(document)
        else:
            self.lines(lines)

    def warning(self, message: str) -> None:
        """Always shown, -q too: -q hides progress, never what the user may need to act on."""
        click.echo(f"ortcompile: warning: {message}", err=True)

    def error(self, message: str, code: int, detail: str | None = None, kind: str = "OrtCompileError", prefix: str = "error: ",
              extra: JsonObject | None = None) -> int:
        """One line on stderr (detail under -v); with --json also a JSON object on stdout. Returns the exit code.
        `kind`: the error's class name, for scripts reading the JSON; `extra`: more JSON (a refusal's divergence table)."""
        if self.debug:
            traceback.print_exc()
        click.echo(f"ortcompile: {prefix}{_one_line(message)}", err=True)
        if detail and (self.verbose or self.debug):
            click.echo(detail.rstrip(), err=True)
        if self.as_json and not self.printed_json:
            self.json({"error": {"message": _one_line(message), "exit_code": code, "kind": kind, **(extra or {})}})
        return code


def current() -> Output:
    """The Output of the running command (a fresh default outside one)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return Output()
    return ctx.find_root().ensure_object(Output)


def output_options(func: Any) -> Any:
    """-q/-v/--json/--debug on the group and on every command: set in either place, they apply."""

    def set_flag(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value:
            setattr(ctx.find_root().ensure_object(Output), str(param.name), True)

    for flags, name, text in (
        (("--debug",), "debug", "Show Python tracebacks for errors."),
        (("--json",), "as_json", "Print a JSON document on stdout (errors too)."),
        (("-v", "--verbose"), "verbose", "Say more: decisions, placement, error detail, native logs."),
        (("-q", "--quiet"), "quiet", "No progress, no summary (warnings and errors still go to stderr)."),
    ):
        func = click.option(*flags, name, is_flag=True, expose_value=False, callback=set_flag, help=text)(func)
    return func


def report_exception(exc: BaseException, out: Output) -> int:
    """Every exception that ends a command, as one line and an exit code (the only such mapping)."""
    if isinstance(exc, OrtCompileError):
        return out.error(exc.message, exc.exit_code, exc.detail, kind=type(exc).__name__, extra=getattr(exc, "json_detail", None))
    if isinstance(exc, click.exceptions.Exit):
        return exc.exit_code
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):  # bare `ortcompile`: the usage and help, as click prints it
        exc.show()
        return EXIT_USAGE
    if isinstance(exc, click.UsageError):
        where = f"{exc.ctx.info_name}: " if exc.ctx is not None and exc.ctx.parent is not None else ""
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        return out.error(f"{where}{_lower_first(exc.format_message()).rstrip('.')}{hint}", EXIT_USAGE, kind="UsageError")
    if isinstance(exc, click.ClickException):
        return out.error(exc.format_message(), exc.exit_code, kind=type(exc).__name__)
    return out.error(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug and report it)", EXIT_INTERNAL, kind=InternalError.__name__)


def report_interrupt(signum: int, published: list[str], out: Output) -> int:
    """SIGINT/SIGTERM: one line saying what was published (a batch keeps the models finished before it), JSON too."""
    import signal

    kept = f"published before it: {', '.join(published)}; nothing else was" if published else "nothing was published"
    return out.error(f"interrupted ({signal.Signals(signum).name}); {kept}", 128 + signum, kind="Interrupted", prefix="")


@contextmanager
def library_warnings() -> Iterator[None]:
    """Library warnings become one `ortcompile: warning:` line each (-q too), for this command only."""

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        current().warning(str(message))

    with warnings.catch_warnings():
        warnings.simplefilter("always", OrtCompileWarning)
        warnings.showwarning = show  # type: ignore[assignment]
        yield


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text


def flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
