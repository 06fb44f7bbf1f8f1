"""The options that shape a compiled output, shared by `compile` and `split` (a part compiles as the whole would)."""

from __future__ import annotations

from typing import Any

import click

from ortcompile.cli.params import ByteSize, KeyValue, PartitionSize, pairs
from ortcompile.errors import UsageError

_SHAPING = [
    click.option("--ep", default="auto", show_default=True, help="Execution provider: qnn, openvino, webgpu, cpu, auto, or a full EP name."),
    click.option("--ep-option", "ep_options", multiple=True, type=KeyValue("htp_performance_mode=burst"), help="Provider option (repeatable)."),
    click.option("--target", default=None, help="Device generation to compile for, real or virtual (see 'ortcompile eps --targets')."),
    click.option("--ep-library", default=None, type=click.Path(dir_okay=False, path_type=str),
                 help="Register this plugin EP library (a shared library) under the EP name given with --ep."),
    click.option("--inline-threshold", type=ByteSize(), default="1024", show_default=True, help="Initializers smaller than this stay in the graph proto."),
    click.option("--align", type=ByteSize(), default="4096", show_default=True, help="Offset alignment of large initializers in the data file."),
    click.option("--align-threshold", type=ByteSize(), default="1MiB", show_default=True,
                 help="Initializers at least this big get --align; smaller ones natural alignment."),
    click.option("--shard-size", type=ByteSize(), default=None, help="Split external data into files of at most this size (.data, .data.1, ...)."),
    click.option("--embed", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True,
                 help="Embed EP blobs in the model (auto: only small ones)."),
    click.option("--fix-dim", "fix_dims", multiple=True, type=KeyValue("batch=1", "NAME=VALUE"), help="Pin a symbolic dimension (repeatable)."),
    click.option("--fix-shape", "fix_shapes", multiple=True, metavar="INPUT=D0,D1,...", help="Pin an input's shape (repeatable)."),
    click.option("--freeze", "freeze", multiple=True, type=KeyValue("sr=16000", "INPUT=VALUE"),
                 help="Specialize the model on an input's value (an If switching on it is decided at compile time; repeatable)."),
    click.option("--prepare/--no-prepare", default=True, show_default=True,
                 help="Compiling EPs: pin the dims in the graph and fold constants (ORT basic optimization) before the EP sees it."),
    click.option("--partition", type=PartitionSize(), default=None,
                 help="Compile as parts of at most SIZE of weights (auto: the EP's graph limit), each in its own child process, then stitch them."),
    click.option("--max-context-size", type=ByteSize(), default=None, help="Largest EP graph to compile at once (implies --partition auto)."),
    click.option("--check", "check_mode", type=click.Choice(["auto", "none", "load", "run"]), default="auto", show_default=True,
                 help="Before publishing, open the output on its EP in a child process: load it, or load, run and compare with the source "
                      "(auto: run up to 1 GiB of weights, else load)."),
    click.option("--require-compiled/--allow-partial", default=None, help="Whether 'no node compiled' is an error [default: error for compiling EPs]."),
]
SHAPING_NAMES = ("ep", "ep_options", "target", "ep_library", "inline_threshold", "align", "align_threshold", "shard_size", "embed", "fix_dims",
                 "fix_shapes", "freeze", "prepare", "partition", "max_context_size", "check_mode", "require_compiled")


def shaping_options(func: Any) -> Any:
    for option in reversed(_SHAPING):
        func = option(func)
    return func


def take_shaping(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Remove the shaping options from a command's keyword arguments (the rest are the command's own)."""
    return {name: kwargs.pop(name) for name in SHAPING_NAMES}


def shaping_to_options(shaping: dict[str, Any], jobs: int | None = None, memory_budget: int | None = None, **rest: Any) -> Any:
    """CompileOptions from the shaping options (and any other CompileOptions field in `rest`)."""
    from ortcompile.compile.freeze import parse_freeze
    from ortcompile.compile.layout import LayoutPolicy
    from ortcompile.compile.shapes import parse_fix_dims, parse_fix_shapes
    from ortcompile.options import CompileOptions

    return CompileOptions(
        ep=shaping["ep"],
        ep_options=pairs(shaping["ep_options"]),
        target=shaping["target"],
        ep_library=shaping["ep_library"],
        layout=LayoutPolicy(shaping["inline_threshold"], shaping["align"], shaping["align_threshold"], shaping["shard_size"]),
        embed=shaping["embed"],
        fix_dims=parse_fix_dims(shaping["fix_dims"]),
        fix_shapes=parse_fix_shapes(shaping["fix_shapes"]),
        freeze=parse_freeze(shaping["freeze"]),
        prepare=shaping["prepare"],
        partition=_partition(shaping["partition"], shaping["max_context_size"], jobs, memory_budget),
        max_context_size=shaping["max_context_size"],
        check=shaping["check_mode"],
        require_compiled=shaping["require_compiled"],
        **rest,
    )


def _partition(size: int | None, max_context_size: int | None, jobs: int | None, memory_budget: int | None) -> Any:
    """--partition SIZE|auto, or --max-context-size alone; --jobs/--memory-budget without them would do nothing: refused."""
    if size is None and max_context_size is None:
        if jobs is not None or memory_budget is not None:
            raise UsageError("--jobs/--memory-budget schedule the parts of --partition: add --partition auto (or a size)")
        return None
    from ortcompile.options import PartitionOptions

    return PartitionOptions(size or None, jobs, memory_budget)
