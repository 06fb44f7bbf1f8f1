"""The command line as scripts use it: stdout contents, exit codes, one-line errors, `eps`.

Real ORT, real QNN EP. The CLI runs in this process (helpers.run_cli, fd-level capture); the tests that QNN's
start-up banners stay off stdout and stderr run `python -m ortcompile` in a fresh process, where the EP is loaded
and registered by ortcompile itself (in this process it was registered before, so no banner is printed).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import click
import onnx
import pytest
from helpers import (
    FIXTURES,
    assert_no_junk,
    assert_one_line_error,
    check_output_dir,
    cpu_only_model,
    cpu_session,
    published,
    run_cli,
    run_process,
    seeded_inputs,
    snapshot,
)

from ortcompile.cli import main as group
from ortcompile.cli.sections import OTHER, SECTIONS, long_name

SPLIT = FIXTURES / "split.onnx"
DYNAMIC = FIXTURES / "dynamic.onnx"


# ---------------------------------------------------------------- stdout

@pytest.mark.parametrize("verbose", [False, True])
def test_json_is_the_only_thing_on_stdout(verbose: bool, tmp_path: Path) -> None:
    """The QNN SDK printf()s a banner while it loads; with --json (and -v) stdout must still parse.
    A fresh process: the banner is printed where ortcompile loads and registers the EP."""
    proc = run_process("compile", FIXTURES / "mlp.onnx", SPLIT, "-o", tmp_path, "--ep", "qnn", "--json", *(["-v"] if verbose else []))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # fails on any stray line
    assert list(report) == ["outputs"]
    assert [Path(o["model"]).name for o in report["outputs"]] == ["mlp_ctx.onnx", "split_ctx.onnx"]
    for output, stem, nodes in zip(report["outputs"], ["mlp", "split"], [1, 3]):
        manifest = check_output_dir(tmp_path, stem)
        assert output["files"] == manifest["files"]
        assert all(set(f) >= {"name", "size", "sha256", "role"} for f in output["files"])
        assert output["total_bytes"] == sum(f["size"] for f in output["files"]) > 0
        assert output["epcontext_nodes"] == nodes
        assert output["timings"] and all(isinstance(v, (int, float)) and v >= 0 for v in output["timings"].values())
        assert "compile" in output["timings"]
        assert isinstance(output["peak_rss_bytes"], int) and 50 << 20 < output["peak_rss_bytes"] < 8 << 30
    if verbose:
        assert "ortcompile:" in proc.stderr  # -v detail goes to stderr, never stdout


def test_quiet_prints_nothing(tmp_path: Path) -> None:
    """-q: nothing at all on stdout or stderr, QNN's load-time banner included (a fresh process, as above), for a
    model with nothing to warn about (split.onnx's fragmented QNN graph is a warning, which -q keeps)."""
    proc = run_process("compile", FIXTURES / "mlp.onnx", "-o", tmp_path, "--ep", "qnn", "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr == ""
    check_output_dir(tmp_path, "mlp")


def test_quiet_still_reports_errors(tmp_path: Path) -> None:
    proc = run_cli("compile", tmp_path / "missing.onnx", "-o", tmp_path / "out", "-q")
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert_one_line_error(proc.stderr, "missing.onnx")


def test_default_prints_one_summary_line_per_model(tmp_path: Path) -> None:
    proc = run_cli("compile", SPLIT, "-o", tmp_path, "--ep", "qnn")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1
    assert str(tmp_path / "split_ctx.onnx") in lines[0] and "3 EPContext nodes" in lines[0]


# ---------------------------------------------------------------- NPU EPs: static shapes, or nothing compiled

def test_dynamic_model_without_fix_dim_is_refused_with_the_flags_to_add(tmp_path: Path) -> None:
    """QNN given a dynamic graph takes only shape glue that does not load: refused before any work (exit 2)."""
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("compile", DYNAMIC, "-o", out, "--ep", "qnn")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert_one_line_error(proc.stderr, "static shapes only", "x[batch,256]", "--fix-dim batch=N")
    assert snapshot(out) == {}  # nothing published, nothing left


def test_model_the_ep_takes_nothing_of_fails_with_a_hint(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("compile", cpu_only_model(tmp_path / "sinh.onnx"), "-o", out, "--ep", "qnn")
    assert proc.returncode == 1
    assert_one_line_error(proc.stderr, "qnn: the EP took none of this model's nodes", "--allow-partial")
    assert snapshot(out) == {}


def test_allow_partial_publishes_a_cpu_only_model_with_a_warning(tmp_path: Path) -> None:
    source = cpu_only_model(tmp_path / "sinh.onnx")
    proc = run_cli("compile", source, "-o", tmp_path / "out", "--ep", "qnn", "--allow-partial", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "ortcompile: warning: sinh.onnx: qnn compiled no nodes (--allow-partial)" in proc.stderr
    assert json.loads(proc.stdout)["outputs"][0]["epcontext_nodes"] == 0
    check_output_dir(tmp_path / "out", "sinh")
    model = onnx.load(str(tmp_path / "out" / "sinh_ctx.onnx"), load_external_data=False)
    assert [n.op_type for n in model.graph.node] == ["Sinh"]
    compiled, reference = cpu_session(tmp_path / "out" / "sinh_ctx.onnx"), cpu_session(source)
    feeds = seeded_inputs(reference, 0)
    assert compiled.run(None, feeds)[0].tobytes() == reference.run(None, feeds)[0].tobytes()


@pytest.mark.parametrize("option", ["soc_model=99999", "device_id=7", "backend_path=/nonexistent"])
def test_ep_that_cannot_start_fails_even_with_allow_partial(option: str, tmp_path: Path) -> None:
    """A provider option value the EP rejects makes QNN take nothing; that must not pass for "nothing to
    compile" and publish a CPU-only model (functional-2). The EP is asked before compiling (issue 15): a
    usage error naming the option, with the EP's reason."""
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("compile", SPLIT, "-o", out, "--ep", "qnn", "--ep-option", option, "--allow-partial")
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, "qnn:", f"--ep-option {option}")
    assert snapshot(out) == {}


# ---------------------------------------------------------------- exit code 2: usage errors

@pytest.mark.parametrize("args, needle", [
    (["--ep-option", "novalue"], "--ep-option"),
    (["--ep-option", "=x"], "--ep-option"),
    (["--ep", "bogus"], "bogus"),
    (["--fix-dim", "batch"], "--fix-dim"),
    (["--fix-dim", "batch=x"], "--fix-dim"),
    (["--fix-dim", "batch=0"], "--fix-dim"),
    (["--fix-dim", "nosuch=1"], "nosuch"),  # unknown dim: says which ones exist
    (["--fix-shape", "x=1"], "--fix-shape"),  # wrong rank
    (["--fix-shape", "x=a,b"], "--fix-shape"),
    (["--fix-shape", "1,256"], "--fix-shape"),
    (["--fix-shape", "nosuch=1,256"], "nosuch"),
    (["--align", "3000"], "--align"),
    (["--shard-size", "0"], "--shard-size"),
])
def test_usage_errors_exit_2(args: list[str], needle: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli("compile", DYNAMIC, "-o", out, "--ep", "qnn", *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert_one_line_error(proc.stderr, needle)
    assert not out.exists()  # rejected before anything was created


def test_unknown_dim_lists_the_known_ones(tmp_path: Path) -> None:
    proc = run_cli("compile", DYNAMIC, "-o", tmp_path, "--fix-dim", "nosuch=1")
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, "batch")


@pytest.mark.parametrize("args", [["--embed", "sometimes"], ["--inline-threshold", "abc"], ["--bogus-flag"]])
def test_click_usage_errors_exit_2_without_traceback(args: list[str], tmp_path: Path) -> None:
    proc = run_cli("compile", SPLIT, "-o", tmp_path / "out", *args)
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, "compile:", "(see 'ortcompile compile --help')")
    assert proc.stdout == ""
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- exit code 3: bad input

@pytest.mark.parametrize("content, needle", [
    (None, "no such file"),
    (b"", "empty"),
    (b"\xff\xfe not a protobuf \x00\x01" * 50, "not a valid ONNX model"),
    (b"hello, I am a text file\n", ""),
])
def test_bad_input_exits_3(content: bytes | None, needle: str, tmp_path: Path) -> None:
    model = tmp_path / "in.onnx"
    if content is not None:
        model.write_bytes(content)
    out = tmp_path / "out"
    proc = run_cli("compile", model, "-o", out, "--ep", "cpu")
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == ""
    assert_one_line_error(proc.stderr, "in.onnx", needle)
    assert not out.exists()


# ---------------------------------------------------------------- exit code 4: the output

def test_existing_output_needs_force(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = run_cli("compile", SPLIT, "-o", out, "--ep", "qnn", "--embed", "never", "-q")
    assert first.returncode == 0, first.stderr
    before = snapshot(out)
    again = run_cli("compile", SPLIT, "-o", out, "--ep", "qnn", "--embed", "always")
    assert again.returncode == 4
    assert_one_line_error(again.stderr, "already exists", "--force")
    assert snapshot(out) == before


def test_force_replaces_the_previous_output(tmp_path: Path) -> None:
    """--embed never then --force --embed always: the old .bin, not produced any more, is removed too."""
    out = tmp_path / "out"
    (out).mkdir()
    (out / "unrelated.txt").write_text("not ours")
    assert run_cli("compile", SPLIT, "-o", out, "--ep", "qnn", "--embed", "never", "-q").returncode == 0
    blob = published(out, "split_ctx_qnn.bin")
    proc = run_cli("compile", SPLIT, "-o", out, "--ep", "qnn", "--embed", "always", "--force", "-q")
    assert proc.returncode == 0, proc.stderr
    names = set(os.listdir(out)) - {"unrelated.txt"}
    manifest = json.loads((out / "split_ctx.manifest.json").read_text())
    assert manifest["options"]["embed"] == "always"
    assert names - {".split_ctx.stamp.json"} == {f["name"] for f in manifest["files"]} | {"split_ctx.manifest.json"}
    assert not (out / blob).exists()
    assert (out / "unrelated.txt").read_text() == "not ours"  # --force touches only this model's outputs
    assert_no_junk(out)


def test_output_path_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.write_text("a file")
    proc = run_cli("compile", SPLIT, "-o", target, "--ep", "qnn")
    assert proc.returncode == 4
    assert_one_line_error(proc.stderr, "is a file")
    assert target.read_text() == "a file"


def _model_with_external_data(path: Path, data_name: str) -> None:
    model = onnx.load(str(FIXTURES / "mlp.onnx"))
    onnx.save(model, str(path), save_as_external_data=True, location=data_name, size_threshold=1024)


def test_output_would_overwrite_input_via_symlink(tmp_path: Path) -> None:
    """The destination's model name resolves to the input (a symlink left by a build script)."""
    src = tmp_path / "src"
    src.mkdir()
    _model_with_external_data(src / "m.onnx", "m.onnx.data")
    out = tmp_path / "out"
    out.mkdir()
    (out / "m_ctx.onnx").symlink_to(src / "m.onnx")
    before_src, before_out = snapshot(src), snapshot(out)
    proc = run_cli("compile", src / "m.onnx", "-o", out, "--ep", "cpu", "--force")
    assert proc.returncode == 4
    assert_one_line_error(proc.stderr, "overwrite the input")
    assert snapshot(src) == before_src and snapshot(out) == before_out


def test_output_would_overwrite_input_external_data(tmp_path: Path) -> None:
    """Compiling into the model's own directory, when its external data is named like our data output
    (functional-1: it was silently replaced, destroying the input)."""
    _model_with_external_data(tmp_path / "m.onnx", "m_ctx.onnx.data")
    before = snapshot(tmp_path)
    proc = run_cli("compile", tmp_path / "m.onnx", "-o", tmp_path, "--ep", "cpu")
    assert snapshot(tmp_path) == before  # the input is intact whatever happens
    assert proc.returncode == 4
    assert_one_line_error(proc.stderr, "overwrite the input")


# ---------------------------------------------------------------- eps

def test_eps_json(tmp_path: Path) -> None:
    """A fresh process: `eps` loads and registers every installed EP plugin, and stdout must still be only JSON."""
    proc = run_process("eps", "--json")
    assert proc.returncode == 0, proc.stderr
    eps = {e["name"]: e for e in json.loads(proc.stdout)["eps"]}
    assert eps["qnn"]["available"] is True and eps["qnn"]["produces_epcontext"] is True
    assert eps["qnn"]["ep_name"] == "QNNExecutionProvider" and eps["qnn"]["devices"]
    assert eps["cpu"]["available"] is True and eps["cpu"]["produces_epcontext"] is False
    assert eps["webgpu"]["produces_epcontext"] is False and eps["openvino"]["produces_epcontext"] is True
    for name in ("openvino", "webgpu"):  # listed whether or not installed here; each says why it is unavailable
        entry = eps[name]
        assert entry["available"] == (entry["installed"] and bool(entry["devices"]))
        if not entry["installed"]:
            assert f"pip install {entry['package']}" in entry["note"] and entry["version"] is None
        elif not entry["devices"]:
            assert "no device" in entry["note"]


def test_eps_text_and_quiet() -> None:
    text = run_cli("eps")
    assert text.returncode == 0, text.stderr
    rows = {line.split()[0]: line.split() for line in text.stdout.splitlines()[1:]}
    assert rows["qnn"][1:4] == ["QNNExecutionProvider", "yes", "yes"]
    assert rows["cpu"][1:4] == ["CPUExecutionProvider", "yes", "no"]
    quiet = run_cli("eps", "-q")
    assert quiet.returncode == 0 and quiet.stdout == ""



@pytest.mark.parametrize("name", ["compile", "split"])
def test_help_lists_every_option_once_in_a_section(name: str) -> None:
    """compile's ~45 options read as groups (cli/sections.py): every option is in exactly one named section, in
    SECTIONS' order, and none falls through to "Other options" (a new option must be given a section)."""
    text = run_cli(name, "--help").stdout
    titles = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ") and line[:-1] in [*SECTIONS, OTHER]]
    assert OTHER not in titles and titles == [t for t in SECTIONS if t in titles] and len(titles) >= 8, titles
    command = group.commands[name]
    options = [p for p in command.params if isinstance(p, click.Option)]
    for option in options:
        shown = [line for line in text.splitlines() if re.match(rf"  (-\w, )?{re.escape(long_name(option))}(?=[ ,/]|$)", line)]
        assert len(shown) == 1, (long_name(option), shown)
