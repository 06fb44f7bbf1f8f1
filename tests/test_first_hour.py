"""Issue 15: what a new user trips over in the first hour, each point through the CLI.

Naming the output with `-o FILE.onnx`, errors that name what the user asked for, `inspect DIR`, help that is
not truncated, a success line that says it verified, `-v` without colour codes or boilerplate, and a warning for
a `--shard-size` that tensors do not fit in.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

try:
    from helpers import published, run_cli
except ImportError:  # pragma: no cover
    from tests.helpers import published, run_cli

from ortcompile.native import clean_native_line

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def split(tmp_path: Path) -> Path:
    shutil.copyfile(FIXTURES / "split.onnx", tmp_path / "split.onnx")
    return tmp_path / "split.onnx"


def test_output_file_names_the_model_and_its_files_go_beside_it(split: Path, tmp_path: Path) -> None:
    target = tmp_path / "build" / "split_qnn.onnx"
    proc = run_cli("compile", split, "-o", target, "--ep", "qnn", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["outputs"][0]["model"] == str(target)
    data = published(target.parent, "split_qnn.onnx.data")  # split_qnn.<digest>.data: named after the model, by content
    assert sorted(p.name for p in target.parent.iterdir()) == sorted([data, "split_qnn.manifest.json", "split_qnn.onnx"])
    assert json.loads((target.parent / "split_qnn.manifest.json").read_text())["model"] == "split_qnn.onnx"
    again = run_cli("compile", split, "-o", target, "--ep", "qnn", "--if-changed")
    assert again.returncode == 0 and again.stdout.strip() == f"{target}: up to date"
    verify = run_cli("verify", target, "--reference", split)
    assert verify.returncode == 0, verify.stderr


def test_output_directory_keeps_the_default_name(split: Path, tmp_path: Path) -> None:
    proc = run_cli("compile", split, "-o", tmp_path / "out.onnx.d", "--ep", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out.onnx.d" / "split_ctx.onnx").is_file()
    (tmp_path / "existing.onnx").mkdir()  # an existing directory stays a directory, whatever its name
    proc = run_cli("compile", split, "-o", tmp_path / "existing.onnx", "--ep", "cpu")
    assert proc.returncode == 0 and (tmp_path / "existing.onnx" / "split_ctx.onnx").is_file()


def test_output_file_for_a_batch_is_a_usage_error(split: Path, tmp_path: Path) -> None:
    shutil.copyfile(FIXTURES / "mlp.onnx", tmp_path / "mlp.onnx")
    proc = run_cli("compile", split, tmp_path / "mlp.onnx", "-o", tmp_path / "b" / "x.onnx", "--ep", "cpu")
    assert proc.returncode == 2 and "names one compiled model; give a directory (-o DIR/) for a batch" in proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "b").exists()


def test_already_exists_names_the_model_and_how_to_replace_it(split: Path, tmp_path: Path) -> None:
    assert run_cli("compile", split, "-o", tmp_path / "out", "--ep", "cpu").returncode == 0
    proc = run_cli("compile", split, "-o", tmp_path / "out", "--ep", "cpu")
    assert proc.returncode == 4
    assert proc.stderr.strip() == (f"ortcompile: error: {tmp_path / 'out' / 'split_ctx.onnx'} already exists; replace it with --force "
                                   "(CompileOptions(force=True) from Python)")


def test_inspect_of_a_directory_names_a_model_inside(split: Path, tmp_path: Path) -> None:
    assert run_cli("compile", split, "-o", tmp_path / "out", "--ep", "cpu").returncode == 0
    proc = run_cli("inspect", tmp_path / "out")
    assert proc.returncode == 3
    assert proc.stderr.strip() == f"ortcompile: error: {tmp_path / 'out'} is a directory, not a model: give one of its models, e.g. " \
                                  f"{tmp_path / 'out' / 'split_ctx.onnx'}"


def test_group_help_shows_every_command_description_whole() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    commands = proc.stdout.split("Commands:", 1)[1]
    assert "..." not in commands, commands
    for name in ("compile", "split", "stitch", "inspect", "verify", "check", "eps", "bench"):
        assert f"\n  {name} " in commands


def test_compile_verify_says_it_verified(split: Path, tmp_path: Path) -> None:
    proc = run_cli("compile", split, "-o", tmp_path / "out", "--ep", "qnn", "--verify")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("(QNNExecutionProvider); verified against the source")
    plain = run_cli("compile", split, "-o", tmp_path / "plain", "--ep", "qnn")
    assert "verified" not in plain.stdout


def test_compile_verify_runs_one_comparison_and_times_it(split: Path, tmp_path: Path) -> None:
    """Issue 22: the check compares by --verify's criterion, so --verify adds no second session pair; the check's
    time is in --json's timings and on -v."""
    proc = run_cli("compile", split, "-o", tmp_path / "out", "--ep", "qnn", "--verify", "--check", "run", "-v", "--json")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)["outputs"][0]
    assert document["timings"]["check"] > 0 and document["timings"]["verify"] == 0.0
    assert document["check"]["mode"] == "run" and document["check"]["ok"]
    checked = r"check: loads, runs and agrees with the source on the CPU EP (on \d+ input sets )?\(.*; \d+\.\d\ds, CPU \d+\.\d\ds\)"
    assert re.search(checked, proc.stderr), proc.stderr
    assert re.search(r"verified: outputs match the source on the CPU EP \(max abs diff [0-9.e+-]+; parity\), in the pre-publish check", proc.stderr)
    assert "verifying against the source" not in proc.stderr


def test_verbose_output_has_no_colour_codes_nor_boilerplate(split: Path, tmp_path: Path) -> None:
    proc = run_cli("compile", split, "-o", tmp_path / "out", "--ep", "qnn", "-v")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stderr
    for boilerplate in ("File mapped weights", "encryption config unavailable", "LIBNATIVE", "Rerunning with verbose output"):
        assert boilerplate not in proc.stderr
    assert "ortcompile: compiling split.onnx with QNNExecutionProvider" in proc.stderr


@pytest.mark.parametrize("line, cleaned", [
    ("\x1b[0;93m2026-11-30 20:54:11.414588291 [W:onnxruntime:, ep_api_types.cc:389 GetProducerInfo] Something odd.\x1b[m\n",
     "onnxruntime warning (ep_api_types.cc:389): Something odd."),
    ("2026-11-30 20:54:11.1 [E:onnxruntime:Default, qnn_model.cc:12 Finalize] Failed to finalize QNN graph.\n",
     "onnxruntime error (qnn_model.cc:12): Failed to finalize QNN graph."),
    ("\x1b[0;93m2026-11-30 20:54:11.117699495 [W:onnxruntime:, qnn_execution_provider.cc:933 QnnEp] File mapped weights feature is only "
     "available on Windows arm64 devices\x1b[m", None),
    (" # LIBNATIVE: No alternate configuration present in libnative_tls.conf\n", None),
    ("QNN SDK banner line\n", "QNN SDK banner line"),
    ("\n", None),
])
def test_native_lines_are_cleaned(line: str, cleaned: str | None) -> None:
    assert clean_native_line(line) == cleaned


def test_shard_size_smaller_than_a_tensor_warns(split: Path, tmp_path: Path) -> None:
    proc = run_cli("compile", split, "-o", tmp_path / "out", "--ep", "cpu", "--shard-size", "1K")
    assert proc.returncode == 0, proc.stderr
    assert "ortcompile: warning: --shard-size 1024: 3 tensors are larger (largest 'W1', 262144 bytes)" in proc.stderr
    quiet = run_cli("compile", split, "-o", tmp_path / "big", "--ep", "cpu", "--shard-size", "1M")
    assert "shard-size" not in quiet.stderr
