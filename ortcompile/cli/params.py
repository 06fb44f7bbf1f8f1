"""click parameter types shared by the commands: sizes and KEY=VALUE pairs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from ortcompile.optiontable import CRITERION_NAMES, PARTITION_AUTO, CriterionSettings, is_auto
from ortcompile.sizes import parse_size

if TYPE_CHECKING:
    from ortcompile.options import GivenInputs  # (not at run time: --help loads no options.py)


class ByteSize(click.ParamType):
    """A size such as 4096, 4K, 64MiB, 2G (K/M/G and KiB/MiB/GiB are powers of 1024; KB/MB/GB of 1000)."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        size = parse_size(value)
        if size is None:
            self.fail(f"{value!r} is not a size (examples: 4096, 4K, 64MiB, 2G)", param, ctx)
        return size


class PositiveByteSize(ByteSize):
    """A size that must be above zero (--max-context-size: 0 would be a graph limit nothing fits under)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        size = super().convert(value, param, ctx)
        if size <= 0:
            self.fail("must be a positive size (examples: 512MiB, 1G)", param, ctx)
        return size


class PartitionSize(ByteSize):
    """`auto` (PARTITION_AUTO: the planner decides) or the bytes of weights per part."""

    name = "auto|SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if is_auto(value):
            return PARTITION_AUTO
        size = super().convert(value, param, ctx)
        if size <= 0:
            self.fail("a part must hold a positive size of weights", param, ctx)
        return size


class KeyValue(click.ParamType):
    """KEY=VALUE, returned as a (key, value) pair; the key must not be empty. `example` shows the form in errors."""

    name = "KEY=VALUE"

    def __init__(self, example: str, metavar: str = "KEY=VALUE") -> None:
        self.example = example
        self.name = metavar

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        key, sep, rest = str(value).partition("=")
        if not sep or not key.strip():
            self.fail(f"{value!r}: expected {self.name}, e.g. {self.example}", param, ctx)
        return key.strip(), rest.strip()


def pairs(values: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """Repeated KEY=VALUE options as a dict (a later repetition wins)."""
    return dict(values)


def criterion_settings(values: dict[str, Any]) -> CriterionSettings:  # values: a command's click keyword arguments
    """The criterion options the user set (None: keep the default)."""
    return {k: values[k] for k in CRITERION_NAMES if k != "precision" and values.get(k) is not None}


def given_inputs(input_args: tuple[str, ...], inputs_file: str | None) -> GivenInputs:
    """--input and --inputs as readback.given.Given values (--input wins over the file for the same name)."""
    if not input_args and not inputs_file:
        return {}  # (numpy stays unloaded: an up-to-date --if-changed check imports no heavy module)
    from ortcompile.readback.given import load_inputs, parse_input

    given = dict(load_inputs(inputs_file)) if inputs_file else {}
    for text in input_args:
        name, value = parse_input(text)
        given[name] = value
    return given
