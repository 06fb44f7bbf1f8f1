"""click parameter types shared by the commands: sizes and KEY=VALUE pairs."""

from __future__ import annotations

import re
from typing import Any

import click

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6, "mib": 1 << 20,
               "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40, "tb": 10**12, "tib": 1 << 40}


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
