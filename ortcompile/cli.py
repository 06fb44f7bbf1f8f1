"""Command-line interface: parse, call the library, print. Errors become exit codes here and only here."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ortcompile import __version__
from ortcompile.errors import Interrupted, OrtCompileError, OrtCompileWarning, UsageError

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6, "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30}


class ByteSize(click.ParamType):
    """A size such as 4096, 4K, 64MiB, 2G (K/M/G and KiB/MiB/GiB are powers of 1024; KB/MB/GB of 1000)."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(value))
        unit = match.group(2).lower() if match else ""
        if not match or unit not in _SIZE_UNITS:
            self.fail(f"{value!r} is not a size (examples: 4096, 4K, 64MiB, 2G)", param, ctx)
        return int(match.group(1)) * _SIZE_UNITS[unit]


def tolerance_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--rtol/--atol for output comparison (numpy.isclose semantics)."""
    func = click.option("--atol", type=float, default=1e-4, show_default=True, help="Absolute tolerance when comparing outputs.")(func)
    func = click.option("--rtol", type=float, default=1e-3, show_default=True, help="Relative tolerance when comparing outputs.")(func)
    return func


def output_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """-q/-v/--json/--debug, shared by every command."""
    func = click.option("--debug", is_flag=True, help="Show Python tracebacks for errors.")(func)
    func = click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")(func)
    func = click.option("-v", "--verbose", is_flag=True, help="Say more: decisions, fallbacks, error detail.")(func)
    func = click.option("-q", "--quiet", is_flag=True, help="No progress, no summary (errors still go to stderr).")(func)
    return func


def reports_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """The single place where exceptions become a one-line message and an exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        verbose, debug = kwargs.get("verbose", False), kwargs.get("debug", False)
        _raise_on_termination_signals()
        _show_warnings(quiet=kwargs.get("quiet", False))
        try:
            return func(*args, **kwargs)
        except OrtCompileError as exc:
            _fail(f"error: {exc.message}", exc.exit_code, exc.detail if (verbose or debug) else None, debug)
        except KeyboardInterrupt as exc:
            signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
            click.echo(f"ortcompile: interrupted ({signal.Signals(signum).name}); nothing was published", err=True)
            sys.stderr.flush()
            # The EP may still be compiling in its worker thread: end the process now, without waiting for it.
            os._exit(128 + signum)
        except click.exceptions.Exit:
            raise
        except Exception as exc:  # a bug in ortcompile: say so, keep the traceback behind --debug
            _fail(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug and report it)", 1, None, debug)

    return wrapper


def _show_warnings(quiet: bool) -> None:
    """Library warnings become one 'ortcompile: warning:' line each on stderr; -q silences them."""
    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        click.echo(f"ortcompile: warning: {message}", err=True)

    warnings.simplefilter("ignore" if quiet else "always", OrtCompileWarning)
    warnings.showwarning = show  # type: ignore[assignment]


def _raise_on_termination_signals() -> None:
    """SIGINT and SIGTERM (CI timeouts, make being stopped) end the run the same way: staged files removed."""

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)


def _fail(message: str, code: int, detail: str | None, debug: bool) -> None:
    if debug:
        traceback.print_exc()
    click.echo(f"ortcompile: {message}", err=True)
    if detail:
        click.echo(detail.rstrip(), err=True)
    sys.exit(code)


def run() -> None:
    """The console-script entry point: main(), then leave without native library teardown.

    Everything we write is fsynced and published before this point; skipping interpreter and ONNX
    Runtime teardown avoids EP plugins that abort in their static destructors (QNN does, after a
    failed shared-context compile) turning a clean exit code into a crash.
    """
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            click.echo(str(exc.code), err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ortcompile")
def main() -> None:
    """Compile ONNX models into ONNX Runtime EPContext models, of any size."""


@main.command("compile")
@click.argument("models", nargs=-1, required=True, type=click.Path(dir_okay=True, path_type=str))
@click.option("-o", "--output-dir", required=True, type=click.Path(path_type=str), help="Directory for the compiled model and its files.")
@click.option("--ep", default="auto", show_default=True, help="Execution provider: qnn, openvino, webgpu, cpu, auto, or a full EP name.")
@click.option("--ep-option", "ep_options", multiple=True, metavar="KEY=VALUE", help="Provider option (repeatable).")
@click.option("--inline-threshold", type=ByteSize(), default="1024", show_default=True, help="Initializers smaller than this stay in the graph proto.")
@click.option("--align", type=ByteSize(), default="4096", show_default=True, help="Offset alignment of large initializers in the data file.")
@click.option("--align-threshold", type=ByteSize(), default="1MiB", show_default=True, help="Initializers at least this big get --align; smaller ones natural alignment.")
@click.option("--shard-size", type=ByteSize(), default=None, help="Split external data into files of at most this size (.data, .data.1, ...).")
@click.option("--embed", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True, help="Embed EP blobs in the model (auto: only small ones).")
@click.option("--fix-dim", "fix_dims", multiple=True, metavar="NAME=VALUE", help="Pin a symbolic dimension (repeatable).")
@click.option("--fix-shape", "fix_shapes", multiple=True, metavar="INPUT=D0,D1,...", help="Pin an input's shape (repeatable).")
@click.option("--require-compiled/--allow-partial", default=None, help="Whether 'no node compiled' is an error [default: error for compiling EPs].")
@click.option("--force", is_flag=True, help="Replace earlier outputs of the same model.")
@click.option("--share-weights", is_flag=True, help="Batch: store identical weights once and share the EP context across the models.")
@click.option("--if-changed", is_flag=True, help="Do nothing if the output is current (same input digest, options, versions); else rebuild it.")
@click.option("--depfile", type=click.Path(dir_okay=False, path_type=str), default=None, help="Write a Make dependency file (like gcc -MD).")
@click.option("--verify", "verify", is_flag=True, help="Compare with the source before publishing; on mismatch publish nothing (exit 5).")
@tolerance_options
@output_options
@reports_errors
def compile_command(models: tuple[str, ...], output_dir: str, ep: str, ep_options: tuple[str, ...], inline_threshold: int, align: int,
                    align_threshold: int, shard_size: int | None, embed: str, fix_dims: tuple[str, ...], fix_shapes: tuple[str, ...],
                    require_compiled: bool | None, force: bool, share_weights: bool, if_changed: bool, depfile: str | None, verify: bool, rtol: float, atol: float,
                    quiet: bool, verbose: bool, as_json: bool, debug: bool) -> None:
    """Compile MODELS into EPContext models in OUTPUT_DIR (one at a time, atomically)."""
    from ortcompile.compile.layout import LayoutPolicy
    from ortcompile.compile.shapes import parse_fix_dims, parse_fix_shapes
    from ortcompile.eps import parse_ep_options
    from ortcompile.native import set_ort_log_level
    from ortcompile.options import CompileOptions, Tolerance
    from ortcompile.progress import TerminalReporter

    set_ort_log_level(verbose)
    options = CompileOptions(
        ep=ep,
        ep_options=parse_ep_options(ep_options),
        layout=LayoutPolicy(inline_threshold, align, align_threshold, shard_size),
        embed=embed,  # type: ignore[arg-type]
        fix_dims=parse_fix_dims(fix_dims),
        fix_shapes=parse_fix_shapes(fix_shapes),
        require_compiled=require_compiled,
        force=force,
        verify=verify,
        verify_tolerance=Tolerance(rtol, atol),
        if_changed=if_changed,
    )
    results = []
    if share_weights:
        from ortcompile.compile.sharing import compile_shared

        if if_changed:
            raise UsageError("--if-changed does not work with --share-weights yet; rebuild the batch with --force")
        reporter = TerminalReporter(show_progress=not quiet and not as_json, verbose=verbose)
        results = compile_shared([Path(m) for m in models], Path(output_dir), options, reporter)
    else:
        from ortcompile.compile.batch import compile_batch

        make_reporter = functools.partial(TerminalReporter, show_progress=not quiet and not as_json, verbose=verbose)
        results = compile_batch(list(models), output_dir, options, make_reporter, verbose)
    if depfile:
        from ortcompile.output.incremental import depfile_rule, write_depfile

        write_depfile(Path(depfile), [depfile_rule(r.model_path, r.inputs) for r in results])
    if as_json:
        click.echo(_json({"outputs": [r.to_json() for r in results]}, indent=2))
    elif not quiet:
        for result in results:
            click.echo(_summary_line(result))


def _json(document: Any, indent: int = 2) -> str:
    """JSON for scripts: strict RFC 8259 (a NaN or infinity is a bug, not output)."""
    return json.dumps(document, indent=indent, allow_nan=False)


def _summary_line(result: Any) -> str:
    from ortcompile.render import human_size

    if result.up_to_date:
        return f"{result.model_path}: up to date"
    total = sum(f["size"] for f in result.files)
    nodes = f"{result.epcontext_nodes} EPContext node{'s' if result.epcontext_nodes != 1 else ''}"
    return f"{result.model_path}: {nodes}, {len(result.files)} files, {human_size(total)}, {result.timings.get('compile', 0):.1f}s compile ({result.ep})"


@main.command("inspect")
@click.argument("model", type=click.Path(path_type=str))
@click.option("--check", is_flag=True, help="Hash every file the manifest lists (reads all the data).")
@output_options
@reports_errors
def inspect_command(model: str, check: bool, quiet: bool, verbose: bool, as_json: bool, debug: bool) -> None:
    """Show what MODEL contains, from its graph proto alone (weights are never read)."""
    from ortcompile.readback.inspect import inspect_model
    from ortcompile.render import inspect_text

    report = inspect_model(model, check=check).to_json()
    if as_json:
        click.echo(_json(report, indent=2))
    elif not quiet:
        click.echo("\n".join(inspect_text(report)))
    if check and report["problems"]:  # without --check, problems are reported, not fatal
        from ortcompile.errors import VerificationFailed

        raise VerificationFailed("check failed: " + "; ".join(report["problems"]))


@main.command("verify")
@click.argument("compiled", type=click.Path(path_type=str))
@click.option("--reference", required=True, type=click.Path(path_type=str), help="The source model the compiled one came from.")
@click.option("--ep", default=None, help="EP to run the compiled model on [default: the one in its manifest, else auto].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the generated inputs.")
@click.option("--runs", type=click.IntRange(min=1), default=1, show_default=True, help="Runs, with seeds seed, seed+1, ...")
@click.option("--fix-dim", "fix_dims", multiple=True, metavar="NAME=VALUE", help="Value of a symbolic dimension [default: 1].")
@click.option("--time-source/--no-time-source", default=True, show_default=True, help="Also time a session from the source on the same EP.")
@tolerance_options
@output_options
@reports_errors
def verify_command(compiled: str, reference: str, ep: str | None, seed: int, runs: int, fix_dims: tuple[str, ...], time_source: bool,
                   rtol: float, atol: float, quiet: bool, verbose: bool, as_json: bool, debug: bool) -> None:
    """Check COMPILED against its manifest, then its outputs against the source on the CPU EP (exit 5 on mismatch)."""
    from ortcompile.compile.shapes import parse_fix_dims
    from ortcompile.errors import VerificationFailed
    from ortcompile.native import set_ort_log_level
    from ortcompile.options import Tolerance
    from ortcompile.readback.verify import verify_model
    from ortcompile.render import verify_text

    set_ort_log_level(verbose)
    result = verify_model(compiled, reference, ep=ep, tolerance=Tolerance(rtol, atol), seed=seed, runs=runs,
                          fix_dims=parse_fix_dims(fix_dims), time_source=time_source)
    report = result.to_json()
    if as_json:
        click.echo(_json(report, indent=2))
    elif not quiet:
        click.echo("\n".join(verify_text(report)))
    if not result.ok:
        raise VerificationFailed(result.failure())


@main.command("eps")
@output_options
@reports_errors
def eps_command(quiet: bool, verbose: bool, as_json: bool, debug: bool) -> None:
    """List execution providers, the devices they claim here, and whether they produce EPContext."""
    from ortcompile.eps import list_eps
    from ortcompile.native import set_ort_log_level

    set_ort_log_level(verbose)
    listings = list_eps()
    if as_json:
        click.echo(_json({"eps": [e.to_json() for e in listings]}, indent=2))
        return
    if quiet:
        return
    click.echo(f"{'NAME':<10} {'EP':<28} {'AVAILABLE':<10} {'EPCONTEXT':<10} DEVICES / NOTE")
    for entry in listings:
        info = entry.to_json()
        devices = ", ".join(f"{d['type']} ({d['vendor']})" for d in entry.devices)
        click.echo(f"{entry.short_name:<10} {entry.ep_name:<28} {'yes' if info['available'] else 'no':<10} "
                   f"{'yes' if entry.compiles else 'no':<10} {devices or entry.note}")


@main.command("bench")
@click.argument("models", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--memory-budget", type=ByteSize(), default=None, help="Keep models resident while they fit this much RSS [default: no limit].")
@click.option("--cycles", type=click.IntRange(min=1), default=3, show_default=True, help="Times the whole pipeline runs.")
@click.option("--ep", default="auto", show_default=True, help="Execution provider to run on.")
@click.option("--ep-option", "ep_options", multiple=True, metavar="KEY=VALUE", help="Provider option (repeatable).")
@click.option("--graph-capture", is_flag=True, help="Capture and replay each session's graph (webgpu); evictions release it.")
@click.option("--reference", "references", multiple=True, type=click.Path(path_type=str),
              help="Source model for each MODEL, in order: outputs must match it on the CPU EP (repeatable).")
@click.option("--fix-dim", "fix_dims", multiple=True, metavar="NAME=VALUE", help="Value of a symbolic dimension [default: 1].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the generated inputs.")
@click.option("--ort-log-level", type=click.IntRange(0, 4), default=None, help="ONNX Runtime log severity (0 verbose ... 4 fatal).")
@tolerance_options
@output_options
@reports_errors
def bench_command(models: tuple[str, ...], memory_budget: int | None, cycles: int, ep: str, ep_options: tuple[str, ...], graph_capture: bool,
                  references: tuple[str, ...], fix_dims: tuple[str, ...], seed: int, ort_log_level: int | None, rtol: float, atol: float,
                  quiet: bool, verbose: bool, as_json: bool, debug: bool) -> None:
    """Run MODELS as a pipeline through a session residency pool; check every output on every cycle (exit 5 on mismatch)."""
    from ortcompile.compile.shapes import parse_fix_dims
    from ortcompile.eps import parse_ep_options
    from ortcompile.errors import VerificationFailed
    from ortcompile.native import set_ort_log_level
    from ortcompile.options import Tolerance
    from ortcompile.render import bench_text
    from ortcompile.run.pipeline import run_pipeline

    set_ort_log_level(verbose, ort_log_level)
    if references and len(references) != len(models):
        raise UsageError(f"--reference given {len(references)} times for {len(models)} models: give one per model, in order")
    report = run_pipeline([Path(m) for m in models], memory_budget, cycles, ep, parse_ep_options(ep_options), graph_capture,
                          [Path(r) for r in references] or None, parse_fix_dims(fix_dims), seed, Tolerance(rtol, atol))
    if as_json:
        click.echo(_json(report.to_json(), indent=2))
    elif not quiet:
        click.echo("\n".join(bench_text(report.to_json())))
    if not report.ok:
        bad = next(m for m in report.models if m.mismatches)
        raise VerificationFailed(f"{bad.name}: output differs from its reference on {len(bad.mismatches)} run(s)")
