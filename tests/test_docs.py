"""The docs cannot drift from the program.

- docs/cli.md: every command of the click group has a `## command` section, and that section names every one of
  its options (each long and short flag, secondary names such as `--allow-partial` / `--no-time-source`, `-h`),
  the choices of Choice options and the shown defaults; the global `--version` / `--help` are documented.
- docs/exit-codes.md: every error class in ortcompile.errors and its exit code, and 128 + SIGINT / SIGTERM.
- Links between the docs point at files that exist.
- What cli.md promises about startup and completion: `--help` imports neither onnx nor onnxruntime, nor does an
  `--if-changed` check that finds the output current; `_ORTCOMPILE_COMPLETE=bash_source ortcompile` prints a
  completion script and the completion answers with real options and choices.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import click
import pytest
from helpers import FIXTURES, REPO, run_cli

import ortcompile.errors as errors
from ortcompile.cli import main

DOCS = REPO / "docs"
CLI_MD = DOCS / "cli.md"
EXIT_MD = DOCS / "exit-codes.md"
MY_DOCS = [CLI_MD, EXIT_MD, DOCS / "output-layout.md", DOCS / "why-two-passes.md"]


def sections(text: str) -> dict[str, str]:
    """`## heading` -> the text up to the next `## ` heading."""
    found: dict[str, str] = {}
    for block in re.split(r"^## ", text, flags=re.M)[1:]:
        heading, _, body = block.partition("\n")
        found[heading.strip()] = body
    return found


def mentioned(flag: str, text: str) -> bool:
    """`--flag` as code: followed by a closing backtick, a space (metavar) or '=' inside the code span."""
    return re.search(r"`" + re.escape(flag) + r"[` =\[]", text) is not None


def row_of(flag: str, text: str) -> str:
    rows = [line for line in text.splitlines() if line.startswith("|") and mentioned(flag, line.split("|")[1])]
    assert rows, f"no table row for {flag}"
    return rows[0]


def commands() -> list[tuple[str, click.Command]]:
    return sorted(main.commands.items())


def test_every_command_has_a_section() -> None:
    doc = sections(CLI_MD.read_text())
    names = [name for name, _ in commands()]
    assert {"compile", "inspect", "verify", "eps"} <= set(names)  # the introspection sees the real group
    for name in names:
        assert name in doc, f"docs/cli.md has no '## {name}' section"
        assert f"ortcompile {name}" in doc[name], f"'## {name}' has no synopsis"
    summary = CLI_MD.read_text().split("\n## ", 1)[0]
    for name in names:
        assert f"[`{name}`](#{name})" in summary, f"the command table at the top does not list {name}"


@pytest.mark.parametrize("name", sorted(main.commands))
def test_every_option_of_every_command_is_documented_in_its_section(name: str) -> None:
    command = main.commands[name]
    section = sections(CLI_MD.read_text())[name]
    flags = []
    for param in command.params:
        if isinstance(param, click.Argument):
            metavar = param.name.upper()
            assert metavar in section, f"{name}: argument {metavar} is not in its synopsis"
            continue
        flags += [*param.opts, *param.secondary_opts]
    flags += main.context_settings["help_option_names"]  # -h / --help on every command
    missing = [flag for flag in flags if not mentioned(flag, section)]
    assert not missing, f"docs/cli.md '## {name}' does not document {missing}"
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        if isinstance(param.type, click.Choice):
            for choice in param.type.choices:
                assert choice in row_of(param.opts[0], section), f"{name} {param.opts[0]}: choice {choice!r} undocumented"
        if param.show_default and not param.is_flag and param.default is not None:
            assert f"`{param.default}`" in row_of(param.opts[0], section), \
                f"{name} {param.opts[0]}: default {param.default!r} is not the one documented"


def test_global_options_are_documented() -> None:
    text = CLI_MD.read_text()
    global_section = sections(text)["Global options"]
    group_flags = [flag for param in main.params for flag in (*param.opts, *param.secondary_opts)]
    assert "--version" in group_flags
    for flag in [*group_flags, *main.context_settings["help_option_names"]]:
        assert mentioned(flag, global_section), flag


def test_every_exit_code_is_in_the_table() -> None:
    text = EXIT_MD.read_text()
    rows = {int(m.group(1)): m.group(0) for m in re.finditer(r"^\| (\d+) \|.*$", text, flags=re.M)}
    classes = [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
               if issubclass(cls, errors.OrtCompileError) and cls.__module__ == errors.__name__]
    assert {c.__name__ for c in classes} >= {"CompilationFailed", "UsageError", "InvalidModel", "OutputError", "VerificationFailed"}
    for cls in classes:
        assert cls.exit_code in rows, f"exit code {cls.exit_code} ({cls.__name__}) is not in docs/exit-codes.md"
        assert f"`{cls.__name__}`" in rows[cls.exit_code], f"{cls.__name__} is not in the row of exit code {cls.exit_code}"
    for signum in (signal.SIGINT, signal.SIGTERM):  # errors.Interrupted: 128 + signal number
        assert 128 + signum in rows and "`Interrupted`" in rows[128 + signum]
    assert 0 in rows
    assert set(rows) == {0, *(c.exit_code for c in classes), 128 + signal.SIGINT, 128 + signal.SIGTERM}, \
        "docs/exit-codes.md lists a code the program never uses"


def test_links_between_docs_resolve() -> None:
    for doc in MY_DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def test_anchors_within_cli_md_exist() -> None:
    text = CLI_MD.read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}
    for anchor in re.findall(r"\]\(#([^)]+)\)", text):
        assert anchor in anchors, f"cli.md links to #{anchor}, which is no heading"


# ---------------------------------------------------------------- what cli.md promises


_IMPORTS_AFTER = """
import sys
from ortcompile.cli import main
try:
    main(sys.argv[1:], standalone_mode=True)
except SystemExit:
    pass
sys.stderr.write("HEAVY " + ",".join(m for m in ("onnx", "onnxruntime", "numpy") if m in sys.modules) + "\\n")
"""


def heavy_imports(*args: object, env: dict[str, str] | None = None) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", _IMPORTS_AFTER, *map(str, args)], capture_output=True, text=True, timeout=120, env=env)
    line = [text for text in proc.stderr.splitlines() if text.startswith("HEAVY ")][-1]
    return [m for m in line[len("HEAVY "):].split(",") if m]


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["compile", "--help"], ["inspect", "--help"], ["verify", "--help"], ["eps", "--help"]])
def test_help_and_version_import_neither_onnx_nor_onnxruntime(args: list[str]) -> None:
    assert heavy_imports(*args) == []


def test_up_to_date_check_imports_neither_onnx_nor_onnxruntime(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    source = tmp_path / "split.onnx"
    shutil.copyfile(FIXTURES / "split.onnx", source)
    args = ["compile", source, "-o", tmp_path / "out", "--if-changed", "--json"]
    assert "onnxruntime" in heavy_imports(*args, env=env)  # the first run compiles: it must load ORT
    assert (tmp_path / "out" / "split_ctx.onnx").is_file()
    assert heavy_imports(*args, env=env) == []


def _console_script() -> str:
    script = Path(sys.executable).parent / "ortcompile"
    if not script.exists():
        found = shutil.which("ortcompile")
        if found is None:
            pytest.fail("the ortcompile console script is not installed (pip install -e .)")
        return found
    return str(script)


def complete(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_console_script()], capture_output=True, text=True, timeout=60, env={**os.environ, **env})


def test_completion_scripts_are_printed() -> None:
    bash = complete({"_ORTCOMPILE_COMPLETE": "bash_source"})
    assert bash.returncode == 0 and bash.stderr == ""
    assert "_ortcompile_completion()" in bash.stdout
    assert "complete -o nosort -F _ortcompile_completion ortcompile" in bash.stdout
    zsh = complete({"_ORTCOMPILE_COMPLETE": "zsh_source"})
    assert zsh.returncode == 0 and zsh.stdout.startswith("#compdef ortcompile")
    fish = complete({"_ORTCOMPILE_COMPLETE": "fish_source"})
    assert fish.returncode == 0 and "complete --no-files --command ortcompile" in fish.stdout
    doc = CLI_MD.read_text()
    for shell in ("bash_source", "zsh_source", "fish_source"):
        assert f"_ORTCOMPILE_COMPLETE={shell} ortcompile" in doc


def test_bash_completion_answers_with_commands_options_and_choices() -> None:
    def answers(words: str, cword: int) -> list[str]:
        proc = complete({"_ORTCOMPILE_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(cword)})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()

    assert "plain,compile" in answers("ortcompile comp", 1)
    assert answers("ortcompile compile --if", 2) == ["plain,--if-changed"]
    assert answers("ortcompile compile --embed ", 3) == ["plain,auto", "plain,always", "plain,never"]
    assert "plain,--no-time-source" in answers("ortcompile verify --no", 2)


def test_json_field_tables_match_a_real_compile(tmp_path: Path) -> None:
    """The `--json` field table in cli.md lists exactly the keys a compile prints."""
    proc = run_cli("compile", FIXTURES / "split.onnx", "-o", tmp_path, "--json", env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "c")})
    assert proc.returncode == 0, proc.stderr
    keys = set(json.loads(proc.stdout)["outputs"][0])
    table = sections(CLI_MD.read_text())["compile"].split("### JSON summary", 1)[1].split("###", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)`", table, flags=re.M)) | set(re.findall(r"^\| `\w+`, `(\w+)`", table, flags=re.M))
    assert documented == keys, (documented - keys, keys - documented)
