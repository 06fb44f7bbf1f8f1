"""Inputs the user gives: `NAME=FILE.npy`, `NAME=VALUE`, an `.npz` file or a directory of `NAME.npy` files.

Each is checked against the model's input before anything runs, with a one-line UsageError (exit 2):
unknown name, wrong rank, a fixed dim that does not match, a dtype that cannot be converted without
changing values. Conversions that keep every value are done silently, because files rarely carry the exact
dtype (numpy saves float64 and int64 by default):

- float inputs accept any float or integer array (float64 -> float32 rounds, as the model would anyway)
  whose finite values fit the type (100000 would become inf in float16);
- integer inputs accept integer or bool arrays whose values fit the input's type (int64 -> int32 is fine
  for token ids; a value out of range is an error), never floats;
- bool inputs accept bools, or integers that are all 0 or 1;
- string inputs accept numpy string arrays.

A directory of `.npz` files is a set of **samples**, one per file (each with the same input names): the check and
`verify` then judge the model on every sample, in file-name order, instead of on generated sets.

`NAME=VALUE` is a scalar (int, float, `true`/`false`) that fills the whole input, whatever its shape: it sets
no dimension. An array sets the symbolic dims of its input (see feeds.make_feeds).

Only regular files are read. A FIFO named `x.npy` in an `--inputs` directory would block the read forever (no
writer), and a device never ends: each file is opened without blocking and refused, by name, unless fstat says
it is a regular file (checked on the open descriptor, so a rename in between cannot slip a FIFO in).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np

from ortcompile.errors import UsageError, first_line

if TYPE_CHECKING:
    from ortcompile.readback.inputspec import InputSpec


@dataclass(frozen=True)
class Given:
    """A value for one input and where it came from (for messages)."""

    value: np.ndarray | int | float | bool
    origin: str = "given"
    more: tuple[tuple[np.ndarray, str], ...] = ()  # further samples' values and origins (an --inputs DIR of .npz files)

    def sample(self, index: int) -> Given:
        """This input in sample `index` (one value only: the same in every sample)."""
        if not self.more or index == 0:
            return Given(self.value, self.origin)
        value, origin = self.more[index - 1]
        return Given(value, origin)


def sample_count(given: dict[str, Given]) -> int:
    """How many samples the given inputs hold (1: one set of values, or none)."""
    return max((1 + len(g.more) for g in given.values()), default=1)


def sample_names(given: dict[str, Given]) -> list[str]:
    """Each sample's file name, for messages ("sample b.npz")."""
    most = max(given.values(), key=lambda g: len(g.more), default=None)
    if most is None or not most.more:
        return [next(iter(given.values())).origin.split(":")[0]] if given else []
    return [o.split(":")[0] for o in (most.origin, *(origin for _, origin in most.more))]


def parse_input(text: str, names: Iterable[str] = ()) -> tuple[str, Given]:
    """`NAME=FILE.npy` or `NAME=VALUE`. Known input names are matched first: a name may itself contain '='."""
    known = sorted((n for n in names if text.startswith(n + "=")), key=len, reverse=True)
    if known:
        name, rest = known[0], text[len(known[0]) + 1 :]
    elif "=" in text:
        name, rest = text.split("=", 1)
    else:
        raise UsageError(f"{text!r}: expected NAME=FILE.npy or NAME=VALUE")
    if not name or not rest:
        raise UsageError(f"{text!r}: expected NAME=FILE.npy or NAME=VALUE")
    scalar = _scalar(rest)
    if scalar is not None:
        return name, Given(scalar, f"{name}={rest}")
    path = Path(rest)
    if not os.path.lexists(path):
        raise UsageError(f"{text!r}: {rest!r} is neither a number nor a file")
    return name, Given(_load_npy(path), path.name)


def load_inputs(path: str | Path) -> dict[str, Given]:
    """Every array of an `.npz` file, or every `NAME.npy` in a directory, by input name."""
    path = Path(path)
    if path.is_dir():
        files, samples = sorted(path.glob("*.npy")), sorted(path.glob("*.npz"))
        if files and samples:
            raise UsageError(f"{path}: holds both .npy files (one input each) and .npz files (one sample each); keep one kind")
        if samples:
            return _samples(path, samples)
        if not files:
            raise UsageError(f"{path}: no .npy or .npz files in this directory")
        return {f.stem: Given(_load_npy(f), f.name) for f in files}
    if not os.path.lexists(path):
        raise UsageError(f"{path}: no such file or directory")
    with open_regular(path) as stream:
        try:
            loaded = np.load(stream, allow_pickle=False)  # no pickles: a data file must not run code
            if not isinstance(loaded, np.lib.npyio.NpzFile):
                raise UsageError(f"{path}: a single array has no input name; give it as NAME={path}, or several as an .npz file")
            with loaded as archive:
                return {name: Given(archive[name], f"{path.name}:{name}") for name in archive.files}
        except UsageError:
            raise
        except Exception as exc:  # MemoryError too: an entry whose header claims more than fits
            raise UsageError(f"{path}: cannot read as .npz: {first_line(exc)}") from exc


def _samples(directory: Path, files: list[Path]) -> dict[str, Given]:
    """One sample per .npz file; every sample must name the same inputs (a missing one could not be compared)."""
    loaded = [load_inputs(f) for f in files]
    names = set(loaded[0])
    for file, sample in zip(files[1:], loaded[1:]):
        if set(sample) != names:
            differ = sorted(names ^ set(sample))[0]
            raise UsageError(f"{directory}: {file.name} and {files[0].name} do not give the same inputs ({differ!r} is in one only)")
    return {name: Given(loaded[0][name].value, loaded[0][name].origin,
                        tuple((sample[name].value, sample[name].origin) for sample in loaded[1:])) for name in sorted(names)}


_FILE_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: Path) -> IO[bytes]:
    """`path` opened for reading if it is a regular file (symlinks followed); else a one-line UsageError naming it.

    O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. The type is checked on the open
    descriptor, not on the name, so the file cannot be swapped for a FIFO between the check and the read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UsageError(f"{path}: cannot open: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((what for test, what in _FILE_KINDS if test(mode)), "a special file")
        raise UsageError(f"{path}: {kind}, not a regular file: inputs are read from regular .npy and .npz files only")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _scalar(text: str) -> int | float | bool | None:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return None


def _load_npy(path: Path) -> np.ndarray:
    with open_regular(path) as stream:
        try:
            array = np.load(stream, allow_pickle=False)
        except Exception as exc:  # MemoryError too: a header that claims more than fits
            raise UsageError(f"{path}: cannot read as .npy: {first_line(exc)}") from exc
    if not isinstance(array, np.ndarray):
        raise UsageError(f"{path}: holds several arrays; give it as an .npz file of inputs")
    return array


def conform(spec: InputSpec, given: Given, shape: tuple[int, ...]) -> np.ndarray:
    """The given value as the array to feed `spec` with `shape`, or a UsageError saying why it cannot be."""
    where = f"input {spec.name!r} ({given.origin})"
    dtype = spec.dtype
    if dtype is None:
        raise UsageError(f"{where}: the model's type {spec.describe()} cannot be fed from Python")
    if not isinstance(given.value, np.ndarray):
        return np.full(shape, _convert(np.asarray(given.value), dtype, where, spec).item(), dtype=dtype)
    array = given.value
    if array.ndim != len(spec.dims):
        raise UsageError(f"{where} has shape {list(array.shape)} (rank {array.ndim}), the model needs {spec.describe()} (rank {len(spec.dims)})")
    for axis, (size, dim) in enumerate(zip(array.shape, spec.dims)):
        if isinstance(dim, int) and size != dim:
            raise UsageError(f"{where} has shape {list(array.shape)}, the model needs {spec.describe()} (dim {axis} is {dim})")
    if array.shape != shape:
        raise UsageError(f"{where} has shape {list(array.shape)}, but the dims chosen give {list(shape)}")
    return _convert(array, dtype, where, spec)


def _convert(array: np.ndarray, dtype: np.dtype, where: str, spec: InputSpec) -> np.ndarray:
    """Value-preserving conversions only (module docstring)."""
    source = array.dtype
    if source == dtype:
        return array
    problem = _conversion_problem(array, dtype)
    if problem:
        raise UsageError(f"{where} holds {source}, the model needs {spec.describe()}: {problem}")
    return array.astype(dtype)


def _conversion_problem(array: np.ndarray, dtype: np.dtype) -> str:
    kind = array.dtype.kind
    if dtype.kind == "O":
        return "" if kind in "US" else "a string input needs strings"
    if kind not in "biuf":
        return "not a numeric array"
    if dtype.kind == "f":
        if kind not in "iuf":
            return "a float input needs numbers"
        finite = array[np.isfinite(array)] if kind == "f" else array
        largest = float(np.max(np.abs(finite.astype(np.float64)), initial=0.0))
        if largest > float(np.finfo(dtype).max):  # rounding is fine, becoming inf is not
            return f"a value of magnitude {largest:g} overflows {dtype} (max {float(np.finfo(dtype).max):g})"
        return ""
    if dtype.kind == "b":
        return "" if kind == "b" or (kind in "iu" and np.isin(array, (0, 1)).all()) else "a bool input needs bools or 0/1"
    if kind == "f":
        return "an integer input needs integers"
    info = np.iinfo(dtype)
    if array.size and (array.min() < info.min or array.max() > info.max):
        return f"values {array.min()}..{array.max()} do not fit {dtype}"
    return ""
