"""The config file (ortcompile.toml / [tool.ortcompile]): found, checked, merged per model, through the CLI.

Issue 15, point 4: one flag set had to fit every model, so `make MODELS="mlp dynamic" ORTCOMPILE_FLAGS="--fix-dim
batch=1"` failed on the static model. Every test runs the click group in this process (CliRunner) in a sandbox
directory, except the Makefile test, which runs the real `make` on a copy of examples/. Most compiles use the CPU
EP with `check = "none"` (milliseconds); the QNN ones are the cases where static shapes matter.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from helpers import FIXTURES, REPO, assert_one_line_error

from ortcompile.cli import main
from ortcompile.config import find_config, load_config, model_settings, resolve_config

QUICK = 'ep = "cpu"\ncheck = "none"\n'  # compiles in milliseconds: the settings are what is tested


@pytest.fixture(autouse=True)
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path/work is the current directory, with mlp, dynamic, split and mixed.onnx; no $ORTCOMPILE_CONFIG, own stamp cache."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("mlp.onnx", "dynamic.onnx", "split.onnx", "mixed.onnx"):
        shutil.copyfile(FIXTURES / name, work / name)
    (tmp_path / ".git").mkdir()  # the search stops here, whatever lies above tmp_path
    monkeypatch.chdir(work)
    monkeypatch.delenv("ORTCOMPILE_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return work


def cli(*args: object) -> Result:
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    print(f"$ ortcompile {' '.join(map(str, args))} -> {result.exit_code}\n{result.stdout}{result.stderr}")
    return result


def ok(*args: object) -> Result:
    result = cli(*args)
    assert result.exit_code == 0, result.stderr
    return result


def options(out: Path, stem: str) -> dict[str, Any]:
    return json.loads((out / f"{stem}_ctx.manifest.json").read_text())["options"]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ---------------------------------------------------------------- the issue: one command line, every model


def test_a_batch_shares_one_command_line_and_each_model_gets_its_pins(sandbox: Path) -> None:
    """QNN needs static shapes: the config's default pin reaches dynamic.onnx and is left out (said under -v) for
    mlp.onnx, which has no `batch`; the manifests record what each compile used."""
    write(sandbox / "ortcompile.toml", 'check = "load"\nfix-dim = { batch = 1 }\n')
    result = ok("compile", "mlp.onnx", "dynamic.onnx", "-o", "out", "-v")
    assert "settings from ortcompile.toml" in result.stderr
    assert "mlp.onnx: no symbolic dimension 'batch': fix-dim batch=1 from ortcompile.toml (top-level defaults) left out" in result.stderr
    assert options(sandbox / "out", "dynamic")["fix_dims"] == {"batch": 1} and options(sandbox / "out", "dynamic")["ep"] == "qnn"
    assert options(sandbox / "out", "mlp")["fix_dims"] == {}
    # the output is current for these settings: the dropped pin does not make --if-changed rebuild mlp
    again = ok("compile", "mlp.onnx", "dynamic.onnx", "-o", "out", "--if-changed")
    assert again.stdout.count("up to date") == 2
    # without the file, a pin the model lacks is still an error for a single model, as it always was
    failed = cli("compile", "mlp.onnx", "-o", "out2", "--fix-dim", "batch=1", "--no-config")
    assert failed.exit_code == 2
    assert_one_line_error(failed.stderr, "--fix-dim batch: the model has no symbolic dimension 'batch'")


def test_a_batch_command_line_pin_applies_where_the_dim_exists_but_must_exist_somewhere(sandbox: Path) -> None:
    result = ok("compile", "mlp.onnx", "dynamic.onnx", "-o", "out", "--ep", "cpu", "--check", "none", "--fix-dim", "batch=2", "-v")
    assert "mlp.onnx: no symbolic dimension 'batch': fix-dim batch=2 from the command line left out" in result.stderr
    assert options(sandbox / "out", "dynamic")["fix_dims"] == {"batch": 2} and options(sandbox / "out", "mlp")["fix_dims"] == {}
    failed = cli("compile", "mlp.onnx", "split.onnx", "-o", "out3", "--ep", "cpu", "--fix-dim", "batch=1")
    assert failed.exit_code == 2
    assert_one_line_error(failed.stderr, "--fix-dim batch: none of the models has a symbolic dimension 'batch'")
    assert not (sandbox / "out3").exists()  # refused before any model was compiled


def test_a_pin_in_the_models_own_section_must_apply(sandbox: Path) -> None:
    write(sandbox / "ortcompile.toml", QUICK + '[models.mlp]\nfix-dim = { batch = 1 }\n')
    failed = cli("compile", "dynamic.onnx", "mlp.onnx", "-o", "out")
    assert failed.exit_code == 2
    assert_one_line_error(failed.stderr, "ortcompile.toml: models.mlp.fix-dim.batch: mlp.onnx has no symbolic dimension 'batch' (it has: none)")
    assert not (sandbox / "out").exists()


# ---------------------------------------------------------------- precedence and matching


def test_precedence_builtin_then_defaults_then_sections_then_the_command_line(sandbox: Path) -> None:
    write(sandbox / "ortcompile.toml", QUICK + 'align = 64\ninline-threshold = "2K"\nembed = "never"\n'
                                               '[models."ml*"]\nalign = 128\n[models."mlp.onnx"]\nshard-size = "1M"\n')
    ok("compile", "mlp.onnx", "split.onnx", "-o", "out")
    mlp, split = options(sandbox / "out", "mlp"), options(sandbox / "out", "split")
    assert mlp["layout"] == {"inline_threshold": 2048, "align": 128, "align_threshold": 1 << 20, "shard_size": 1 << 20}
    assert split["layout"] == {"inline_threshold": 2048, "align": 64, "align_threshold": 1 << 20, "shard_size": None}
    assert mlp["embed"] == split["embed"] == "never"
    # an option given on the command line wins, even when it spells the built-in default (--embed auto)
    ok("compile", "mlp.onnx", "split.onnx", "-o", "out", "--force", "--align", "256", "--embed", "auto")
    mlp, split = options(sandbox / "out", "mlp"), options(sandbox / "out", "split")
    assert mlp["layout"]["align"] == split["layout"]["align"] == 256 and mlp["embed"] == split["embed"] == "auto"
    assert mlp["layout"]["inline_threshold"] == 2048 and mlp["layout"]["shard_size"] == 1 << 20  # the rest still from the file


def test_tables_merge_key_by_key_and_a_pattern_with_a_slash_matches_the_path(sandbox: Path) -> None:
    """dynamic has `batch`, mixed has `n`: the defaults pin both (each model keeps the one it has), a section by
    path overrides one key of the table."""
    write(sandbox / "conf" / "ortcompile.toml", QUICK + 'fix-dim = { batch = 1, n = 3 }\n[models."../dyn*.onnx"]\nfix-dim = { batch = 4 }\n')
    ok("compile", "dynamic.onnx", "mixed.onnx", "-o", "out", "--config", "conf/ortcompile.toml")
    assert options(sandbox / "out", "dynamic")["fix_dims"] == {"batch": 4}
    assert options(sandbox / "out", "mixed")["fix_dims"] == {"n": 3}


def test_naming_another_ep_drops_the_target_and_ep_options_chosen_for_the_first(sandbox: Path) -> None:
    """`make EP=cpu` with a config written for QNN: the QNN target and options do not follow to the CPU EP."""
    write(sandbox / "ortcompile.toml", 'ep = "qnn"\ntarget = "sm8650"\nep-option = { htp_performance_mode = "burst" }\ncheck = "none"\n'
                                       '[models.split]\nep = "cpu"\n')
    ok("compile", "mlp.onnx", "-o", "out", "--ep", "cpu")
    assert options(sandbox / "out", "mlp")["ep"] == "cpu" and options(sandbox / "out", "mlp")["ep_options"] == {}
    assert "target" not in options(sandbox / "out", "mlp")
    ok("compile", "split.onnx", "-o", "out")  # the section names the CPU EP
    assert options(sandbox / "out", "split")["ep"] == "cpu" and "target" not in options(sandbox / "out", "split")
    # the same EP named again (short or full name) keeps them
    settings = model_settings(load_config(sandbox / "ortcompile.toml"), "mlp.onnx", {"ep": "QNNExecutionProvider"}, {"ep"})
    assert settings.values["target"] == "sm8650" and settings.values["ep_options"] == {"htp_performance_mode": "burst"}


def test_split_reads_the_config_too(sandbox: Path) -> None:
    write(sandbox / "ortcompile.toml", QUICK + '[models.split]\npartition = "300KiB"\n')
    result = ok("split", "split.onnx", "-o", "parts", "--json")
    assert json.loads(result.stdout)["budget_bytes"] == 300 * 1024


def test_share_weights_needs_one_set_of_settings(sandbox: Path) -> None:
    write(sandbox / "ortcompile.toml", QUICK + '[models.mlp]\nalign = 64\n')
    failed = cli("compile", "mlp.onnx", "split.onnx", "-o", "out", "--share-weights")
    assert failed.exit_code == 2
    assert_one_line_error(failed.stderr, "--share-weights compiles the batch with one set of options", "mlp.onnx")


# ---------------------------------------------------------------- finding the file


def test_found_upwards_pyproject_table_and_which_file_wins(sandbox: Path) -> None:
    """From a subdirectory: the first ortcompile.toml or pyproject.toml with [tool.ortcompile] above; ortcompile.toml
    wins in the same directory; a pyproject.toml without the table ends the search (it marks the project's root).
    Shown by the file an error names."""
    deep = sandbox / "a" / "b"
    deep.mkdir(parents=True)
    write(sandbox / "a" / "pyproject.toml", '[tool.ortcompile]\nalign = 3\n')
    os.chdir(deep)
    failed = cli("compile", "../../mlp.onnx", "-o", "out")
    assert_one_line_error(failed.stderr, "../pyproject.toml: tool.ortcompile.align: expected a power of two up to 16 MiB, not 3")
    write(sandbox / "a" / "ortcompile.toml", 'embed = "sometimes"\n')
    failed = cli("compile", "../../mlp.onnx", "-o", "out")
    assert_one_line_error(failed.stderr, "../ortcompile.toml: embed: expected one of 'auto', 'always', 'never', not 'sometimes'")
    assert find_config(deep) == sandbox / "a" / "ortcompile.toml"
    write(deep / "pyproject.toml", '[project]\nname = "x"\n')  # no [tool.ortcompile]: a project of its own
    assert find_config(deep) is None


def test_the_search_stops_at_the_repository_root(sandbox: Path) -> None:
    (sandbox / "repo" / ".git").mkdir(parents=True)
    write(sandbox / "ortcompile.toml", "broken = \n")  # above the repository: never read
    assert find_config(sandbox / "repo") is None
    os.chdir(sandbox / "repo")
    ok("compile", "../mlp.onnx", "-o", "out", "--ep", "cpu", "--check", "none")


def test_config_option_environment_and_no_config(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(sandbox / "ortcompile.toml", 'align = "big"\n')  # found, but overridden below
    write(sandbox / "elsewhere.toml", QUICK + "align = 64\n")
    write(sandbox / "env.toml", QUICK + "align = 128\n")
    assert_one_line_error(cli("compile", "mlp.onnx", "-o", "out").stderr, "ortcompile.toml: align: expected a size")
    ok("compile", "mlp.onnx", "-o", "out", "--config", "elsewhere.toml")
    assert options(sandbox / "out", "mlp")["layout"]["align"] == 64
    monkeypatch.setenv("ORTCOMPILE_CONFIG", "env.toml")
    ok("compile", "mlp.onnx", "-o", "out", "--force")
    assert options(sandbox / "out", "mlp")["layout"]["align"] == 128
    ok("compile", "mlp.onnx", "-o", "out", "--force", "--config", "elsewhere.toml")  # --config wins over the variable
    assert options(sandbox / "out", "mlp")["layout"]["align"] == 64
    ok("compile", "mlp.onnx", "-o", "out", "--force", "--no-config", "--ep", "cpu", "--check", "none")
    assert options(sandbox / "out", "mlp")["layout"]["align"] == 4096
    monkeypatch.setenv("ORTCOMPILE_CONFIG", "missing.toml")
    assert_one_line_error(cli("compile", "mlp.onnx", "-o", "out").stderr, "missing.toml: no such config file (from $ORTCOMPILE_CONFIG)")


# ---------------------------------------------------------------- strict checking: exit 2, one line naming file and key


@pytest.mark.parametrize(("text", "needle"), [
    ("fixdim = { batch = 1 }\n", "ortcompile.toml: fixdim: unknown key (did you mean 'fix-dim'?)"),
    ("ep_option = { a = 1 }\n", "ortcompile.toml: ep_option: unknown key (did you mean 'ep-option'?)"),
    ("[models.mlp]\nmodels = 1\n", "ortcompile.toml: models.mlp.models: unknown key"),
    ("ep = 3\n", "ortcompile.toml: ep: expected a non-empty string, not 3"),
    ("prepare = \"yes\"\n", "ortcompile.toml: prepare: expected true or false"),
    ("shard-size = \"2 parsecs\"\n", "ortcompile.toml: shard-size: expected a size in bytes"),
    ("inline-threshold = -1\n", "ortcompile.toml: inline-threshold: expected a size in bytes"),
    ("partition = 0\n", "ortcompile.toml: partition: a part must hold a positive size of weights"),
    ("check = \"maybe\"\n", "ortcompile.toml: check: expected one of 'auto', 'none', 'load', 'run'"),
    ("[fix-dim]\nbatch = 0\n", "ortcompile.toml: fix-dim.batch: expected a positive whole number, not 0"),
    ("fix-dim = { \"seq len\" = true }\n", 'ortcompile.toml: fix-dim."seq len": expected a positive whole number, not True'),
    ("fix-shape = { x = \"1,256\" }\n", "ortcompile.toml: fix-shape.x: expected a list of dimensions"),
    ("freeze = { sr = \"16k\" }\n", "ortcompile.toml: freeze.sr: expected a number"),
    ("ep-option = { enable = true }\n", "ortcompile.toml: ep-option.enable: expected a string or a number"),
    ("ep-option = \"burst\"\n", "ortcompile.toml: ep-option: expected a table"),
    ("models = 3\n", "ortcompile.toml: models: expected tables such as [models.\"name\"]"),
    ("[models]\nmlp = 3\n", "ortcompile.toml: models.mlp: expected a table of settings"),
    ("[models.\"dyn*\"]\nalign = 100\n", "ortcompile.toml: models.\"dyn*\".align: expected a power of two up to 16 MiB, not 100"),
    ("align = \"32MiB\"\n", "ortcompile.toml: align: expected a power of two up to 16 MiB, not '32MiB'"),
    ("shard-size = 0\n", "ortcompile.toml: shard-size: expected a positive size, not 0"),
    ("align = \n", "ortcompile.toml: not valid TOML: "),
], ids=lambda v: v.split("\n")[0][:30])
def test_a_bad_config_is_a_usage_error_naming_the_file_and_the_key(sandbox: Path, text: str, needle: str) -> None:
    write(sandbox / "ortcompile.toml", text)
    failed = cli("compile", "mlp.onnx", "-o", "out")
    assert failed.exit_code == 2
    assert_one_line_error(failed.stderr, needle)
    assert not (sandbox / "out").exists()


@pytest.mark.parametrize(("args", "needle"), [
    (["--config", "nosuch.toml"], "nosuch.toml: no such config file"),
    (["--config", "pyproject.toml"], "pyproject.toml: no [tool.ortcompile] table"),
    (["--config", "c.toml", "--no-config"], "--config and --no-config contradict each other"),
])
def test_bad_config_options(sandbox: Path, args: list[str], needle: str) -> None:
    write(sandbox / "pyproject.toml", '[project]\nname = "x"\n')
    write(sandbox / "c.toml", QUICK)
    failed = cli("compile", "mlp.onnx", "-o", "out", *args)
    assert failed.exit_code == 2
    assert_one_line_error(failed.stderr, needle)


def test_python_api_without_click(sandbox: Path) -> None:
    write(sandbox / "pyproject.toml", '[tool.ortcompile]\nalign = "64K"\n[tool.ortcompile.models.dynamic]\nfix-dim = { batch = 2 }\n')
    config = resolve_config()
    assert config.path == sandbox / "pyproject.toml" and config.defaults == {"align": 65536}
    assert model_settings(config, "dynamic.onnx").values["fix_dims"] == {"batch": 2}
    assert model_settings(config, "sub/dynamic.onnx").values["align"] == 65536
    assert resolve_config(enabled=False).path is None
    assert "import click" not in (REPO / "ortcompile" / "config.py").read_text()


# ---------------------------------------------------------------- examples/Makefile with examples/ortcompile.toml


@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")
def test_makefile_builds_a_static_and_a_dynamic_model_with_the_example_config(tmp_path: Path) -> None:
    """The issue's command, with examples/ortcompile.toml instead of shared flags; the depfiles list the config,
    so editing it reruns every rule and --if-changed republishes only the model whose settings changed."""
    project = tmp_path / "project"
    (project / "examples").mkdir(parents=True)
    (project / "fixtures").mkdir()
    for name in ("Makefile", "ortcompile.toml"):
        shutil.copyfile(REPO / "examples" / name, project / "examples" / name)
    for name in ("mlp.onnx", "dynamic.onnx"):
        shutil.copyfile(FIXTURES / name, project / "fixtures" / name)
    env = {k: v for k, v in os.environ.items() if k != "ORTCOMPILE_CONFIG"} | {"XDG_CACHE_HOME": str(tmp_path / "xdg")}

    def make(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["make", f"ORTCOMPILE={shlex.quote(sys.executable)} -m ortcompile", "MODELS=mlp dynamic", *args],
                              cwd=project / "examples", env=env, capture_output=True, text=True, timeout=300)
        print(proc.stdout, proc.stderr)
        return proc

    build = project / "examples" / "build"
    first = make()
    assert first.returncode == 0, first.stderr
    assert options(build, "dynamic")["fix_dims"] == {"batch": 1} and options(build, "mlp")["fix_dims"] == {}
    assert (build / "mlp.d").read_text().startswith("build/mlp_ctx.onnx: \\\n  ../fixtures/mlp.onnx \\\n  ortcompile.toml\n")
    assert "Nothing to be done" in make().stdout

    mlp_manifest = (build / "mlp_ctx.manifest.json").stat().st_ino
    config = project / "examples" / "ortcompile.toml"
    config.write_text(config.read_text().replace("batch = 1", "batch = 2"))
    second = make()
    assert second.returncode == 0 and second.stdout.count(" compile ../fixtures/") == 2  # make asks for both
    assert options(build, "dynamic")["fix_dims"] == {"batch": 2}
    assert (build / "mlp_ctx.manifest.json").stat().st_ino == mlp_manifest  # mlp was up to date: not republished

    # what the issue reported: without the file, shared flags cannot fit the static model
    config.unlink()
    shared = make("ORTCOMPILE_FLAGS=--fix-dim batch=1", "RECHECK=1")
    assert shared.returncode != 0 and "has no symbolic dimension 'batch'" in shared.stderr
