"""The option table (ortcompile/optiontable.py) is the one source of compile's options: the click options of compile
and split, the config keys and their checks, the built-in defaults, the manifest's recorded options and the part
flags are all made from it, and an entry added to it shows up in each of them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from ortcompile.cli import main as group
from ortcompile.cli.sections import SECTIONS, TITLES, SectionedCommand, sections_of
from ortcompile.cli.shaping import SHAPING_NAMES, command_line_values
from ortcompile.cli.tableopts import with_options
from ortcompile.compile.split import part_cli_args
from ortcompile.config import builtin_values, compile_options
from ortcompile.configkeys import KEYS, config_keys
from ortcompile.errors import UsageError
from ortcompile.layout import LayoutPolicy
from ortcompile.options import CompileOptions, PartitionOptions
from ortcompile.optiontable import TABLE, ConfigKey, Option, Recorded, configured

MESSAGES = {"quiet", "verbose", "as_json", "debug", "help"}  # every command's own (cli/output.py), not compile options
SPLITS_OWN = {"output_dir", "stitch_output", "force"}  # split's -o, --stitch-output and --force say other things than compile's

# A made-up option, as someone would add one: a record in the table and nothing else (CompileOptions has `lint`).
LINT = Option("lint", ("--lint/--no-lint",), section="Shapes and graph", kind="switch", default=True, show_default=True, split=True,
              help="Lint fp16 models before the compile.", config=ConfigKey("lint", "bool"), field="lint",
              recorded=Recorded("lint", "not_default"), part=True)
EXTENDED = (*TABLE, LINT)


def _options(command: click.Command) -> dict[str, click.Option]:
    return {str(p.name): p for p in command.params if isinstance(p, click.Option) and p.name not in MESSAGES}


def _flags(param: click.Option) -> tuple[str, ...]:
    """The option's declaration as the table writes it: ("-o", "--output"), ("--prepare/--no-prepare",)."""
    if param.secondary_opts:
        return tuple(f"{on}/{off}" for on, off in zip(param.opts, param.secondary_opts))
    return tuple(param.opts)


def test_every_option_of_compile_is_a_table_entry_and_every_entry_an_option() -> None:
    options = _options(group.commands["compile"])
    assert sorted(options) == sorted(o.name for o in TABLE)
    for entry in TABLE:
        assert _flags(options[entry.name]) == entry.flags, entry.name
        assert options[entry.name].help == entry.help


def test_split_has_the_shared_entries_and_only_its_own_besides() -> None:
    options = _options(group.commands["split"])
    shared = {o.name for o in TABLE if o.split}
    assert set(options) - SPLITS_OWN == shared
    for entry in (o for o in TABLE if o.split):
        assert _flags(options[entry.name]) == entry.flags


def test_config_keys_are_the_flags_of_the_table_without_dashes() -> None:
    made = config_keys()
    assert {k: (name, check.__qualname__) for k, (name, check) in KEYS.items()} == {k: (name, check.__qualname__) for k, (name, check) in made.items()}
    assert list(KEYS) == [o.config.key for o in configured() if o.config]
    for entry in configured():
        assert entry.config and entry.config.key == entry.long_name.removeprefix("--")
        assert KEYS[entry.config.key][0] == entry.setting


def test_every_section_of_the_table_is_a_help_section() -> None:
    assert all(o.section in TITLES for o in TABLE)
    assert sections_of(TABLE) == SECTIONS
    names = [name for names in SECTIONS.values() for name in names]
    assert len(names) == len(set(names))


def test_the_defaults_of_click_the_config_and_the_library_are_the_tables() -> None:
    """compile with no option given, the config's built-in values and CompileOptions() all agree."""
    assert compile_options(builtin_values()) == CompileOptions()
    command = group.commands["compile"]
    with command.make_context("compile", ["model.onnx", "-o", "out/"]) as ctx:
        given = command_line_values(ctx.params)
        assert given == {name: value for name, value in builtin_values().items() if name in SHAPING_NAMES}
        assert ctx.params["inputs_file"] is None and builtin_values()["inputs_path"] is None


def test_part_flags_are_written_in_splits_order() -> None:
    """The flags a part is compiled with, as split has always written them (parts plans and Make fragments stay
    byte-identical): the layout in full, --no-prepare after --check, unset options left out."""
    options = CompileOptions(ep="qnn", ep_options={"b": "2", "a": "1"}, target="sm8650", ep_library="lib/x.so",
                             layout=LayoutPolicy(64, 128, 256, 1024), embed="never", check="load", prepare=False, require_compiled=True,
                             fix_dims={"batch": 1}, freeze={"sr": 16000})
    assert part_cli_args(options) == [
        "--no-config", "--ep", "qnn", "--ep-option", "a=1", "--ep-option", "b=2", "--target", "sm8650",
        "--ep-library", str(Path("lib/x.so").absolute()), "--inline-threshold", "64", "--align", "128", "--align-threshold", "256",
        "--shard-size", "1024", "--embed", "never", "--check", "load", "--no-prepare", "--require-compiled"]
    assert part_cli_args(CompileOptions(ep="cpu", require_compiled=False)) == [
        "--no-config", "--ep", "cpu", "--inline-threshold", "1024", "--align", "4096", "--align-threshold", "1048576",
        "--embed", "auto", "--check", "auto", "--allow-partial"]


def test_recorded_options_are_the_manifests() -> None:
    """What a manifest records, for options set every way (the shape manifests and parts plans have had)."""
    options = CompileOptions(ep="QNNExecutionProvider", ep_options={"z": "1", "a": "2"}, fix_dims={"s": 2, "b": 1},
                             fix_shapes={"x": (1, 3)}, freeze={"sr": 16000}, partition=PartitionOptions(1 << 20, jobs=2),
                             max_context_size=1 << 30, target="sm8650", prepare=True, check="run", verify=True)
    assert options.recorded("qnn", True, compiles=False) == {
        "ep": "qnn", "ep_options": {"a": "2", "z": "1"}, "embed": "auto", "fix_dims": {"b": 1, "s": 2}, "fix_shapes": {"x": [1, 3]},
        "layout": {"inline_threshold": 1024, "align": 4096, "align_threshold": 1 << 20, "shard_size": None},
        "require_compiled": True, "share_weights": False, "prepare": False, "freeze": {"sr": 16000},
        "partition": {"budget": 1 << 20, "max_context_size": 1 << 30}, "target": "sm8650"}
    fallback = CompileOptions(cpu_nodes=("op:Pow", "log"), fallback="auto").recorded("cpu", False)
    assert fallback["cpu_nodes"] == ["op:Pow", "log"] and fallback["fallback"] == "auto" and "partition" not in fallback
    assert set(CompileOptions().recorded("cpu", False)) == {"ep", "ep_options", "embed", "fix_dims", "fix_shapes", "layout",
                                                             "require_compiled", "share_weights", "prepare"}


def test_an_entry_added_to_the_table_shows_up_everywhere() -> None:
    """LINT is one record: it becomes a click option in its --help section, a config key with its check and its
    default, a field of the options, a recorded option and a part flag."""
    seen: dict[str, Any] = {}

    class Sectioned(SectionedCommand):
        sections = sections_of(EXTENDED)

    @click.command("made-up", cls=Sectioned)
    @with_options(o for o in EXTENDED if o.split)
    def command(**values: Any) -> None:
        seen.update(values)

    runner = CliRunner()
    shown = runner.invoke(command, ["--help"]).output
    section = shown.split("Shapes and graph:")[1].split("\n\n")[0]
    assert "--lint / --no-lint" in section and "Lint fp16 models" in section
    assert runner.invoke(command, ["--no-lint"]).exit_code == 0 and seen["lint"] is False

    name, check = config_keys(EXTENDED)["lint"]
    assert name == "lint" and check(False, "ortcompile.toml: lint", Path(".")) is False
    with pytest.raises(UsageError, match=r"ortcompile.toml: lint: expected true or false, not 'yes'"):
        check("yes", "ortcompile.toml: lint", Path("."))

    assert builtin_values(EXTENDED)["lint"] is True
    options = compile_options({**builtin_values(EXTENDED), "lint": False}, table=EXTENDED)
    assert options.lint is False and compile_options(builtin_values(EXTENDED), table=EXTENDED).lint is True

    assert options.recorded("cpu", False, table=EXTENDED)["lint"] is False
    assert "lint" not in dataclasses.replace(options, lint=True).recorded("cpu", False, table=EXTENDED)  # the default is not recorded
    assert part_cli_args(options, EXTENDED)[-1] == "--no-lint"
    assert "--no-lint" not in part_cli_args(dataclasses.replace(options, lint=True), EXTENDED)
