"""Command-line interface: parse, call the library, print. Errors become exit codes in `output.report_exception`.

One module per command; this one holds the group, the global options and the process entry point.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import click

from ortcompile.child import allow_forks
from ortcompile.cli.output import Output, flush, library_warnings, output_options, report_exception, report_interrupt
from ortcompile.errors import Interrupted
from ortcompile.native import logging_settings
from ortcompile.version import __version__


class _Stopped(BaseException):
    """SIGINT/SIGTERM while a command ran; carried past click (which would turn it into "Aborted!")."""

    def __init__(self, signum: int, published: list[str]) -> None:
        super().__init__(signum)
        self.signum = signum
        self.published = published  # outputs of a batch finished before the signal
        self.out = Output()


class OrtcompileGroup(click.Group):
    """Every outcome, click's own usage errors included, leaves as one line on stderr and an exit code."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        out = Output(as_json="--json" in argv, debug="--debug" in argv, verbose="-v" in argv or "--verbose" in argv)
        with library_warnings(), logging_settings():
            try:
                value = super().main(argv, prog_name or "ortcompile", complete_var, standalone_mode=False, obj=out, **extra)
                code = value if isinstance(value, int) else 0
            except _Stopped as stop:
                stop.out = out  # the report (with --json, on stdout too) is printed once the signal handlers are done
                raise
            except Exception as exc:  # ClickException, OrtCompileError, or a bug: all reported the same way
                code = report_exception(exc, out)
        if standalone_mode:
            sys.exit(code)
        return code

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            published = [str(p) for p in getattr(exc, "published", [])]  # set by compile_models
            raise _Stopped(exc.signum if isinstance(exc, Interrupted) else signal.SIGINT, published) from None


@click.group(cls=OrtcompileGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.version_option(__version__, prog_name="ortcompile")
@output_options
def main() -> None:
    """Compile ONNX models into ONNX Runtime EPContext models, of any size."""


def run() -> None:
    """The console-script entry point: main(), then leave without native library teardown.

    Everything we write is fsynced and published before this point; skipping interpreter and ONNX
    Runtime teardown avoids EP plugins that abort in their static destructors (QNN does, after a
    failed shared-context compile) turning a clean exit code into a crash.
    """
    _raise_on_termination_signals()
    allow_forks()  # one-shot children may be forks of this process (child.run_child)
    try:
        code = main.main(standalone_mode=False)
    except _Stopped as stop:
        code = report_interrupt(stop.signum, stop.published, stop.out)
    flush()
    os._exit(code if isinstance(code, int) else 1)


def _raise_on_termination_signals() -> None:
    """SIGINT and SIGTERM (CI timeouts, make being stopped) end the run the same way: staged files removed."""

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)


def _register_commands() -> None:
    from ortcompile.cli import bench, check, compile, eps, inspect, llm, split, stitch, verify

    for module in (compile, split, stitch, inspect, verify, check, eps, bench, llm):
        main.add_command(module.command)


_register_commands()
