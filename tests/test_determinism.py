"""Determinism: the same input and options give byte-identical outputs, with no timestamps or paths inside.

Real compiles in fresh processes (QNN's HTP simulator and the CPU EP) on copies of the fixtures. Two runs
are at least a second apart, in different output directories, from different working directories, with
relative and absolute -o: a timestamp (at any resolution down to the second) or a path in any output
would make the bytes differ; and every output file is also searched for the test's directory names.
A test whose reference is a compile the module already ran (its first runs, one batch) compares with that
output rather than compiling the same thing again: determinism says the bytes are those of any such run.

What is NOT deterministic is documented in docs/output-layout.md ("Determinism") and pinned here: through
the Python API, the QNN blob's tensor ids depend on what the same process compiled before (the CLI compiles
each model of a batch in a fresh process, so it is not affected: /tmp/ortcompile-bugs/pipeline-3.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO, run_process, without_digest

DOC = REPO / "docs" / "output-layout.md"


def compile_in(cwd: Path, *args: object) -> None:
    """A fresh process per run, not run_cli: each process hashes strings with its own seed, so an output that
    depended on set or dict-of-set order would differ between two runs here (in one process it would not)."""
    proc = run_process("compile", *args, "-q", cwd=cwd, env={**os.environ, "XDG_CACHE_HOME": str(cwd / ".xdg-cache")})
    assert proc.returncode == 0, proc.stderr


def outputs(out: Path) -> dict[str, bytes]:
    """Every file in the output directory; it must hold exactly what the manifests list, plus the manifests."""
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    manifests = {n for n in files if n.endswith(".manifest.json")}
    listed = {f["name"] for n in manifests for f in json.loads(files[n])["files"]}
    assert manifests and set(files) == listed | manifests, set(files)
    return files


def assert_no_paths_inside(files: dict[str, bytes], *paths: Path) -> None:
    needles = {str(p).encode() for p in paths} | {p.name.encode() for p in paths if len(p.name) >= 8}
    for name, content in files.items():
        for needle in needles:
            assert needle not in content, f"{name} contains {needle!r}"


def differing(a: dict[str, bytes], b: dict[str, bytes]) -> list[str]:
    assert set(a) == set(b), (set(a), set(b))
    return sorted(n for n in a if a[n] != b[n])


def copy_sources(directory: Path) -> Path:
    directory.mkdir()
    for name in ("mlp.onnx", "split.onnx"):
        shutil.copyfile(FIXTURES / name, directory / name)
    return directory


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return copy_sources(tmp_path / "source-models")


CASES = [(stem, ep, embed) for stem in ("split", "mlp") for ep in ("cpu", "qnn") for embed in ("never", "auto")]


@pytest.fixture(scope="module")
def first_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float]:
    """The first run of every case below, all up front (relative -o from their root), so that each case's second run
    is a second after its first without a second of sleep per case. Returns (root, sources, when the last one ended)."""
    root = tmp_path_factory.mktemp("first-runs")
    src = copy_sources(root / "source-models")
    for stem, ep, embed in CASES:
        compile_in(root, src / f"{stem}.onnx", "-o", f"first-output-{stem}-{ep}-{embed}", "--ep", ep, "--embed", embed)
    return root, src, time.monotonic()


def first_output(first_runs: tuple[Path, Path, float], stem: str, ep: str, embed: str = "auto") -> dict[str, bytes]:
    """The files of the module's first run of (stem, ep, embed): a compile of the absolute input path into an empty
    directory, the reference the tests below compare with instead of compiling the same thing again (the default
    --embed is auto)."""
    return outputs(first_runs[0] / f"first-output-{stem}-{ep}-{embed}")


@pytest.fixture(scope="module")
def batch(first_runs: tuple[Path, Path, float]) -> dict[str, bytes]:
    """mlp and split compiled as one QNN batch (--embed never), absolute input paths: shared by the two batch tests."""
    root, src, _ = first_runs
    compile_in(root, src / "mlp.onnx", src / "split.onnx", "-o", root / "batch", "--ep", "qnn", "--embed", "never")
    return outputs(root / "batch")


@pytest.mark.parametrize("stem, ep, embed", CASES, ids=["-".join(case) for case in CASES])
def test_two_compiles_are_byte_identical(stem: str, ep: str, embed: str, first_runs: tuple[Path, Path, float], tmp_path: Path) -> None:
    """Same input path, different output directories, cwds and -o spellings, a second apart: same bytes,
    for every file: .onnx, .data, manifest and, for QNN with --embed never, the _qnn.bin blob."""
    root, src, first_ended = first_runs
    source = src / f"{stem}.onnx"
    first_dir = root / f"first-output-{stem}-{ep}-{embed}"  # compiled with a relative -o from root
    elsewhere = tmp_path / "elsewhere" / "deeper"
    elsewhere.mkdir(parents=True)
    options = ("--ep", ep, "--embed", embed)
    time.sleep(max(0.0, first_ended + 1.1 - time.monotonic()))
    second_dir = tmp_path / "a-much-longer-second-output-directory"
    compile_in(elsewhere, source, "-o", second_dir, *options)  # absolute -o from another cwd
    first, second = outputs(first_dir), outputs(second_dir)
    assert differing(first, second) == []
    kinds = {without_digest(name).rsplit("_ctx", 1)[1] for name in first}  # the names carry the content's digest
    if ep == "qnn" and embed == "never":
        assert "_qnn.bin" in kinds  # the EP blob is covered by the comparison
    if stem == "split":
        assert ".data" in kinds  # W_mod (1 KiB) stays CPU-side, in external data
    for files in (first, second):
        assert_no_paths_inside(files, root, tmp_path, src, elsewhere, second_dir, first_dir)


@pytest.mark.parametrize("stem", ["split", "mlp"])
def test_cpu_output_does_not_depend_on_the_input_path(stem: str, first_runs: tuple[Path, Path, float], tmp_path: Path, src: Path) -> None:
    """--ep cpu: relative vs absolute input, and even a copy of the input in another directory: same bytes."""
    compile_in(src, f"{stem}.onnx", "-o", tmp_path / "rel", "--ep", "cpu")
    other = tmp_path / "another copy"
    other.mkdir()
    shutil.copyfile(src / f"{stem}.onnx", other / f"{stem}.onnx")
    compile_in(tmp_path, other / f"{stem}.onnx", "-o", tmp_path / "copy", "--ep", "cpu")
    rel, absolute, copy = outputs(tmp_path / "rel"), first_output(first_runs, stem, "cpu"), outputs(tmp_path / "copy")
    assert differing(rel, absolute) == [] and differing(rel, copy) == []


@pytest.mark.parametrize("ep", ["qnn", "cpu"])
def test_output_does_not_depend_on_how_or_where_the_input_is_named(ep: str, first_runs: tuple[Path, Path, float], tmp_path: Path,
                                                                   src: Path) -> None:
    """Relative vs absolute input path, and a copy of the input in another directory: same bytes.
    (ORT hashes the model path into QNN partition names; ortcompile hands it a bare file name:
    /tmp/ortcompile-bugs/pipeline-1.md.)"""
    options = ("--ep", ep, "--embed", "never")
    compile_in(src, "split.onnx", "-o", tmp_path / "rel", *options)
    other = tmp_path / "another copy" / "of the models"
    other.mkdir(parents=True)
    shutil.copyfile(src / "split.onnx", other / "split.onnx")
    compile_in(tmp_path, other / "split.onnx", "-o", tmp_path / "copy", *options)
    rel = outputs(tmp_path / "rel")
    assert differing(rel, first_output(first_runs, "split", ep, "never")) == [] and differing(rel, outputs(tmp_path / "copy")) == []
    if ep == "qnn":
        assert "split_ctx_qnn.bin" in {without_digest(n) for n in rel}


@pytest.mark.parametrize("ep, before", [("cpu", ("--embed", "never", "--shard-size", "4K")), ("qnn", ("--embed", "always"))])
def test_replacing_an_output_gives_the_bytes_of_a_fresh_compile(ep: str, before: tuple[str, ...], first_runs: tuple[Path, Path, float],
                                                                tmp_path: Path, src: Path) -> None:
    """Content-addressed names are a function of the bytes: --force over an earlier output with other files (shards;
    an embedded blob) leaves exactly the files, names and bytes a compile into an empty directory does."""
    options = ("--ep", ep, "--embed", "never")
    compile_in(tmp_path, src / "split.onnx", "-o", tmp_path / "replaced", "--ep", ep, *before)
    earlier = outputs(tmp_path / "replaced")
    compile_in(tmp_path, src / "split.onnx", "-o", tmp_path / "replaced", *options, "--force")
    fresh = first_output(first_runs, "split", ep, "never")
    assert set(earlier) != set(fresh)  # the earlier output had other files, all gone now
    assert differing(fresh, outputs(tmp_path / "replaced")) == []


def test_relative_input_path_in_a_subdirectory(first_runs: tuple[Path, Path, float], tmp_path: Path, src: Path) -> None:
    """`ortcompile compile source-models/split.onnx -o out` from the parent directory, several times (a chdir
    race once made it fail depending on thread timing: /tmp/ortcompile-bugs/pipeline-5.md): every run
    succeeds and gives the bytes of an absolute-path run."""
    reference = first_output(first_runs, "split", "cpu")
    for attempt in range(6):
        compile_in(tmp_path, f"{src.name}/split.onnx", "-o", f"rel{attempt}", "--ep", "cpu")
        assert differing(reference, outputs(tmp_path / f"rel{attempt}")) == []


def test_a_batch_gives_the_bytes_of_single_runs(batch: dict[str, bytes], first_runs: tuple[Path, Path, float]) -> None:
    """The QNN HTP backend numbers tensors with a process-wide counter that ends up in the blob; a CLI batch
    compiles each model in a fresh process, so split compiled after mlp in a batch is byte-identical to
    split compiled alone, blob included (/tmp/ortcompile-bugs/pipeline-3.md)."""
    alone = {**first_output(first_runs, "split", "qnn", "never"), **first_output(first_runs, "mlp", "qnn", "never")}
    assert {"mlp_ctx_qnn.bin", "split_ctx_qnn.bin"} <= {without_digest(n) for n in batch}
    assert differing(alone, batch) == []


_TWICE_IN_ONE_PROCESS = """
import sys
from ortcompile import CompileOptions, compile_model
options = CompileOptions(ep="qnn", embed="never")
compile_model(sys.argv[1], sys.argv[2], options)
compile_model(sys.argv[1], sys.argv[3], options)
"""


def test_library_compiling_twice_in_one_process_is_byte_identical(tmp_path: Path, src: Path) -> None:
    """The QNN backend keeps process-global counters that end up in its context binary: a model compiled after
    another compile in the same process used to get different tensor ids. Every compile now runs the EP in a
    fresh worker child, so two compiles from one Python process give the same bytes (docs/output-layout.md)."""
    proc = subprocess.run([sys.executable, "-c", _TWICE_IN_ONE_PROCESS, src / "split.onnx", tmp_path / "first", tmp_path / "second"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    first, second = outputs(tmp_path / "first"), outputs(tmp_path / "second")
    assert "split_ctx_qnn.bin" in {without_digest(n) for n in first}
    assert differing(first, second) == []
    text = DOC.read_text()
    assert "## Determinism" in text and "worker" in text


def test_same_batch_twice_is_byte_identical(batch: dict[str, bytes], tmp_path: Path, src: Path) -> None:
    compile_in(src, "mlp.onnx", "split.onnx", "-o", tmp_path / "two", "--ep", "qnn", "--embed", "never")
    assert differing(batch, outputs(tmp_path / "two")) == []
