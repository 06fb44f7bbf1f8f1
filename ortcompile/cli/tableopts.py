"""click options made from the option table (ortcompile/optiontable.py): the table is plain data, click lives here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import click

from ortcompile.cli.params import ByteSize, KeyValue, PartitionSize, PositiveByteSize
from ortcompile.errors import UsageError
from ortcompile.optiontable import CRITERION_NAMES, INPUT_NAMES, TABLE, Option, option
from ortcompile.readback.criteria import PRECISIONS


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


COMPLETIONS: dict[str, Callable[[click.Context, click.Parameter, str], list[str]]] = {"ep": complete_ep, "target": complete_target}


def click_type(entry: Option) -> Any:
    """The click type of a table entry's value (None: click's text)."""
    types: dict[str, Callable[[], Any]] = {
        "path": lambda: click.Path(path_type=str),
        "file": lambda: click.Path(dir_okay=False, path_type=str),
        "existing_path": lambda: click.Path(exists=True, path_type=str),
        "size": ByteSize, "positive_size": PositiveByteSize, "partition_size": PartitionSize,
        "count": lambda: click.IntRange(min=1),
        "float": lambda: float,
        "choice": lambda: click.Choice(list(entry.choices)),
        "pair": lambda: KeyValue(entry.example or "", entry.metavar or "KEY=VALUE"),  # the metavar is the type's name
        "precision": lambda: click.Choice(list(PRECISIONS)),
    }
    return types[entry.type]() if entry.type in types else None


def click_option(entry: Option) -> Callable[[Any], Any]:
    """The click.option decorator of one table entry."""
    settings: dict[str, Any] = {"help": entry.help}  # click.option's keyword arguments, each of its own type
    kind_type = click_type(entry)
    if kind_type is not None:
        settings["type"] = kind_type
    if entry.metavar and entry.type != "pair":
        settings["metavar"] = entry.metavar
    if entry.kind == "flag":
        settings["is_flag"] = True
    elif entry.kind == "repeat":
        settings["multiple"] = True
    else:
        default = entry.shown_default if entry.shown_default is not None else entry.default
        if default is not None or not entry.required:  # (click 8.3 takes an explicit default=None as a value, so a
            settings["default"] = default              # required option given one is never missing)
    if entry.show_default:
        settings["show_default"] = True
    if entry.required:
        settings["required"] = True
    if entry.complete:
        settings["shell_complete"] = COMPLETIONS[entry.complete]
    return click.option(*entry.flags, entry.name, **settings)


def table_option(name: str, **changes: Any) -> Callable[[Any], Any]:
    """The click option of the table's entry `name` for another command (llm, verify, bench): the same flags, type and
    value; `changes` say what differs there (its help, default, the example in an error)."""
    return click_option(dataclasses.replace(option(name), **changes))


def with_options(entries: Iterable[Option]) -> Callable[[Any], Any]:
    """A decorator adding the entries' options in the given order (the first is listed first)."""
    chosen = list(entries)

    def decorate(func: Any) -> Any:
        for entry in reversed(chosen):  # click lists the decorator nearest the function last
            func = click_option(entry)(func)
        return func

    return decorate


def compile_table_options(func: Any) -> Any:
    """Every option of `compile`: the whole table, in its order."""
    return with_options(TABLE)(func)


def shaping_options(func: Any) -> Any:
    """The options `split` shares with `compile` (a part compiles as the whole would) and --config/--no-config."""
    return with_options(o for o in TABLE if o.split)(func)


def input_options(with_dims: bool = True) -> Any:
    """--input/--inputs (and --dim): what verify, compile (its check and --verify) and bench feed the models.
    compile has no --dim: its pins (--fix-dim/--fix-shape) are the dims."""

    def decorate(func: Any) -> Any:
        if with_dims:
            func = click.option("--dim", "dims", multiple=True, type=KeyValue("batch=1", "NAME=N"),
                                help="Value of a symbolic dimension in the inputs [default: the compile's pins, else a documented guess].")(func)
        return with_options(option(name) for name in INPUT_NAMES)(func)

    return decorate


def criterion_options(func: Any) -> Any:
    """How outputs are judged: the EP precision's default criterion, each threshold overridable."""
    return with_options(option(name) for name in CRITERION_NAMES)(func)
