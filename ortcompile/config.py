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
import sys
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ortcompile.configkeys import EP_BOUND, KEYS, TABLES, bad_value, library_keys, toml_key
from ortcompile.eps.catalog import short_name_for
from ortcompile.errors import OrtCompileWarning, UsageError
from ortcompile.layout import LayoutPolicy
from ortcompile.options import CompileOptions, GivenInputs, PartitionOptions
from ortcompile.optiontable import PARTITION_AUTO, TABLE, Option, configured
from ortcompile.plan.source import read_source
from ortcompile.trust import why_untrusted

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

CONFIG_FILE = "ortcompile.toml"
PYPROJECT = "pyproject.toml"
ENV_VAR = "ORTCOMPILE_CONFIG"
PROJECT_MARKERS = (".git", ".hg", PYPROJECT)  # the search stops at a project's root, as black's does

Settings = dict[str, Any]  # values by the option table's setting names, each of its option's type (one level, or merged)
TomlTable = dict[str, Any]  # a table as tomllib reads it: TOML at the edge, checked key by key (configkeys.py) into Settings


# ---------------------------------------------------------------- the file


@dataclass(frozen=True)
class Section:
    """`[models."PATTERN"]`: settings for the models the pattern matches."""

    pattern: str
    label: str  # FILE: models."PATTERN", for messages
    values: Settings

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
    values: Settings
    optional_dims: bool = False
    from_file: bool = True


@dataclass(frozen=True)
class Config:
    """A parsed config file (an empty one when none was found or --no-config was given)."""

    path: Path | None = None
    defaults: Settings = field(default_factory=dict)
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


def load_config(path: str | os.PathLike[str], *, named: bool = True) -> Config:
    """Parse and check a config file. A `pyproject.toml` holds it as `[tool.ortcompile]`; any other file at top level.
    `named=False` (a file the search found): keys that load a library are refused (docs/security.md)."""
    path = Path(path)
    shown = _relative(path)
    data = _read_toml(path, shown)
    if path.name == PYPROJECT:
        table = data.get("tool", {}).get("ortcompile") if isinstance(data.get("tool"), dict) else None
        if table is None:
            raise UsageError(f"{shown}: no [tool.ortcompile] table")
        return _parse(path, shown, table, "tool.ortcompile.", named)
    return _parse(path, shown, data, "", named)


def _read_toml(path: Path, shown: str) -> TomlTable:
    try:
        with path.open("rb") as file:
            raw = file.read()
    except OSError as exc:
        raise UsageError(f"{shown}: cannot read the config file: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise UsageError(f"{shown}: not valid TOML: not UTF-8 text (line {line})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{shown}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses once per level of nested arrays and inline tables
        raise UsageError(f"{shown}: not valid TOML for ortcompile: arrays or tables nested too deeply") from None


def _parse(path: Path, shown: str, table: Any, prefix: str, named: bool) -> Config:
    if not isinstance(table, dict):
        raise bad_value(f"{shown}: {prefix.rstrip('.')}", "expected a table")
    base = path.absolute().parent
    models = table.get("models", {})
    if not isinstance(models, dict):
        raise bad_value(f"{shown}: {prefix}models", 'expected tables such as [models."name"]')
    sections = tuple(_section(shown, prefix, pattern, values, base) for pattern, values in models.items())
    defaults = _level_values({k: v for k, v in table.items() if k != "models"}, f"{shown}: {prefix}", base, allow_models=True)
    if not named:
        _refuse_libraries(shown, [(f"{shown}: {prefix}", defaults), *((f"{s.label}.", s.values) for s in sections)])
    return Config(path, defaults, sections)


def _refuse_libraries(shown: str, levels: list[tuple[str, Settings]]) -> None:
    """A file the search found may not make ortcompile load code: whoever could put a file in a directory above
    the user's (a cloned repository, a shared checkout) would run theirs. Naming the file says it is trusted."""
    for where, values in levels:
        key = next(iter(library_keys(values)), None)
        if key is not None:
            raise UsageError(f"{where}{key}: names a library to load, which ortcompile takes only from a config file you name: "
                             f"--config {shown} (or ORTCOMPILE_CONFIG={shown}) if you trust it")


def _section(shown: str, prefix: str, pattern: str, values: Any, base: Path) -> Section:
    label = f"{shown}: {prefix}models.{toml_key(pattern)}"
    if not isinstance(values, dict):
        raise bad_value(label, "expected a table of settings")
    if not pattern.strip():
        raise bad_value(label, "the pattern is empty")
    pattern = posixpath.normpath(pattern) if "/" in pattern else pattern  # "./x.onnx" as "x.onnx"
    return Section(pattern, label, _level_values(values, f"{label}.", base, allow_models=False))


def _level_values(table: TomlTable, where: str, base: Path, *, allow_models: bool) -> Settings:
    values = {}
    for key, value in table.items():
        if key not in KEYS:
            known = [*KEYS, *(["models"] if allow_models else [])]
            close = difflib.get_close_matches(key.replace("_", "-"), known, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (known keys: {', '.join(known)})"
            raise bad_value(f"{where}{toml_key(key)}", f"unknown key{hint}")
        name, check = KEYS[key]
        values[name] = check(value, f"{where}{toml_key(key)}", base)
    return values


# ---------------------------------------------------------------- finding it


def find_config(start: str | os.PathLike[str] | None = None) -> Path | None:
    """The first `ortcompile.toml`, or `pyproject.toml` with `[tool.ortcompile]`, from `start` (the current
    directory) upwards. The search ends at the project's root (a directory with .git, .hg or pyproject.toml), at the
    home directory, and before another filesystem. A file someone else could have written is ignored with a warning
    (trust.py), and the search ends there."""
    here = Path(start if start is not None else Path.cwd()).absolute()
    home, device = _home(), _device(here)
    for directory in (here, *here.parents):
        if _device(directory) != device:
            return None  # a mount point's parent: another filesystem is not this project's
        found, stop = _config_in(directory)
        if stop or directory == home or any((directory / marker).exists() for marker in PROJECT_MARKERS):
            return found
    return None


def _config_in(directory: Path) -> tuple[Path | None, bool]:
    """(the config file in `directory` if it is to be read, whether the search ends here)."""
    for candidate in (directory / CONFIG_FILE, directory / PYPROJECT):
        if not candidate.is_file():
            continue
        problem = why_untrusted(candidate)
        if problem is None:
            if candidate.name == CONFIG_FILE or _has_table(candidate):
                return candidate, True
        elif candidate.name == CONFIG_FILE or _has_table(candidate, lenient=True):
            shown = _relative(candidate)
            warnings.warn(f"ignoring the config file {shown}: {problem}; name it with --config {shown} to use it",
                          OrtCompileWarning, stacklevel=3)
            return None, True
    return None, False


def _device(directory: Path) -> int | None:
    try:
        return directory.stat().st_dev
    except OSError:
        return None


def _home() -> Path | None:
    try:
        return Path.home().absolute()
    except (KeyError, RuntimeError):  # no HOME and no passwd entry
        return None


def _has_table(pyproject: Path, lenient: bool = False) -> bool:
    """Whether it has [tool.ortcompile]; `lenient`: a file that cannot be read has none (someone else's file)."""
    try:
        tool = _read_toml(pyproject, _relative(pyproject)).get("tool")
    except UsageError:
        if lenient:
            return False
        raise
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
    return load_config(found, named=False) if found is not None else Config()


# ---------------------------------------------------------------- one model's settings


@dataclass(frozen=True)
class ModelSettings:
    """A model's merged settings (the command's parameter names; tables as dicts) and where each pin came from."""

    model: str
    values: Settings
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
                raise bad_value(f"{level.label}.fix-dim.{toml_key(name)}",
                           f"{self.model} has no symbolic dimension {name!r} (it has: {', '.join(sorted(dims)) or 'none'})")
            # the command line's pin for a single model: the compile itself refuses it, as without a config
        return replace(self, values={**self.values, "fix_dims": kept}, pins={k: v for k, v in self.pins.items() if k in kept}), notes


def builtin_values(table: Sequence[Option] = TABLE) -> Settings:
    """The built-in defaults (optiontable.py), in the form merge() takes (what the command's options default to)."""
    return {o.setting: (dict(o.default) if isinstance(o.default, dict) else o.default) for o in configured(table)}


def merge(builtin: Mapping[str, Any], levels: Sequence[Level]) -> tuple[Settings, dict[str, Level]]:
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
                        note: Callable[[str], None] | None = None) -> dict[str, Settings]:
    """Every model's settings, checked before any work starts. In a batch the command line's --fix-dim may
    name a dim some models lack, but not one that none of them has."""
    dims_of, note = dims_of or symbolic_dims, note or (lambda message: None)
    batch = len(models) > 1
    unused = set(command_line.get("fix_dims", {}) if command_line and "fix_dims" in passed and batch else {})
    settled: dict[str, Settings] = {}
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
    return read_source(Path(model)).symbolic_dims


def compile_options(values: Mapping[str, Any], *, jobs: int | None = None, memory_budget: int | None = None,
                    table: Sequence[Option] = TABLE, **rest: Any) -> Any:
    """CompileOptions from merged settings (and any other CompileOptions field in `rest`): each setting goes to the
    field the option table names (a missing or None one is the table's default); --partition's as PartitionOptions."""
    fields: dict[str, Any] = {}  # CompileOptions' keyword arguments, each of its field's type
    layout: dict[str, Any] = {}  # LayoutPolicy's
    for entry in configured(table):
        if entry.field is None or entry.field.startswith("partition."):
            continue
        value = values.get(entry.setting)
        value = entry.default if value is None else value
        value = type(entry.default)(value) if isinstance(entry.default, (dict, tuple)) else value  # a copy, as the field holds it
        group, _, name = entry.field.rpartition(".")
        (layout if group == "layout" else fields)[name] = value
    parts = values["partition"], values["max_context_size"]
    partition = None if parts == (None, None) else PartitionOptions(None if parts[0] == PARTITION_AUTO else parts[0], jobs, memory_budget)
    return CompileOptions(**fields, layout=LayoutPolicy(**layout), partition=partition,
                          **{**rest, "inputs": _configured_inputs(values.get("inputs_path"), rest.get("inputs") or {})})


def _configured_inputs(path: str | None, given: Mapping[str, Any]) -> GivenInputs:
    """The config's `inputs` (an .npz file or a directory), unless --input/--inputs gave inputs: those replace them."""
    if not path or given:
        return dict(given)
    from ortcompile.readback.given import load_inputs  # numpy: only when a config names inputs

    return load_inputs(path)
