"""Issue 18 (items 11, 15, 18): inputs a user or an attacker names never hang, never run out of memory with a
traceback, and never mean something other than they say. Each is one `ortcompile: error:` line with its exit code.

- Files: a FIFO (or a directory, a device) where an input file is expected is refused by name without opening it
  for a blocking read: `--inputs DIR` with a FIFO `x.npy` used to block forever. Models and config files too.
- Dims: `--fix-dim`/`--fix-shape`/`--dim` above 2**48 (no tensor could have them) are refused before any work,
  with the bound and its reason, from the command line, the config file and the Python API; dims within the
  bound whose inputs do not fit in memory are refused in one line instead of numpy's MemoryError/ValueError.
- `--max-context-size 0` is refused like `--partition 0` (it silently meant 1 GiB); `--ep-library` with `--ep cpu`
  is refused (the library was silently ignored).

Everything runs in-process through click (run_cli) on the CPU EP, whose compile is quick; each call that could
block runs under an alarm, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import FIXTURES, assert_one_line_error, run_cli

from ortcompile import CompileOptions, compile_model, compile_to_buffers
from ortcompile.errors import UsageError
from ortcompile.options import PartitionOptions
from ortcompile.plan.shapes import MAX_DIM
from ortcompile.readback.verify import verify_model

MLP = FIXTURES / "mlp.onnx"  # x: float[1, 256]
DYNAMIC = FIXTURES / "dynamic.onnx"  # x: float[batch, 256]
BOUND = f"at most 2**48 = {MAX_DIM} (a tensor with more elements along one axis would not fit in a 64-bit process's 128 TiB address space"


class Hang(Exception):
    pass


@contextlib.contextmanager
def no_hang(seconds: int = 30) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the body blocks: SIGALRM interrupts a blocking open() of a FIFO."""
    assert threading.current_thread() is threading.main_thread()

    def handler(signum: int, frame: object) -> None:
        raise Hang(f"still blocked after {seconds}s")

    previous = signal.signal(signal.SIGALRM, handler)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def error(code: int, *args: object) -> str:
    """Run the CLI; it must exit `code` with one error line (no traceback, no internal error); returns the line."""
    with no_hang():
        result = run_cli(*args)
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    line = assert_one_line_error(result.stderr)
    assert "internal error" not in line
    return line.removeprefix("ortcompile: error: ")


def verify_args(*extra: object) -> list[object]:
    return ["verify", MLP, "--reference", MLP, "--ep", "cpu", "--no-time-source", *extra]


# ---------------------------------------------------------------- files that are not regular files (item 11)


@pytest.fixture
def traps(tmp_path: Path) -> Path:
    """A FIFO for each kind of input file, a directory of inputs holding a FIFO x.npy, one holding a directory y.npy."""
    for name in ("x.npy", "inputs.npz", "model.onnx", "ortcompile.toml"):
        os.mkfifo(tmp_path / name)
    (tmp_path / "fifo_dir").mkdir()
    os.mkfifo(tmp_path / "fifo_dir" / "x.npy")
    (tmp_path / "dir_dir" / "x.npy").mkdir(parents=True)
    return tmp_path


@pytest.mark.parametrize("command", ["verify", "compile"])
def test_an_inputs_directory_with_a_fifo_is_refused_not_read(traps: Path, tmp_path: Path, command: str) -> None:
    """The issue's case: `--inputs DIR` holding a FIFO named x.npy blocked forever (no writer ever comes)."""
    args = verify_args() if command == "verify" else ["compile", MLP, "-o", tmp_path / "out", "--ep", "cpu", "--check", "run"]
    line = error(2, *args, "--inputs", traps / "fifo_dir")
    assert line == f"{traps / 'fifo_dir' / 'x.npy'}: a FIFO, not a regular file: inputs are read from regular .npy and .npz files only"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("option", "target", "kind"), [
    ("--input", "x.npy", "a FIFO"),
    ("--inputs", "inputs.npz", "a FIFO"),
    ("--inputs", "dir_dir", "a directory"),  # its x.npy is a directory
    ("--input", "/dev/zero", "a character device"),  # never ends
])
def test_every_input_file_must_be_a_regular_file(traps: Path, option: str, target: str, kind: str) -> None:
    path = Path(target) if target.startswith("/") else traps / target
    shown = path / "x.npy" if target == "dir_dir" else path
    value = f"x={path}" if option == "--input" else str(path)
    assert error(2, *verify_args(option, value)) == f"{shown}: {kind}, not a regular file: inputs are read from regular .npy and .npz files only"


def test_models_and_config_files_that_are_fifos_are_refused(traps: Path, tmp_path: Path) -> None:
    fifo = traps / "model.onnx"
    assert error(3, "compile", fifo, "-o", tmp_path / "out", "--ep", "cpu") == f"{fifo}: not a regular file"
    assert error(3, "inspect", fifo) == f"{fifo}: not a regular file"
    assert error(3, "verify", MLP, "--reference", fifo, "--ep", "cpu") == f"{fifo}: not a regular file"
    assert error(3, "verify", fifo, "--reference", MLP, "--ep", "cpu") == f"{fifo}: not a regular file"  # was "no such file"
    error(2, "compile", MLP, "-o", tmp_path / "out", "--ep", "cpu", "--config", traps / "ortcompile.toml")  # config.py's wording


def test_a_regular_input_file_still_reads(traps: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "zeros.npy", np.zeros((1, 256)))
    with no_hang():
        result = run_cli(*verify_args("--input", f"x={tmp_path / 'zeros.npy'}", "--json"))
    assert result.returncode == 0, result.stderr
    assert '"x: given (zeros.npy)"' in result.stdout


# ---------------------------------------------------------------- dims no tensor can have (item 15)


@pytest.mark.parametrize("value", [MAX_DIM + 1, 2**63 - 1, 2**63, 10**30])
def test_dims_beyond_any_tensor_are_refused_up_front(value: int, tmp_path: Path) -> None:
    """They were accepted (up to INT64_MAX), then failed as an internal error: numpy's "array is too big" ValueError."""
    out = tmp_path / "out"
    assert error(2, "compile", DYNAMIC, "-o", out, "--ep", "cpu", "--fix-dim", f"batch={value}") == \
        f"bad --fix-dim 'batch={value}': {value} is too large: {BOUND}, even at 4 bits each)"
    assert error(2, "compile", DYNAMIC, "-o", out, "--ep", "qnn", "--fix-shape", f"x={value},256").startswith(
        f"bad --fix-shape 'x={value},256': {value} is too large: {BOUND}")
    assert error(2, "verify", DYNAMIC, "--reference", DYNAMIC, "--ep", "cpu", "--dim", f"batch={value}").startswith(
        f"bad --dim 'batch={value}': {value} is too large: {BOUND}")
    assert not out.exists()


def test_dims_beyond_any_tensor_are_refused_from_the_config_and_the_python_api(tmp_path: Path) -> None:
    huge = MAX_DIM + 1
    config = tmp_path / "ortcompile.toml"
    config.write_text(f"[fix-dim]\nbatch = {huge}\n")
    assert error(2, "compile", DYNAMIC, "-o", tmp_path / "out", "--ep", "cpu", "--config", config).startswith(
        f"--fix-dim batch={huge}: {huge} is too large: {BOUND}")
    for call in (lambda: compile_model(DYNAMIC, tmp_path / "api", CompileOptions(ep="cpu", fix_dims={"batch": huge})),
                 lambda: compile_model(DYNAMIC, tmp_path / "api", CompileOptions(ep="cpu", fix_shapes={"x": (huge, 256)})),
                 lambda: compile_to_buffers(DYNAMIC, ep="cpu", fix_dims={"batch": huge})):
        with pytest.raises(UsageError, match=r"is too large: at most 2\*\*48"):
            call()
    with pytest.raises(UsageError, match="'1' is not a whole number"):
        compile_model(DYNAMIC, tmp_path / "api", CompileOptions(ep="cpu", fix_dims={"batch": "1"}))  # type: ignore[dict-item]
    assert not (tmp_path / "out").exists() and not (tmp_path / "api").exists()


@pytest.mark.parametrize("value", [MAX_DIM, 10**11, 10**9])
def test_inputs_that_would_not_fit_in_memory_are_one_line(value: int, tmp_path: Path) -> None:
    """Within the bound, the generated inputs were numpy's MemoryError ("Unable to allocate 186. TiB") or
    ValueError as an internal error; now one line naming the input, its size and the dims, before any allocation."""
    gib = value * 256 * 4 / 2**30
    shape = f"input 'x' as tensor(float)[{value},256] would take "
    line = error(2, "verify", DYNAMIC, "--reference", DYNAMIC, "--ep", "cpu", "--dim", f"batch={value}")
    assert line.startswith(shape) and f"of memory available; give smaller dims (chosen: batch={value}; " in line, line
    assert gib > 900  # the machine has 24 GiB: each of these is far beyond it
    line = error(2, "verify", DYNAMIC, "--reference", DYNAMIC, "--ep", "cpu", "--dim", f"batch={value}", "--input", "x=0")  # a scalar fills it
    assert line.startswith(shape), line
    out = tmp_path / "out"  # the pre-publish check generates them: nothing is published
    assert error(2, "compile", DYNAMIC, "-o", out, "--ep", "cpu", "--fix-dim", f"batch={value}", "--check", "run").startswith(shape)
    assert not (out / "dynamic_ctx.onnx").exists()


def test_verify_model_dims_from_python_are_checked_too() -> None:
    with pytest.raises(UsageError, match=r"would take 1\.0 PiB, more than the .* of memory available"):
        verify_model(DYNAMIC, DYNAMIC, ep="cpu", dims={"batch": 2**40}, time_source=False)


# ---------------------------------------------------------------- options that meant something else (item 18)


@pytest.mark.parametrize("command", ["compile", "split"])
def test_max_context_size_zero_is_refused_like_partition_zero(command: str, tmp_path: Path) -> None:
    """--max-context-size 0 compiled with the 1 GiB default, while --partition 0 was exit 2: both refuse now."""
    out = tmp_path / "out"
    assert error(2, command, MLP, "-o", out, "--ep", "cpu", "--max-context-size", "0") == \
        f"{command}: invalid value for '--max-context-size': must be a positive size (examples: 512MiB, 1G) (see 'ortcompile {command} --help')"
    assert error(2, command, MLP, "-o", out, "--ep", "cpu", "--partition", "0").startswith(f"{command}: invalid value for '--partition'")
    config = tmp_path / "ortcompile.toml"
    config.write_text("max-context-size = 0\n")
    assert error(2, command, MLP, "-o", out, "--ep", "cpu", "--config", config) == f"{config}: max-context-size: expected a positive size, not 0"
    assert not out.exists()
    for make in (lambda: CompileOptions(max_context_size=0), lambda: PartitionOptions(budget=0), lambda: PartitionOptions(jobs=0)):
        with pytest.raises(UsageError, match="must be a positive whole number"):
            make()


@pytest.mark.parametrize("ep", ["cpu", "CPUExecutionProvider"])
def test_an_ep_library_for_the_cpu_ep_is_refused_not_ignored(ep: str, tmp_path: Path) -> None:
    library = tmp_path / "libplugin.so"
    library.write_bytes(b"\x7fELF not really")
    out = tmp_path / "out"
    assert error(2, "compile", MLP, "-o", out, "--ep", ep, "--ep-library", library) == (
        f"--ep-library {library}: the CPU EP is built into ONNX Runtime, so no library is loaded for --ep {ep}; "
        "give --ep the EP name the library registers, or drop --ep-library")
    assert not out.exists()
    with pytest.raises(UsageError, match="the CPU EP is built into ONNX Runtime"):
        CompileOptions(ep="cpu", ep_library=str(library))
