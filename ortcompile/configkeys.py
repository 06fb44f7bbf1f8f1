"""The keys of a config file (docs/config.md) and the check of each value: one line naming the file and the key.

The keys are the `compile` flags without their dashes; `KEYS` maps each to the command's parameter name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ortcompile.eps.catalog import loads_library
from ortcompile.errors import UsageError, shorten
from ortcompile.layout import MAX_ALIGN
from ortcompile.onnxfacts import INT64_MAX
from ortcompile.optiontable import PARTITION_AUTO, TABLE, Option, configured, is_auto
from ortcompile.sizes import parse_size

Check = Callable[[Any, str, Path], Any]  # (TOML value, "FILE: KEY" for errors, the config file's directory) -> value


# ---------------------------------------------------------------- value checks: one line naming file and key


def bad_value(where: str, problem: str) -> UsageError:
    return UsageError(f"{where}: {shorten(problem, 200)}")  # a value quoted in the problem may be huge


def _text(value: Any, where: str, base: Path) -> str:
    if not isinstance(value, str) or not value.strip():
        raise bad_value(where, f"expected a non-empty string, not {value!r}")
    return value.strip()


def _path(value: Any, where: str, base: Path) -> str:
    return str(base / os.path.expanduser(_text(value, where, base)))  # relative to the config file, not the cwd


def _bool(value: Any, where: str, base: Path) -> bool:
    if not isinstance(value, bool):
        raise bad_value(where, f"expected true or false, not {value!r}")
    return value


def _choice(*choices: str) -> Check:
    def check(value: Any, where: str, base: Path) -> str:
        if value not in choices:
            raise bad_value(where, f"expected one of {', '.join(map(repr, choices))}, not {value!r}")
        return str(value)

    return check


def _size(value: Any, where: str, base: Path) -> int:
    size = parse_size(value)
    if size is None:
        raise bad_value(where, f"expected a size in bytes (a whole number, or a string such as \"64MiB\"), not {value!r}")
    return size


def _positive_size(value: Any, where: str, base: Path) -> int:
    size = _size(value, where, base)
    if size <= 0:
        raise bad_value(where, f"expected a positive size, not {value!r}")
    return size


def _align(value: Any, where: str, base: Path) -> int:
    size = _size(value, where, base)
    if size <= 0 or size & (size - 1) or size > MAX_ALIGN:
        raise bad_value(where, f"expected a power of two up to 16 MiB, not {value!r}")
    return size


def _partition(value: Any, where: str, base: Path) -> int:
    if isinstance(value, str) and is_auto(value):
        return PARTITION_AUTO
    size = _size(value, where, base)
    if size <= 0:
        raise bad_value(where, "a part must hold a positive size of weights")
    return size


def _dim(value: Any, where: str, base: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= INT64_MAX:
        raise bad_value(where, f"expected a positive whole number, not {value!r}")
    return value


def _shape(value: Any, where: str, base: Path) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise bad_value(where, f"expected a list of dimensions such as [1, 3, 224, 224], not {value!r}")
    return tuple(_dim(d, where, base) for d in value)


def _number(value: Any, where: str, base: Path) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_value(where, f"expected a number, not {value!r}")
    return value


def _option_value(value: Any, where: str, base: Path) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise bad_value(where, f"expected a string or a number (write booleans as the EP spells them, e.g. \"1\"), not {value!r}")
    return str(value)


def _table(check: Check) -> Check:
    def check_table(value: Any, where: str, base: Path) -> dict[str, Any]:  # key -> the value `check` made of it, of its type
        if not isinstance(value, dict):
            raise bad_value(where, f"expected a table such as {{ name = ... }}, not {value!r}")
        return {key: check(item, f"{where}.{toml_key(key)}", base) for key, item in value.items()}

    return check_table


def _patterns(value: Any, where: str, base: Path) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise bad_value(where, f"expected a list of node names, op:TYPE or globs, not {value!r}")
    return tuple(value)


CHECKS: dict[str, Check] = {  # the checks optiontable.ConfigKey names
    "text": _text, "path": _path, "bool": _bool, "size": _size, "positive_size": _positive_size, "align": _align,
    "partition": _partition, "dim": _dim, "shape": _shape, "number": _number, "option_value": _option_value, "patterns": _patterns,
}


def _check_of(entry: Option) -> Check:
    """The check of an option's config value: by name, `choice` from its choices, `table:NAME` a table of NAME."""
    assert entry.config is not None
    name = entry.config.check
    if name == "choice":
        return _choice(*entry.choices)
    if name.startswith("table:"):
        return _table(CHECKS[name.removeprefix("table:")])
    return CHECKS[name]


# TOML key -> (the settings' name, its check), in the option table's order. The keys are the command-line flags without dashes.
def config_keys(table: Sequence[Option] = TABLE) -> dict[str, tuple[str, Check]]:
    return {o.config.key: (o.setting, _check_of(o)) for o in configured(table) if o.config is not None}


KEYS = config_keys()
TABLES = tuple(o.setting for o in configured() if o.config is not None and o.config.check.startswith("table:"))  # merged key by key
EP_BOUND = tuple(o.setting for o in configured() if o.ep_bound)  # meaningful only for the EP they were chosen with


def library_keys(values: dict[str, Any]) -> list[str]:  # values: config.Settings (checked settings), named a floor above
    """The keys of checked settings (parameter names, as KEYS gives them) that make ortcompile load a shared library,
    as the file spells them: `ep-library`, and `ep-option.KEY` for a provider option that names one."""
    keys = ["ep-library"] if values.get("ep_library") else []
    options = values.get("ep_options", {})
    return keys + [f"ep-option.{toml_key(key)}" for key, value in options.items() if loads_library(key, value)]


def toml_key(key: str) -> str:
    """A key as TOML would print it: bare when it can be."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
