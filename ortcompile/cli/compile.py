"""`ortcompile compile`: MODELS into EPContext models in one output directory, each atomically."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ortcompile.cli.output import current, output_options
from ortcompile.cli.params import ByteSize, KeyValue, criterion_options, criterion_settings, given_inputs, input_options, pairs
from ortcompile.errors import UsageError

if TYPE_CHECKING:
    from ortcompile.options import CompileResult


@click.command("compile")
@click.argument("models", nargs=-1, required=True, type=click.Path(dir_okay=True, path_type=str))
@click.option("-o", "--output-dir", required=True, type=click.Path(path_type=str), help="Directory for the compiled model and its files.")
@click.option("--ep", default="auto", show_default=True, help="Execution provider: qnn, openvino, webgpu, cpu, auto, or a full EP name.")
@click.option("--ep-option", "ep_options", multiple=True, type=KeyValue("htp_performance_mode=burst"), help="Provider option (repeatable).")
@click.option("--target", default=None, help="Device generation to compile for, real or virtual (see 'ortcompile eps --targets').")
@click.option("--ep-library", default=None, type=click.Path(dir_okay=False, path_type=str),
              help="Register this plugin EP library (a shared library) under the EP name given with --ep.")
@click.option("--inline-threshold", type=ByteSize(), default="1024", show_default=True, help="Initializers smaller than this stay in the graph proto.")
@click.option("--align", type=ByteSize(), default="4096", show_default=True, help="Offset alignment of large initializers in the data file.")
@click.option("--align-threshold", type=ByteSize(), default="1MiB", show_default=True,
              help="Initializers at least this big get --align; smaller ones natural alignment.")
@click.option("--shard-size", type=ByteSize(), default=None, help="Split external data into files of at most this size (.data, .data.1, ...).")
@click.option("--embed", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True,
              help="Embed EP blobs in the model (auto: only small ones).")
@click.option("--fix-dim", "fix_dims", multiple=True, type=KeyValue("batch=1", "NAME=VALUE"), help="Pin a symbolic dimension (repeatable).")
@click.option("--fix-shape", "fix_shapes", multiple=True, metavar="INPUT=D0,D1,...", help="Pin an input's shape (repeatable).")
@click.option("--freeze", "freeze", multiple=True, type=KeyValue("sr=16000", "INPUT=VALUE"),
              help="Specialize the model on an input's value (an If switching on it is decided at compile time; repeatable).")
@click.option("--prepare/--no-prepare", default=True, show_default=True,
              help="Compiling EPs: pin the dims in the graph and fold constants (ORT basic optimization) before the EP sees it.")
@click.option("--check", "check_mode", type=click.Choice(["none", "load", "run"]), default="run", show_default=True,
              help="Before publishing, open the output on its EP in a child process: load it, or load, run and compare with the source.")
@click.option("--require-compiled/--allow-partial", default=None, help="Whether 'no node compiled' is an error [default: error for compiling EPs].")
@click.option("--force", is_flag=True, help="Replace earlier outputs of the same model.")
@click.option("--share-weights", is_flag=True, help="Batch: store identical weights once and share the EP context across the models.")
@click.option("--if-changed", is_flag=True, help="Do nothing if the output is current (same input digest, options, versions); else rebuild it.")
@click.option("--depfile", type=click.Path(dir_okay=False, path_type=str), default=None, help="Write a Make dependency file (like gcc -MD).")
@click.option("--verify", "verify", is_flag=True, help="Compare with the source before publishing; on mismatch publish nothing (exit 5).")
@input_options(with_dims=False)
@criterion_options
@output_options
def command(models: tuple[str, ...], output_dir: str, ep: str, ep_options: tuple[tuple[str, str], ...], target: str | None,
            ep_library: str | None, inline_threshold: int, align: int,
            align_threshold: int, shard_size: int | None, embed: str, fix_dims: tuple[tuple[str, str], ...], fix_shapes: tuple[str, ...],
            freeze: tuple[tuple[str, str], ...], prepare: bool, check_mode: str, require_compiled: bool | None, force: bool, share_weights: bool, if_changed: bool,
            depfile: str | None, verify: bool, input_args: tuple[str, ...], inputs_file: str | None, precision: str | None,
            **criterion: Any) -> None:
    """Compile MODELS into EPContext models in OUTPUT_DIR (one at a time, atomically)."""
    from ortcompile.compile.freeze import parse_freeze
    from ortcompile.compile.layout import LayoutPolicy
    from ortcompile.compile.shapes import parse_fix_dims, parse_fix_shapes
    from ortcompile.native import set_ort_log_level
    from ortcompile.options import CompileOptions

    out = current()
    set_ort_log_level(out.verbose)
    options = CompileOptions(
        ep=ep,
        ep_options=pairs(ep_options),
        layout=LayoutPolicy(inline_threshold, align, align_threshold, shard_size),
        embed=embed,  # type: ignore[arg-type]
        fix_dims=parse_fix_dims(fix_dims),
        fix_shapes=parse_fix_shapes(fix_shapes),
        require_compiled=require_compiled,
        force=force,
        verify=verify,
        verify_criterion=_verify_criterion(verify, precision, criterion_settings(criterion)),
        inputs=given_inputs(input_args, inputs_file),
        if_changed=if_changed,
        prepare=prepare,
        freeze=parse_freeze(freeze),
        check=check_mode,  # type: ignore[arg-type]
        target=target,
        ep_library=ep_library,
    )
    if share_weights:
        from ortcompile.compile.sharing import compile_shared

        if if_changed:
            raise UsageError("--if-changed does not work with --share-weights yet; rebuild the batch with --force")
        results = compile_shared([Path(m) for m in models], Path(output_dir), options, out.reporter())
    else:
        from ortcompile.compile.job import compile_models

        results = compile_models(list(models), output_dir, options, out.reporter())
    if depfile:
        from ortcompile.output.incremental import depfile_rule, write_depfile

        write_depfile(Path(depfile), [depfile_rule(r.model_path, r.inputs) for r in results])
    out.result({"outputs": [r.to_json() for r in results]}, [summary_line(r) for r in results])


def _verify_criterion(verify: bool, precision: str | None, settings: dict[str, Any]) -> dict[str, Any]:
    """The criterion options apply to --verify only: without it they would do nothing, so say so."""
    if not verify and (settings or precision):
        raise UsageError(f"{', '.join('--' + k.replace('_db', '').replace('_', '-') for k in settings) or '--precision'}: "
                         "only used by --verify (the pre-publish check uses its own loose criterion); add --verify or drop it")
    return {**settings, **({"precision": precision} if precision else {})}


def summary_line(result: CompileResult) -> str:
    from ortcompile.cli.render import human_size, plural

    if result.up_to_date:
        return f"{result.model_path}: up to date"
    total = sum(f["size"] for f in result.files)
    return (f"{result.model_path}: {plural(result.epcontext_nodes, 'EPContext node')}, {plural(len(result.files), 'file')}, "
            f"{human_size(total)}, {result.timings.get('compile', 0):.1f}s compile ({result.ep})")
