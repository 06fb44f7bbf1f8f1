"""Settings from a config file, `ortcompile.toml` or `[tool.ortcompile]` in `pyproject.toml` (docs/config.md).

One command line can then serve a batch, a Makefile and a CI script while each model keeps its own EP, target,
pins and options. Precedence, lowest first: built-in defaults < the file's top-level keys (its defaults) < every
`[models."PATTERN"]` section that matches the model, in file order < options given on the command line. Tables
(`ep-option`, `fix-dim`, `fix-shape`, `freeze`) merge key by key. No click here; from Python:

    from ortcompile.compile.job import compile_models
    from ortcompile.config import compile_options, resolve_config, settings_for_models

    values = settings_for_models(resolve_config(), ["mlp.onnx", "dynamic.onnx"])
    compile_models(list(values), "build/", lambda model: compile_options(values[model]))
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import posixpath
import re
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ortcompile.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

CONFIG_FILE = "ortcompile.toml"
PYPROJECT = "pyproject.toml"
ENV_VAR = "ORTCOMPILE_CONFIG"
VCS_MARKERS = (".git", ".hg")  # the search stops at a repository's root, as black's does
INT64_MAX = 2**63 - 1
TABLES = ("ep_options", "fix_dims", "fix_shapes", "freeze")
EP_BOUND = ("target", "ep_options", "ep_library")  # meaningful only for the EP they were chosen with
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6, "mib": 1 << 20,
               "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40, "tb": 10**12, "tib": 1 << 40}  # as cli.params.ByteSize

Check = Callable[[Any, str, Path], Any]  # (TOML value, "FILE: KEY" for errors, the config file's directory) -> value


# ---------------------------------------------------------------- value checks: one line naming file and key


def _bad(where: str, problem: str) -> UsageError:
    return UsageError(f"{where}: {problem}")


def _text(value: Any, where: str, base: Path) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _bad(where, f"expected a non-empty string, not {value!r}")
    return value.strip()


def _path(value: Any, where: str, base: Path) -> str:
    return str(base / os.path.expanduser(_text(value, where, base)))  # relative to the config file, not the cwd


def _bool(value: Any, where: str, base: Path) -> bool:
    if not isinstance(value, bool):
        raise _bad(where, f"expected true or false, not {value!r}")
    return value


def _choice(*choices: str) -> Check:
    def check(value: Any, where: str, base: Path) -> str:
        if value not in choices:
            raise _bad(where, f"expected one of {', '.join(map(repr, choices))}, not {value!r}")
        return str(value)

    return check


def parse_size(value: Any) -> int | None:
    """A size as the command line takes it (4096, "4K", "64MiB", "2G"); None when it is not one."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", value) if isinstance(value, str) else None
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        return None
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]


def _size(value: Any, where: str, base: Path) -> int:
    size = parse_size(value)
    if size is None:
        raise _bad(where, f"expected a size in bytes (a whole number, or a string such as \"64MiB\"), not {value!r}")
    return size


def _positive_size(value: Any, where: str, base: Path) -> int:
    size = _size(value, where, base)
    if size <= 0:
        raise _bad(where, f"expected a positive size, not {value!r}")
    return size


def _align(value: Any, where: str, base: Path) -> int:
    from ortcompile.compile.layout import MAX_ALIGN

    size = _size(value, where, base)
    if size <= 0 or size & (size - 1) or size > MAX_ALIGN:
        raise _bad(where, f"expected a power of two up to 16 MiB, not {value!r}")
    return size


def _partition(value: Any, where: str, base: Path) -> int:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return 0  # as --partition auto: the EP's graph limit
    size = _size(value, where, base)
    if size <= 0:
        raise _bad(where, "a part must hold a positive size of weights")
    return size


def _dim(value: Any, where: str, base: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= INT64_MAX:
        raise _bad(where, f"expected a positive whole number, not {value!r}")
    return value


def _shape(value: Any, where: str, base: Path) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise _bad(where, f"expected a list of dimensions such as [1, 3, 224, 224], not {value!r}")
    return tuple(_dim(d, where, base) for d in value)


def _number(value: Any, where: str, base: Path) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(where, f"expected a number, not {value!r}")
    return value


def _option_value(value: Any, where: str, base: Path) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _bad(where, f"expected a string or a number (write booleans as the EP spells them, e.g. \"1\"), not {value!r}")
    return str(value)


def _table(check: Check) -> Check:
    def check_table(value: Any, where: str, base: Path) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _bad(where, f"expected a table such as {{ name = ... }}, not {value!r}")
        return {key: check(item, f"{where}.{_key(key)}", base) for key, item in value.items()}

    return check_table


# TOML key -> (the command's parameter name, its check). The keys are the command-line flags without dashes.
KEYS: dict[str, tuple[str, Check]] = {
    "ep": ("ep", _text),
    "ep-option": ("ep_options", _table(_option_value)),
    "target": ("target", _text),
    "ep-library": ("ep_library", _path),
    "inline-threshold": ("inline_threshold", _size),
    "align": ("align", _align),
    "align-threshold": ("align_threshold", _size),
    "shard-size": ("shard_size", _positive_size),
    "embed": ("embed", _choice("auto", "always", "never")),
    "fix-dim": ("fix_dims", _table(_dim)),
    "fix-shape": ("fix_shapes", _table(_shape)),
    "freeze": ("freeze", _table(_number)),
    "prepare": ("prepare", _bool),
    "partition": ("partition", _partition),
    "max-context-size": ("max_context_size", _size),
    "check": ("check_mode", _choice("none", "load", "run")),
    "require-compiled": ("require_compiled", _bool),
}
FLAGS = {name: key for key, (name, _) in KEYS.items()}  # parameter name -> TOML key, for messages


def _key(key: str) -> str:
    """A key as TOML would print it: bare when it can be."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ---------------------------------------------------------------- the file


@dataclass(frozen=True)
class Section:
    """`[models."PATTERN"]`: settings for the models the pattern matches."""

    pattern: str
    label: str  # FILE: models."PATTERN", for messages
    values: dict[str, Any]

    def matches(self, model: str | os.PathLike[str], base: Path) -> bool:
        """A pattern with a `/` matches the model's path from the config file's directory; one without, its
        file name or stem. fnmatch rules, case-sensitive; `*` also matches `/`."""
        path = Path(model)
        if "/" in self.pattern:
            return fnmatch.fnmatchcase(Path(os.path.relpath(path.absolute(), base)).as_posix(), self.pattern)
        return fnmatch.fnmatchcase(path.name, self.pattern) or fnmatch.fnmatchcase(path.stem, self.pattern)


@dataclass(frozen=True)
class Level:
    """One layer of settings in the precedence order, and whether its pins may name dims a model lacks."""

    label: str
    values: dict[str, Any]
    optional_dims: bool = False
    from_file: bool = True


@dataclass(frozen=True)
class Config:
    """A parsed config file (an empty one when none was found or --no-config was given)."""

    path: Path | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    sections: tuple[Section, ...] = ()

    @property
    def shown(self) -> str:
        """The file's path as a user would type it: relative to the current directory when below or beside it."""
        return _relative(self.path) if self.path is not None else "(no config file)"

    def levels(self, model: str | os.PathLike[str], command_line: Mapping[str, Any], *, batch: bool) -> list[Level]:
        base = self.path.absolute().parent if self.path is not None else Path.cwd()
        matched = [Level(s.label, s.values) for s in self.sections if s.matches(model, base)]
        given = Level("the command line", dict(command_line), optional_dims=batch, from_file=False)
        return [Level(f"{self.shown} (top-level defaults)", self.defaults, optional_dims=True), *matched, given]


def _relative(path: Path) -> str:
    """Relative to the current directory when the file is below it or in one of its parents (where the search
    finds it), else absolute."""
    absolute, cwd = path.absolute(), Path.cwd()
    if cwd in absolute.parents or absolute.parent in cwd.parents:
        return os.path.relpath(absolute)
    return str(absolute)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Parse and check a config file. A `pyproject.toml` holds it as `[tool.ortcompile]`; any other file at top level."""
    path = Path(path)
    shown = _relative(path)
    data = _read_toml(path, shown)
    if path.name == PYPROJECT:
        table = data.get("tool", {}).get("ortcompile") if isinstance(data.get("tool"), dict) else None
        if table is None:
            raise UsageError(f"{shown}: no [tool.ortcompile] table")
        return _parse(path, shown, table, "tool.ortcompile.")
    return _parse(path, shown, data, "")


def _read_toml(path: Path, shown: str) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except OSError as exc:
        raise UsageError(f"{shown}: cannot read the config file: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{shown}: not valid TOML: {exc}") from None


def _parse(path: Path, shown: str, table: Any, prefix: str) -> Config:
    if not isinstance(table, dict):
        raise _bad(f"{shown}: {prefix.rstrip('.')}", "expected a table")
    base = path.absolute().parent
    models = table.get("models", {})
    if not isinstance(models, dict):
        raise _bad(f"{shown}: {prefix}models", 'expected tables such as [models."name"]')
    sections = tuple(_section(shown, prefix, pattern, values, base) for pattern, values in models.items())
    defaults = _level_values({k: v for k, v in table.items() if k != "models"}, f"{shown}: {prefix}", base, allow_models=True)
    return Config(path, defaults, sections)


def _section(shown: str, prefix: str, pattern: str, values: Any, base: Path) -> Section:
    label = f"{shown}: {prefix}models.{_key(pattern)}"
    if not isinstance(values, dict):
        raise _bad(label, "expected a table of settings")
    if not pattern.strip():
        raise _bad(label, "the pattern is empty")
    pattern = posixpath.normpath(pattern) if "/" in pattern else pattern  # "./x.onnx" as "x.onnx"
    return Section(pattern, label, _level_values(values, f"{label}.", base, allow_models=False))


def _level_values(table: dict[str, Any], where: str, base: Path, *, allow_models: bool) -> dict[str, Any]:
    values = {}
    for key, value in table.items():
        if key not in KEYS:
            known = [*KEYS, *(["models"] if allow_models else [])]
            close = difflib.get_close_matches(key.replace("_", "-"), known, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (known keys: {', '.join(known)})"
            raise _bad(f"{where}{_key(key)}", f"unknown key{hint}")
        name, check = KEYS[key]
        values[name] = check(value, f"{where}{_key(key)}", base)
    return values


# ---------------------------------------------------------------- finding it


def find_config(start: str | os.PathLike[str] | None = None) -> Path | None:
    """The first `ortcompile.toml`, or `pyproject.toml` with `[tool.ortcompile]`, from `start` (the current
    directory) upwards; the search stops after a repository's root (.git, .hg) or the home directory."""
    here = Path(start if start is not None else Path.cwd()).absolute()
    home = _home()
    for directory in (here, *here.parents):
        if (directory / CONFIG_FILE).is_file():
            return directory / CONFIG_FILE
        pyproject = directory / PYPROJECT
        if pyproject.is_file() and _has_table(pyproject):
            return pyproject
        if directory == home or any((directory / marker).exists() for marker in VCS_MARKERS):
            return None
    return None


def _home() -> Path | None:
    try:
        return Path.home().absolute()
    except (KeyError, RuntimeError):  # no HOME and no passwd entry
        return None


def _has_table(pyproject: Path) -> bool:
    tool = _read_toml(pyproject, _relative(pyproject)).get("tool")
    return isinstance(tool, dict) and "ortcompile" in tool


def resolve_config(path: str | os.PathLike[str] | None = None, *, enabled: bool = True, environ: Mapping[str, str] | None = None,
                   start: str | os.PathLike[str] | None = None) -> Config:
    """`--config PATH`, else $ORTCOMPILE_CONFIG, else the file find_config finds; `enabled=False` (--no-config): none."""
    if not enabled:
        if path is not None:
            raise UsageError("--config and --no-config contradict each other: give one")
        return Config()
    from_env = (environ if environ is not None else os.environ).get(ENV_VAR) or None
    chosen = path if path is not None else from_env
    if chosen is not None:
        if not Path(chosen).is_file():
            raise UsageError(f"{chosen}: no such config file" + ("" if path is not None else f" (from ${ENV_VAR})"))
        return load_config(chosen)
    found = find_config(start)
    return load_config(found) if found is not None else Config()


# ---------------------------------------------------------------- one model's settings


@dataclass(frozen=True)
class ModelSettings:
    """A model's merged settings (the command's parameter names; tables as dicts) and where each pin came from."""

    model: str
    values: dict[str, Any]
    pins: dict[str, Level]  # fix-dim name -> the level that set it last
    sections: tuple[str, ...]  # the [models."..."] sections that matched

    @property
    def needs_dims(self) -> bool:
        """Whether the model's dims must be read here: the file's pins are checked here, a batch's may not apply."""
        return any(level.from_file or level.optional_dims for level in self.pins.values())

    def fit(self, dims: Collection[str]) -> tuple[ModelSettings, list[str]]:
        """Leave out the optional pins this model lacks (and say so); a pin from its own section must apply."""
        kept, notes = dict(self.values["fix_dims"]), []
        for name, level in self.pins.items():
            if name in dims:
                continue
            if level.optional_dims:
                notes.append(f"{self.model}: no symbolic dimension {name!r}: fix-dim {name}={kept.pop(name)} from {level.label} left out")
            elif level.from_file:
                raise _bad(f"{level.label}.fix-dim.{_key(name)}",
                           f"{self.model} has no symbolic dimension {name!r} (it has: {', '.join(sorted(dims)) or 'none'})")
            # the command line's pin for a single model: the compile itself refuses it, as without a config
        return replace(self, values={**self.values, "fix_dims": kept}, pins={k: v for k, v in self.pins.items() if k in kept}), notes


def builtin_values() -> dict[str, Any]:
    """The built-in defaults, in the form merge() takes (what the command's options default to)."""
    from ortcompile.options import CompileOptions

    options = CompileOptions()
    return {"ep": options.ep, "ep_options": {}, "target": options.target, "ep_library": options.ep_library,
            "inline_threshold": options.layout.inline_threshold, "align": options.layout.align,
            "align_threshold": options.layout.align_threshold, "shard_size": options.layout.shard_size, "embed": options.embed,
            "fix_dims": {}, "fix_shapes": {}, "freeze": {}, "prepare": options.prepare, "partition": None,
            "max_context_size": options.max_context_size, "check_mode": options.check, "require_compiled": options.require_compiled}


def merge(builtin: Mapping[str, Any], levels: Sequence[Level]) -> tuple[dict[str, Any], dict[str, Level]]:
    """Apply the levels over the built-in values, lowest first. When a level names another EP than an earlier
    level named, the earlier target, ep-option and ep-library are dropped: they were chosen for that EP."""
    values = {k: (dict(v) if k in TABLES else v) for k, v in builtin.items()}
    pins: dict[str, Level] = {}
    named_ep = False
    for level in levels:
        if "ep" in level.values:
            if named_ep and _ep_key(level.values["ep"]) != _ep_key(values["ep"]):
                values.update({k: (dict(builtin[k]) if k in TABLES else builtin[k]) for k in EP_BOUND})
            named_ep = True
        for key, value in level.values.items():
            values[key] = {**values[key], **value} if key in TABLES else value
        pins.update(dict.fromkeys(level.values.get("fix_dims", {}), level))
    return values, pins


def _ep_key(name: str) -> str:
    from ortcompile.eps.catalog import short_name_for

    return short_name_for(name.strip())


def model_settings(config: Config, model: str | os.PathLike[str], command_line: Mapping[str, Any] | None = None,
                   passed: Collection[str] = (), *, batch: bool = False) -> ModelSettings:
    """One model's settings: the values in `command_line` not `passed` are the built-in defaults (omitted: builtin_values())."""
    given = dict(command_line or {})
    builtin = {**builtin_values(), **{k: v for k, v in given.items() if k not in passed}}
    levels = config.levels(model, {k: given[k] for k in passed if k in given}, batch=batch)
    values, pins = merge(builtin, levels)
    return ModelSettings(os.fspath(model), values, pins, tuple(level.label for level in levels[1:-1]))


def settings_for_models(config: Config, models: Sequence[str | os.PathLike[str]], command_line: Mapping[str, Any] | None = None,
                        passed: Collection[str] = (), *, dims_of: Callable[[str], Collection[str]] | None = None,
                        note: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """Every model's settings, checked before any work starts. In a batch the command line's --fix-dim may
    name a dim some models lack, but not one that none of them has."""
    dims_of, note = dims_of or symbolic_dims, note or (lambda message: None)
    batch = len(models) > 1
    unused = set(command_line.get("fix_dims", {}) if command_line and "fix_dims" in passed and batch else {})
    settled: dict[str, dict[str, Any]] = {}
    for model in map(os.fspath, models):
        settings = model_settings(config, model, command_line, passed, batch=batch)
        if settings.sections:
            note(f"{model}: settings from {', '.join(settings.sections)}")
        if settings.needs_dims:
            dims = dims_of(model)
            unused -= set(dims)
            settings, notes = settings.fit(dims)
            for message in notes:
                note(message)
        settled[model] = settings.values
    if unused:
        name = sorted(unused)[0]
        raise UsageError(f"--fix-dim {name}: none of the models has a symbolic dimension {name!r}")
    return settled


def symbolic_dims(model: str) -> set[str]:
    """The model's named input dims (reads its graph proto, never its weights' files)."""
    from ortcompile.compile.source import read_source

    return read_source(Path(model)).symbolic_dims


def compile_options(values: Mapping[str, Any], *, jobs: int | None = None, memory_budget: int | None = None, **rest: Any) -> Any:
    """CompileOptions from merged settings (and any other CompileOptions field in `rest`)."""
    from ortcompile.compile.layout import LayoutPolicy
    from ortcompile.options import CompileOptions, PartitionOptions

    parts = values["partition"], values["max_context_size"]
    return CompileOptions(
        ep=values["ep"],
        ep_options=dict(values["ep_options"]),
        target=values["target"],
        ep_library=values["ep_library"],
        layout=LayoutPolicy(values["inline_threshold"], values["align"], values["align_threshold"], values["shard_size"]),
        embed=values["embed"],
        fix_dims=dict(values["fix_dims"]),
        fix_shapes=dict(values["fix_shapes"]),
        freeze=dict(values["freeze"]),
        prepare=values["prepare"],
        partition=None if parts == (None, None) else PartitionOptions(parts[0] or None, jobs, memory_budget),
        max_context_size=values["max_context_size"],
        check=values["check_mode"],
        require_compiled=values["require_compiled"],
        **rest,
    )
