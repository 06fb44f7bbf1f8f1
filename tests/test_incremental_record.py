"""`--if-changed` as data: the published manifest held against the `Expected` record the driver makes.

No compile: a manifest as ortcompile writes one, for a small source with a data file and an output directory with
its files, is compared in this process, so every reason to rebuild is reached in milliseconds, including those the
CLI tests (test_incremental.py) do not make: a weaker check, a manifest from another input, a recorded input name
that leaves the source's directory, a missing input. The inputs' hash cache is this test's own ($XDG_CACHE_HOME).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ortcompile.naming import Destination, OutputTarget
from ortcompile.options import CompileOptions
from ortcompile.output import hashcache
from ortcompile.output.digest import hash_file
from ortcompile.output.incremental import Expected, Freshness, published_if_current
from ortcompile.output.manifest import CheckRecord, FileEntry, InputFile, Manifest


@pytest.fixture
def case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, OutputTarget, Manifest]:
    """A source with a data file, its published output and the manifest a CPU compile with --check none recorded."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    source = tmp_path / "src" / "m.onnx"
    source.parent.mkdir()
    source.write_bytes(b"graph")
    (source.parent / "m.onnx.data").write_bytes(b"w" * hashcache.MIN_BYTES)  # big enough to be remembered
    target = Destination.of(tmp_path / "out", [source]).targets[0]
    target.directory.mkdir()
    target.model_path.write_bytes(b"compiled")
    expected = _expected(source, CompileOptions(ep="cpu", check="none"), ())
    inputs = tuple(InputFile(p.name, p.stat().st_size, hash_file(p).sha256) for p in (source, source.parent / "m.onnx.data"))
    manifest = Manifest(model=target.names.model, files=(FileEntry(target.names.model, "model", 8, "0" * 64),), input_sha256="",
                        input_files=inputs, versions=expected.versions, options=expected.options,
                        check=CheckRecord("none", None))
    return source, target, manifest


def _expected(source: Path, options: CompileOptions, inputs: tuple[Path | str, ...]) -> Expected:
    return Expected.of(options, options.check, inputs)


def _answer(source: Path, target: OutputTarget, published: Manifest, options: CompileOptions | None = None) -> Freshness:
    options = options or CompileOptions(ep="cpu", check="none")
    return published_if_current(source, target, published, _expected(source, options, published.inputs_beside(source)))


def test_a_current_output_answers_with_its_manifest_and_remembers_the_hashed_inputs(case: tuple[Path, OutputTarget, Manifest]) -> None:
    source, target, manifest = case
    fresh = _answer(source, target, manifest)
    assert fresh.reason == "" and fresh.result is not None
    assert fresh.result.up_to_date and fresh.result.model_path == target.model_path and fresh.result.graph_bytes == 8
    assert fresh.result.inputs == [source, source.parent / "m.onnx.data"]
    assert hashcache._entry_path(source.parent / "m.onnx.data").is_file()  # hashed (nothing remembered yet): kept for the next check


@pytest.mark.parametrize(("change", "reason"), [
    ("check", "the output was published with a weaker check than --check load"),
    ("another input", "the manifest was made from another input"),
    ("unsafe name", "input '../escape.data' has a '..' component"),
    ("missing input", "input m.onnx.data is missing"),
    ("input bytes", "input m.onnx.data changed"),
    ("options", "options differ"),
    ("versions", "ortcompile, onnxruntime or EP version differs"),
    ("output", "output m_ctx.onnx is missing or changed size"),
])
def test_each_difference_is_named(case: tuple[Path, OutputTarget, Manifest], change: str, reason: str) -> None:
    source, target, manifest = case
    options = CompileOptions(ep="cpu", check="none")
    data = source.parent / "m.onnx.data"
    if change == "check":
        options = CompileOptions(ep="cpu", check="load")
    elif change == "another input":
        manifest = dataclasses.replace(manifest, input_files=(dataclasses.replace(manifest.input_files[0], name="n.onnx"), manifest.input_files[1]))
    elif change == "unsafe name":
        manifest = dataclasses.replace(manifest, input_files=(manifest.input_files[0], dataclasses.replace(manifest.input_files[1], name="../escape.data")))
    elif change == "missing input":
        data.unlink()
    elif change == "input bytes":
        data.write_bytes(b"W" * hashcache.MIN_BYTES)  # same size: only the sha256 tells
    elif change == "options":
        manifest = dataclasses.replace(manifest, options={**manifest.options, "embed": "always"})
    elif change == "versions":
        manifest = dataclasses.replace(manifest, versions=dataclasses.replace(manifest.versions, onnxruntime="0.0"))
    elif change == "output":
        target.model_path.write_bytes(b"compiled, longer")
    fresh = _answer(source, target, manifest, options)
    assert (fresh.result, fresh.reason) == (None, reason)
    remembered = {json.loads(p.read_text())["path"] for p in (source.parent.parent / "cache" / "ortcompile" / "hashes").glob("*.json")}
    assert remembered <= {str(data)}  # nothing hashed outside the source's directory (the unsafe name is never opened)
