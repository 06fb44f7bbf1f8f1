"""Issue 23: the first hour, again — what a new user and an adversarial tester tripped over, each point through the CLI."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from genmodels import mlp, save
from helpers import FIXTURES, assert_one_line_error, run_cli, signal_while_staging, sparse_weights_model, without_progress
from onnx import TensorProto, helper, numpy_helper

from ortcompile import errors
from ortcompile.cli import main as cli_group
from ortcompile.cli.output import EXIT_INTERNAL, Output, report_exception
from ortcompile.sizes import format_size
from ortcompile.worker import ChildTraceback, Worker


@pytest.fixture
def pair_in_two_dirs(tmp_path: Path) -> Path:
    """prefill in a/, decode in b/ (dynamic batch: the prepare step stages a model of its own), run from c/."""
    save(mlp(width=128, batch="batch", seed=1), tmp_path / "a" / "prefill.onnx", external="prefill.onnx.data")
    save(mlp(width=128, batch="batch", seed=2), tmp_path / "b" / "decode.onnx", external="decode.onnx.data")
    (tmp_path / "c").mkdir()
    return tmp_path / "c"


# ---------------------------------------------------------------- 1: --share-weights with relative paths


def test_share_weights_with_relative_paths_from_another_directory(pair_in_two_dirs: Path) -> None:
    proc = run_cli("compile", "../a/prefill.onnx", "../b/decode.onnx", "-o", "out/", "--share-weights", "--ep", "qnn",
                   "--fix-dim", "batch=1", "--no-config", "--json", cwd=pair_in_two_dirs)
    assert proc.returncode == 0, proc.stderr
    outputs = json.loads(proc.stdout)["outputs"]
    assert [Path(o["model"]).name for o in outputs] == ["prefill_ctx.onnx", "decode_ctx.onnx"]
    assert all((pair_in_two_dirs / "out" / Path(o["model"]).name).is_file() for o in outputs)
    for output in outputs:  # each model's real compile time and the worker child's peak, not 0.0s and the parent's
        assert output["timings"]["compile"] > 0.0
        assert output["peak_rss_by_stage"]["compile"] > 50 << 20  # the child imported onnxruntime and QNN
        assert output["peak_rss_bytes"] >= output["peak_rss_by_stage"]["compile"]
    summary = run_cli("compile", "../a/prefill.onnx", "../b/decode.onnx", "-o", "out/", "--share-weights", "--ep", "qnn",
                      "--fix-dim", "batch=1", "--no-config", "--force", cwd=pair_in_two_dirs)
    assert summary.returncode == 0, summary.stderr
    seconds = [float(s) for s in re.findall(r"(\d+\.\d)s compile", summary.stdout)]
    assert len(seconds) == 2 and max(seconds) > 0.0, summary.stdout  # (a tiny model's own share may round to 0.0 s)


# ---------------------------------------------------------------- 2: --debug shows where the child failed


def test_debug_shows_the_worker_childs_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    """An internal error in the child (json.loads given the worker's `reporter` keyword: a TypeError raised in json)."""
    with Worker() as worker, pytest.raises(TypeError) as caught:
        worker.call(json.loads, "{}", doing="testing")
    assert isinstance(caught.value.__cause__, ChildTraceback)
    try:
        raise caught.value
    except TypeError as exc:
        code = report_exception(exc, Output(debug=True))
    err = capsys.readouterr().err
    assert code == EXIT_INTERNAL
    assert "in the worker child:" in err and "json/__init__.py" in err and "in _serve" in err, err  # the child's own frames
    assert err.rstrip().splitlines()[-1].startswith("ortcompile: error: internal error: TypeError")


# ---------------------------------------------------------------- 3: bare `ortcompile`


def test_no_arguments_print_the_help_as_lines() -> None:
    proc = run_cli()
    assert proc.returncode == 2  # what click's groups exit with when given nothing
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("Usage: ortcompile [OPTIONS] COMMAND"), proc.stderr
    assert "error:" not in proc.stderr and len(lines) > 10
    assert any(line.split()[:1] == ["compile"] for line in lines)  # the commands, one a line


# ---------------------------------------------------------------- 4: EP name typos


@pytest.mark.parametrize("args", [("eps", "--ep", "qnnn"), ("eps", "--targets", "--ep", "qnnn"),
                                  ("compile", "model.onnx", "-o", "out", "--ep", "qnnn")])
def test_an_ep_name_typo_is_a_usage_error_with_a_suggestion(args: tuple[str, ...], tmp_path: Path) -> None:
    save(mlp(), tmp_path / "model.onnx")
    proc = run_cli(*args, "--no-config" if args[0] == "compile" else "-q", cwd=tmp_path)
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, "unknown execution provider 'qnnn' (did you mean 'qnn'?)")


def test_eps_of_an_unknown_ep_fails_a_ci_gate() -> None:
    proc = run_cli("eps", "--ep", "bogus", "--json")
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"]["exit_code"] == 2  # not {"eps": []} and exit 0


def test_eps_by_its_full_name_still_lists_it() -> None:
    proc = run_cli("eps", "--ep", "QNNExecutionProvider", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [e["ep_name"] for e in json.loads(proc.stdout)["eps"]] == ["QNNExecutionProvider"]


# ---------------------------------------------------------------- 5: progress on a stderr that is not a terminal


def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    save(mlp(), tmp_path / "model.onnx")
    proc = run_cli("compile", "model.onnx", "-o", "out", "--ep", "cpu", "--no-config", cwd=tmp_path)  # CliRunner's stderr: a pipe
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[:2] == ["ortcompile: reading model", "ortcompile: laying out weights of model.onnx"], proc.stderr
    assert "ortcompile: publishing" in lines and "\r" not in proc.stderr and "data pass" not in proc.stderr  # no bars
    assert proc.stdout.startswith("out/model_ctx.onnx: ")  # the summary stays on stdout
    quiet = run_cli("compile", "model.onnx", "-o", "out", "--ep", "cpu", "--no-config", "--force", "-q", cwd=tmp_path)
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == ""
    refused = run_cli("compile", "model.onnx", "-o", "out", "--ep", "cpu", "--no-config", cwd=tmp_path)  # exists: refused while planning
    assert refused.returncode == 4 and len(refused.stderr.splitlines()) == 1, refused.stderr  # the error line alone


def test_progress_names_the_compile_stage_on_a_pipe(tmp_path: Path) -> None:
    shutil.copyfile(FIXTURES / "split.onnx", tmp_path / "split.onnx")
    proc = run_cli("compile", "split.onnx", "-o", "out", "--ep", "qnn", "--no-config", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[:3] == ["ortcompile: reading model", "ortcompile: preparing split.onnx: pinning shapes, folding constants",
                         "ortcompile: compiling split.onnx with QNNExecutionProvider"], proc.stderr


# ---------------------------------------------------------------- 9: --share-weights --partition; -q keeps warnings


def test_share_weights_with_partition_is_a_usage_error(pair_in_two_dirs: Path) -> None:
    proc = run_cli("compile", "../a/prefill.onnx", "../b/decode.onnx", "-o", "out/", "--share-weights", "--ep", "qnn",
                   "--fix-dim", "batch=1", "--partition", "auto", "--no-config", cwd=pair_in_two_dirs)
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, "--share-weights compiles each model whole", "--partition")
    assert not (pair_in_two_dirs / "out").exists()


def test_quiet_hides_progress_but_never_warnings(pair_in_two_dirs: Path) -> None:
    # --check load: a shared context this simulator cannot open is published with a warning (a run check would be
    # made on each model compiled without sharing instead: compile/twins.py)
    proc = run_cli("compile", "../a/prefill.onnx", "../b/decode.onnx", "-o", "out/", "--share-weights", "--ep", "qnn",
                   "--fix-dim", "batch=1", "--no-config", "-q", "--check", "load", cwd=pair_in_two_dirs)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "ortcompile: warning: prefill_ctx.onnx, decode_ctx.onnx: not checked before publishing: "
        "QNN's HTP simulator cannot load shared EP contexts on this machine"]
    assert "warnings and errors still go to stderr" in " ".join(run_cli("compile", "--help").stdout.split())


# ---------------------------------------------------------------- 6: a signal with --json; what an interrupted batch kept


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_in_a_batch_prints_json_and_names_what_was_published(signum: int, tmp_path: Path) -> None:
    save(mlp(), tmp_path / "small.onnx")
    sparse_weights_model(tmp_path / "big.onnx", tensor_count=6, tensor_mib=100)  # ~2 s to lay out: time to interrupt it
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "ortcompile", "compile", "small.onnx", "big.onnx", "-o", "out", "--ep", "cpu",
                             "--no-config", "--json"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = signal_while_staging(proc, out, "big_ctx*.data*", signum, "the batch")
    assert proc.returncode == 128 + signum, stderr
    name = signal.Signals(signum).name
    message = f"interrupted ({name}); published before it: out/small_ctx.onnx; nothing else was"
    assert json.loads(stdout) == {"error": {"message": message, "exit_code": 128 + signum, "kind": "Interrupted"}}
    assert without_progress(stderr) == [f"ortcompile: {message}"]
    assert (out / "small_ctx.onnx").is_file() and not (out / "big_ctx.onnx").exists()


# ---------------------------------------------------------------- 10: the JSON error's kind; internal errors


def test_json_error_kind_is_the_error_class(tmp_path: Path) -> None:
    missing = run_cli("compile", tmp_path / "missing.onnx", "-o", tmp_path / "out", "--no-config", "--json")
    assert missing.returncode == 3 and json.loads(missing.stdout)["error"]["kind"] == "InvalidModel"
    usage = run_cli("compile", "--bogus-option", "--json")
    assert usage.returncode == 2 and json.loads(usage.stdout)["error"]["kind"] == "UsageError"


def test_an_internal_error_has_its_own_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        raise TypeError("a bug")
    except TypeError as exc:
        code = report_exception(exc, Output(as_json=True))
    captured = capsys.readouterr()
    assert code == 70 and code not in {e.exit_code for e in (errors.CompilationFailed, errors.UsageError, errors.InvalidModel,
                                                            errors.OutputError, errors.VerificationFailed)}
    assert json.loads(captured.out)["error"] == {"message": "internal error: TypeError: a bug (rerun with --debug and report it)",
                                                 "exit_code": 70, "kind": "InternalError"}


# ---------------------------------------------------------------- 7: -v says "load only" only when it is


def test_verbose_says_load_only_only_when_auto_downgraded(tmp_path: Path) -> None:
    save(mlp(), tmp_path / "model.onnx")
    proc = run_cli("compile", "model.onnx", "-o", "out", "--ep", "cpu", "--no-config", "-v", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "load only" not in proc.stderr
    assert "ortcompile: checking model_ctx.onnx: load and run on cpu" in proc.stderr.splitlines()


@pytest.mark.parametrize(("size", "shown"), [(0, "0 B"), (1000, "1000 B"), (768 << 10, "768.0 KiB"), (3 << 19, "1.5 MiB"),
                                             (1 << 30, "1.0 GiB"), (5 << 40, "5120.0 GiB")])
def test_sizes_under_a_mib_are_kib(size: int, shown: str) -> None:
    assert format_size(size) == shown


# ---------------------------------------------------------------- 8: stitch's hint works as written


def test_stitch_hint_for_a_part_to_compile_again_works_as_written(tmp_path: Path) -> None:
    shutil.copyfile(FIXTURES / "split.onnx", tmp_path / "split.onnx")
    (tmp_path / "elsewhere").mkdir()
    assert run_cli("split", "split.onnx", "-o", "parts", "--ep", "qnn", "--partition", "100K", "-q", cwd=tmp_path).returncode == 0
    for name in json.loads((tmp_path / "parts" / "split.parts.json").read_text())["parts"]:  # each, by the hint the stitch gives
        proc = run_cli("stitch", "../parts/split.parts.json", "--parts", "../compiled", "-o", "../st", cwd=tmp_path / "elsewhere")
        assert proc.returncode == 2
        command = shlex.split(assert_one_line_error(proc.stderr, f"part {name} is not compiled").split("; compile it with: ", 1)[1])
        assert run_cli(*command[1:], "-q", cwd=tmp_path / "elsewhere").returncode == 0
    (tmp_path / "compiled" / "split.part00_ctx.manifest.json").unlink()  # damaged: the part is there, to be compiled again
    damaged = run_cli("stitch", "parts/split.parts.json", "--parts", "compiled", "-o", "st", cwd=tmp_path)
    command = shlex.split(assert_one_line_error(damaged.stderr, "compile it again with: ").split("compile it again with: ", 1)[1])
    assert run_cli(*command[1:], "-q", cwd=tmp_path).returncode == 0  # without --force: "exists" (exit 4)
    stitched = run_cli("stitch", "parts/split.parts.json", "--parts", "compiled", "-o", "st", "-q", cwd=tmp_path)
    assert stitched.returncode == 0, stitched.stderr
    assert (tmp_path / "st" / "split_ctx.onnx").is_file()


def test_make_fragment_stitches_into_its_own_directory_never_with_force(tmp_path: Path) -> None:
    """Decided (partition.md): the fragment stitches into <parts>/stitched/ and replaces only an earlier stitch of this model."""
    shutil.copyfile(FIXTURES / "split.onnx", tmp_path / "split.onnx")
    assert run_cli("split", "split.onnx", "-o", "parts", "--ep", "qnn", "--partition", "100K", "-q", cwd=tmp_path).returncode == 0
    fragment = (tmp_path / "parts" / "split.parts.mk").read_text()
    [stitch] = [line for line in fragment.splitlines() if " stitch " in line]
    assert "--replace-stitched" in stitch and "--force" not in stitch
    assert "SPLIT_OUTPUT ?= $(SPLIT_PARTS)/stitched" in fragment.splitlines()


# ---------------------------------------------------------------- 11: --ep cpu on If branches reading main-graph weights


def _if_model(path: Path) -> np.ndarray:
    """y = If(c, x @ W, -(x @ W)): both branches read the main graph's W (16 KiB, stored externally): what ORT's
    EPContext writer drops (onnxruntime#32131)."""
    weight = (np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096).astype(np.float32)
    row = [1, 64]
    then_branch = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["t"])], "then", [],
                                    [helper.make_tensor_value_info("t", TensorProto.FLOAT, row)])
    else_branch = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["e0"]), helper.make_node("Neg", ["e0"], ["e"])], "else", [],
                                    [helper.make_tensor_value_info("e", TensorProto.FLOAT, row)])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch)], "ifm",
                              [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("x", TensorProto.FLOAT, row)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, row)], [numpy_helper.from_array(weight, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    save(model, path, external="ifm.onnx.data")
    return weight


def test_cpu_pass_through_of_if_branches_reading_outer_weights(tmp_path: Path) -> None:
    weight = _if_model(tmp_path / "ifm.onnx")
    assert onnx.load(str(tmp_path / "ifm.onnx"), load_external_data=False).graph.initializer[0].data_location == TensorProto.EXTERNAL
    proc = run_cli("compile", "ifm.onnx", "-o", "out", "--ep", "cpu", "--no-config", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [output] = json.loads(proc.stdout)["outputs"]
    assert (output["check"]["mode"], output["check"]["ok"]) == ("run", True)  # the pre-publish check ran it
    compiled = tmp_path / "out" / "ifm_ctx.onnx"
    graph = onnx.load(str(compiled), load_external_data=False).graph
    assert [t.name for t in graph.initializer] == ["W"] and graph.initializer[0].data_location == TensorProto.EXTERNAL  # re-laid out
    assert [n.op_type for n in graph.node] == ["If"]  # the graph node for node: nothing went through ORT's writer
    session = ort.InferenceSession(str(compiled), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    source = ort.InferenceSession(str(tmp_path / "ifm.onnx"), providers=["CPUExecutionProvider"])
    for c in (True, False):
        feeds = {"c": np.array(c), "x": x}
        [y] = session.run(None, feeds)
        assert np.array_equal(y, source.run(None, feeds)[0])
        np.testing.assert_allclose(y, (x @ weight) * (1 if c else -1), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- 10: the docs' --ep-option example has an effect


def test_readme_ep_option_example_changes_the_compiled_output(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    [line] = [line for line in readme.splitlines() if "--ep-option" in line and line.startswith("ortcompile compile")]
    option = shlex.split(line)[shlex.split(line).index("--ep-option") + 1]
    assert option in (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    shutil.copyfile(FIXTURES / "split.onnx", tmp_path / "split.onnx")
    with_option = run_cli("compile", "split.onnx", "-o", "a", "--ep", "qnn", "--ep-option", option, "--embed", "never", "--no-config", cwd=tmp_path)
    assert with_option.returncode == 0, with_option.stderr
    # not "changes nothing in the compiled output" (split.onnx's fragmented graph is the one warning it has)
    assert [line for line in with_option.stderr.splitlines() if "warning" in line and "graph is fragmented" not in line] == []
    plain = run_cli("compile", "split.onnx", "-o", "b", "--ep", "qnn", "--embed", "never", "--no-config", "-q", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    [blob_a], [blob_b] = (list((tmp_path / d).glob("*.bin")) for d in "ab")
    assert blob_a.read_bytes() != blob_b.read_bytes()


# ---------------------------------------------------------------- 10: inspect lists the opset domains in use


def test_inspect_lists_only_the_opset_domains_in_use(tmp_path: Path) -> None:
    shutil.copyfile(FIXTURES / "split.onnx", tmp_path / "split.onnx")
    assert run_cli("compile", "split.onnx", "-o", "build", "--ep", "qnn", "--no-config", "-q", cwd=tmp_path).returncode == 0
    compiled = tmp_path / "build" / "split_ctx.onnx"
    imported = {o.domain or "ai.onnx" for o in onnx.load(str(compiled), load_external_data=False).opset_import}
    assert len(imported) >= 8  # what ORT's compiler writes
    report = json.loads(run_cli("inspect", compiled, "--json").stdout)
    assert report["opsets"] == {"ai.onnx": 17, "com.microsoft": 1}  # the EPContext nodes' domain and the default one
    assert report["unused_opsets"] == sorted(imported - {"ai.onnx", "com.microsoft"})
    [line] = [line for line in run_cli("inspect", compiled).stdout.splitlines() if line.startswith("opsets")]
    assert line == f"opsets     ai.onnx 17, com.microsoft 1 ({len(imported) - 2} more imported, used by no node)"


# ---------------------------------------------------------------- 10: verify against another reference says so


def test_verify_against_a_reference_that_is_not_the_recorded_source_says_so(tmp_path: Path) -> None:
    save(mlp(), tmp_path / "model.onnx")
    save(mlp(), tmp_path / "copy" / "model.onnx")  # the same graph, another file: the recorded source's bytes
    edited = mlp()
    edited.producer_name = "re-exported"  # same outputs, other bytes
    save(edited, tmp_path / "other.onnx")
    assert run_cli("compile", "model.onnx", "-o", "out", "--ep", "cpu", "--no-config", "-q", cwd=tmp_path).returncode == 0
    same = run_cli("verify", "out/model_ctx.onnx", "--reference", "copy/model.onnx", cwd=tmp_path)
    assert same.returncode == 0 and not any(line.startswith("reference") for line in same.stdout.splitlines()), same.stdout
    other = run_cli("verify", "out/model_ctx.onnx", "--reference", "other.onnx", "--json", cwd=tmp_path)
    assert other.returncode == 0, other.stderr  # compared anyway: the outputs agree
    note = json.loads(other.stdout)["reference_note"]
    assert note.startswith("other.onnx is not the source this model was compiled from (the manifest records model.onnx, ")
    text = run_cli("verify", "out/model_ctx.onnx", "--reference", "other.onnx", cwd=tmp_path)
    assert f"reference  {note}" in text.stdout.splitlines()


# ---------------------------------------------------------------- 10: typos fail before onnx and onnxruntime load

_IMPORTS_AFTER = """
import sys
from ortcompile.cli import main
code = main.main(sys.argv[1:], standalone_mode=False)
print(code, "onnx" in sys.modules, "onnxruntime" in sys.modules)
"""


@pytest.mark.parametrize(("args", "code"), [(("missing.onnx",), 3), (("model.onnx", "--ep", "qnnn"), 2),
                                            (("model.onnx", "--ep", "qnn", "--target", "sm9999"), 2),
                                            (("model.onnx", "--ep-library", "nope.so", "--ep", "X"), 2)])
def test_path_ep_and_target_errors_come_before_the_heavy_imports(args: tuple[str, ...], code: int, tmp_path: Path) -> None:
    save(mlp(), tmp_path / "model.onnx")
    proc = subprocess.run([sys.executable, "-c", _IMPORTS_AFTER, "compile", *args, "-o", "out", "--no-config"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == [str(code), "False", "False"], proc.stderr
    assert_one_line_error(proc.stderr)


# ---------------------------------------------------------------- 10: shell completion of --ep and --target


@pytest.mark.parametrize(("words", "expected"), [("ortcompile compile m.onnx --ep q", ["qnn"]),
                                                 ("ortcompile compile m.onnx --ep qnn --target sm86", ["sm8650"]),
                                                 ("ortcompile eps --ep cp", ["cpu"])])
def test_shell_completion_of_ep_and_target(words: str, expected: list[str]) -> None:
    env = {**os.environ, "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1), "_ORTCOMPILE_COMPLETE": "bash_complete"}
    proc = subprocess.run([sys.executable, "-m", "ortcompile"], capture_output=True, text=True, timeout=60, env=env)
    assert [line.split(",", 1)[1] for line in proc.stdout.splitlines()] == expected, proc.stderr


# ---------------------------------------------------------------- 10: compile --help ends with examples


def test_compile_help_ends_with_examples_of_real_options() -> None:
    help_text = run_cli("compile", "--help").stdout
    examples = help_text[help_text.index("Examples:"):].splitlines()[1:]
    commands = [shlex.split(line.split("#")[0]) for line in examples if line.strip().startswith("ortcompile compile")]
    assert len(commands) >= 5 and any("--share-weights" in c for c in commands)
    known = {opt for param in cli_group.commands["compile"].params for opt in param.opts}
    assert {word for c in commands for word in c if word.startswith("--")} <= known
