"""Several models in one command: each compiled in a fresh child process, one after another.

Why a process per model: the QNN backend keeps process-global counters that end up in the context
binary, so a model compiled after another one in the same process gets different blob bytes than the
same model compiled alone (measured: 37 bytes of tensor ids). A fresh process per model makes a batch
byte-identical to single runs, and it returns every byte of one model's memory before the next starts,
so a batch peaks at its largest model, not at the sum.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ortcompile.compile.job import compile_model
from ortcompile.errors import CompilationFailed, Interrupted, OrtCompileError, UsageError
from ortcompile.naming import OutputNames
from ortcompile.options import CompileOptions, CompileResult
from ortcompile.progress import Reporter

ReporterFactory = Callable[[], Reporter]


def compile_batch(models: list[str | os.PathLike[str]], output_dir: str | os.PathLike[str], options: CompileOptions,
                  make_reporter: ReporterFactory, verbose: bool = False) -> list[CompileResult]:
    """Compile each model into `output_dir`; a single model runs in this process."""
    targets = [OutputNames.for_source(Path(m)).model for m in models]
    clash = next((t for t in targets if targets.count(t) > 1), None)
    if clash is not None:
        raise UsageError(f"two models would both be compiled to {clash} in one directory; rename one or use two -o")
    if len(models) == 1:
        return [compile_model(models[0], output_dir, options, make_reporter())]
    return [_compile_in_child(Path(m), Path(output_dir), options, make_reporter, verbose) for m in models]


def _compile_in_child(model: Path, output_dir: Path, options: CompileOptions, make_reporter: ReporterFactory, verbose: bool) -> CompileResult:
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child_main, args=(sender, model, output_dir, options, make_reporter, verbose), daemon=True)
    child.start()
    sender.close()
    try:
        outcome = _wait_for(child, receiver)
    except KeyboardInterrupt:
        _stop(child)  # SIGTERM: the child removes its staging directory and exits
        raise
    if outcome is None:
        reason = f"signal {signal.Signals(-child.exitcode).name}" if child.exitcode and child.exitcode < 0 else f"exit code {child.exitcode}"
        raise CompilationFailed(f"{model}: the compiling process died ({reason}) before reporting a result")
    kind, payload = outcome
    if kind == "error":
        if isinstance(payload, OrtCompileError) and str(model) not in payload.message:
            payload.message = f"{model}: {payload.message}"  # in a batch, say which model failed
        raise payload
    return payload


def _wait_for(child: Any, receiver: Connection) -> tuple[str, Any] | None:
    while True:
        if receiver.poll(0.2):
            try:
                outcome = receiver.recv()
            except EOFError:
                outcome = None
            child.join()
            return outcome
        if not child.is_alive():
            child.join()
            return receiver.recv() if receiver.poll() else None


def _stop(child: Any) -> None:
    if child.is_alive():
        child.terminate()
        child.join(10)
    if child.is_alive():
        child.kill()
        child.join()


def _child_main(sender: Connection, model: Path, output_dir: Path, options: CompileOptions, make_reporter: ReporterFactory, verbose: bool) -> None:
    from ortcompile.native import set_ort_log_level

    def interrupted(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    set_ort_log_level(verbose)
    try:
        sender.send(("ok", compile_model(model, output_dir, options, make_reporter())))
    except BaseException as exc:  # handed to the parent, which raises it
        sender.send(("error", exc))
    sender.close()
    os._exit(0)  # skip EP teardown (see cli.run)
