"""The options that shape a compiled output, shared by `compile` and `split` (a part compiles as the whole would),
and the config file (ortcompile/config.py) that gives each model its own."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from ortcompile.cli.output import current
from ortcompile.cli.params import pairs
from ortcompile.errors import UsageError
from ortcompile.optiontable import shared_settings

if TYPE_CHECKING:
    from ortcompile.config import Config, Settings  # (config loads when a command runs: see LAZY_IMPORTS)

SHAPING_NAMES = tuple(o.setting for o in shared_settings())  # the options compile and split share, as the config's settings name them
_GIVEN = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT, ParameterSource.PROMPT)


def take_shaping(kwargs: dict[str, Any]) -> dict[str, Any]:  # click's keyword arguments, by parameter name
    """Remove the shaping options (and --config/--no-config) from a command's keyword arguments (the rest are the command's own)."""
    return {name: kwargs.pop(name) for name in (*SHAPING_NAMES, "config_path", "no_config")}


def configured(models: list[str], shaping: dict[str, Any]) -> tuple[dict[str, Settings], Config]:  # shaping: take_shaping's
    """Each model's settings (built-in < config defaults < matching sections < options given here) and the Config."""
    from ortcompile.config import resolve_config, settings_for_models

    config = resolve_config(shaping["config_path"], enabled=not shaping["no_config"])
    ctx = click.get_current_context()
    passed = {name for name in SHAPING_NAMES if ctx.get_parameter_source(name) in _GIVEN}
    reporter = current().reporter()
    if config.path is not None:
        reporter.detail(f"settings from {config.shown}")
    return settings_for_models(config, models, command_line_values(shaping), passed, note=reporter.detail), config


def command_line_values(shaping: dict[str, Any]) -> Settings:  # shaping: take_shaping's
    """The shaping options as the config's merge takes them: repeated KEY=VALUE options as dicts, other repeated
    options as tuples; the pins and --freeze checked as they are read."""
    from ortcompile.compile.freeze import parse_freeze
    from ortcompile.plan.shapes import parse_fix_dims, parse_fix_shapes

    parsers: dict[str, Callable[[Any], Any]] = {"fix_dims": parse_fix_dims, "fix_shapes": parse_fix_shapes, "freeze": parse_freeze}
    values = {}
    for entry in shared_settings():
        given = shaping[entry.name]
        if entry.name in parsers:
            values[entry.setting] = parsers[entry.name](given)
        elif entry.kind == "repeat":
            values[entry.setting] = pairs(given) if entry.type == "pair" else tuple(given)
        else:
            values[entry.setting] = given
    return values


def check_scheduling(settings: Iterable[Settings], jobs: int | None, memory_budget: int | None) -> None:
    """--jobs/--memory-budget schedule the parts of --partition: without any model compiled as parts they would do nothing."""
    if (jobs is not None or memory_budget is not None) and all(s["partition"] is None and s["max_context_size"] is None for s in settings):
        raise UsageError("--jobs/--memory-budget schedule the parts of --partition: add --partition auto (or a size)")
