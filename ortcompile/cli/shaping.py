"""The options that shape a compiled output, shared by `compile` and `split` (a part compiles as the whole would),
and the config file (ortcompile/config.py) that gives each model its own."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import click
from click.core import ParameterSource

from ortcompile.cli.output import current
from ortcompile.cli.params import ByteSize, KeyValue, PartitionSize, PositiveByteSize, pairs
from ortcompile.configkeys import KEYS
from ortcompile.errors import UsageError


def complete_ep(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of --ep: the EP names known or installed here (read without importing onnxruntime)."""
    from ortcompile.eps import all_eps  # (here, not at the top: plugin discovery runs only when a shell asks)

    names = [*dict.fromkeys(i.short_name for i in all_eps() if i.ep_name), "auto"]
    return [n for n in names if n.startswith(incomplete.lower())]


def complete_target(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of --target: the --ep's table of targets (every table for auto or an EP without one)."""
    from ortcompile.eps import lookup
    from ortcompile.eps.targets import STATIC_TARGETS, static_targets

    try:
        targets = list(static_targets(lookup(ctx.params.get("ep") or "auto")))
    except UsageError:  # auto, or a name still being typed
        targets = []
    targets = targets or [t for table in STATIC_TARGETS.values() for t in table]
    return [t.name for t in targets if t.name.startswith(incomplete.lower())]


_SHAPING = [
    click.option("--ep", default="auto", show_default=True, shell_complete=complete_ep,
                 help="Execution provider: qnn, openvino, webgpu, cpu, auto, or a full EP name."),
    click.option("--ep-option", "ep_options", multiple=True, type=KeyValue("htp_graph_finalization_optimization_mode=3"), help="Provider option (repeatable)."),
    click.option("--target", default=None, shell_complete=complete_target,
                 help="Device generation to compile for, real or virtual (see 'ortcompile eps --targets')."),
    click.option("--ep-library", default=None, type=click.Path(dir_okay=False, path_type=str),
                 help="Register this plugin EP library (a shared library) under the EP name given with --ep (not cpu: it is built in)."),
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
    click.option("--max-context-size", type=PositiveByteSize(), default=None, help="Largest EP graph to compile at once (implies --partition auto)."),
    click.option("--check", "check_mode", type=click.Choice(["auto", "none", "load", "run"]), default="auto", show_default=True,
                 help="Before publishing, open the output on its EP in a child process: load it, or load, run and compare with the source "
                      "(auto: run up to 1 GiB of weights, else load)."),
    click.option("--require-compiled/--allow-partial", default=None, help="Whether 'no node compiled' is an error [default: error for compiling EPs]."),
    click.option("--cpu-nodes", "cpu_nodes", multiple=True, metavar="PATTERN",
                 help="Keep these nodes off the EP, on the CPU EP: a node name, op:TYPE or a glob (repeatable; QNN: by op type)."),
    click.option("--fallback", "fallback", type=click.Choice(["off", "auto"]), default="off", show_default=True,
                 help="When the check finds outputs that differ: off refuses, naming the node; auto moves the diverging nodes to the "
                      "CPU EP and compiles again (up to 3 rounds)."),
]
CONFIG_ONLY = ("inputs_path",)  # keys whose option is not a shaping option (--inputs is the command's own)
SHAPING_NAMES = tuple(name for name, _ in KEYS.values() if name not in CONFIG_ONLY)  # the options above, as the config file's keys name them
_CONFIG = [
    click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False, path_type=str),
                 help="Settings file (ortcompile.toml, or pyproject.toml with [tool.ortcompile]) [default: $ORTCOMPILE_CONFIG, else found upwards]."),
    click.option("--no-config", is_flag=True, help="Read no settings file: built-in defaults and the command line only."),
]
_GIVEN = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT, ParameterSource.PROMPT)


def shaping_options(func: Any) -> Any:
    for option in reversed([*_SHAPING, *_CONFIG]):
        func = option(func)
    return func


def take_shaping(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Remove the shaping options (and --config/--no-config) from a command's keyword arguments (the rest are the command's own)."""
    return {name: kwargs.pop(name) for name in (*SHAPING_NAMES, "config_path", "no_config")}


def configured(models: list[str], shaping: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], Any]:
    """Each model's settings (built-in < config defaults < matching sections < options given here) and the Config."""
    from ortcompile.config import resolve_config, settings_for_models

    config = resolve_config(shaping["config_path"], enabled=not shaping["no_config"])
    ctx = click.get_current_context()
    passed = {name for name in SHAPING_NAMES if ctx.get_parameter_source(name) in _GIVEN}
    reporter = current().reporter()
    if config.path is not None:
        reporter.detail(f"settings from {config.shown}")
    return settings_for_models(config, models, command_line_values(shaping), passed, note=reporter.detail), config


def command_line_values(shaping: dict[str, Any]) -> dict[str, Any]:
    """The shaping options as the config's merge takes them: repeated KEY=VALUE options as dicts, checked."""
    from ortcompile.compile.freeze import parse_freeze
    from ortcompile.plan.shapes import parse_fix_dims, parse_fix_shapes

    values = {name: shaping[name] for name in SHAPING_NAMES}
    values.update(cpu_nodes=tuple(shaping["cpu_nodes"]), ep_options=pairs(shaping["ep_options"]), fix_dims=parse_fix_dims(shaping["fix_dims"]),
                  fix_shapes=parse_fix_shapes(shaping["fix_shapes"]), freeze=parse_freeze(shaping["freeze"]))
    return values


def check_scheduling(settings: Iterable[dict[str, Any]], jobs: int | None, memory_budget: int | None) -> None:
    """--jobs/--memory-budget schedule the parts of --partition: without any model compiled as parts they would do nothing."""
    if (jobs is not None or memory_budget is not None) and all(s["partition"] is None and s["max_context_size"] is None for s in settings):
        raise UsageError("--jobs/--memory-budget schedule the parts of --partition: add --partition auto (or a size)")
