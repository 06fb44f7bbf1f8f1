"""split / stitch against hostile and stale inputs (issue 18): the Make fragment, `split --force`, the plan, the parts.

Everything is real: `make` and `make -n` run the fragment split wrote, stitch reads plans and compiled parts edited
the way a careless user or an attacker would. The parts are the split fixture cut into 5 pass-through parts
(`--ep cpu`, parts of at most 1 KiB of weights: seconds to compile); QNN where EP blobs matter.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from helpers import FIXTURES, assert_one_line_error, published, run_cli, sha256, snapshot
from onnx import numpy_helper

ORTCOMPILE = f"ORTCOMPILE={shlex.quote(sys.executable)} -m ortcompile"  # the interpreter under test, whatever PATH says
SPLIT = ["--ep", "cpu", "--partition", "1KiB"]
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


def _ok(proc: Any) -> Any:
    assert proc.returncode == 0, proc.stderr
    return proc


def _make(cwd: Path, fragment: str, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["make", "-f", fragment, *args, ORTCOMPILE], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "XDG_CACHE_HOME": str(cwd / "xdg-cache")})
    print(f"$ make -f {fragment} {' '.join(args)} -> {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return proc


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _compile_parts(parts: Path, compiled: Path) -> None:
    """Every part compiled as planned: the arguments the plan records (those the Make fragment uses)."""
    plan = json.loads(next(parts.glob("*.parts.json")).read_text())
    for name in plan["parts"]:
        _ok(run_cli("compile", parts / name, "-o", compiled, "--force", "-q", *plan["compile_args"]))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """root/src/split.onnx, split into root/parts (5 parts), each compiled into root/parts/compiled."""
    root = tmp_path_factory.mktemp("built")
    (root / "src").mkdir()
    shutil.copyfile(FIXTURES / "split.onnx", root / "src" / "split.onnx")
    _ok(run_cli("split", root / "src" / "split.onnx", "-o", root / "parts", *SPLIT, "-q"))
    _compile_parts(root / "parts", root / "parts" / "compiled")
    return root


@pytest.fixture
def work(built: Path, tmp_path: Path) -> Path:
    """A private copy of `built` to break."""
    shutil.copytree(built, tmp_path / "w", symlinks=True)
    return tmp_path / "w"


def _stitch(work: Path, *args: str) -> Any:
    return run_cli("stitch", work / "parts" / "split.parts.json", "--parts", work / "parts" / "compiled", "-o", work / "out", *args)


# ---------------------------------------------------------------- the Make fragment (defect 3)


@pytest.mark.parametrize(("option", "name"), [
    ("model", "m`id>X`x.onnx"),
    ("model", "m$(shell touch X).onnx"),
    ("model", "m#1.onnx"),
    ("model", "m%.onnx"),
    ("model", "m:x.onnx"),
    ("model", "m;touch X.onnx"),
    ("model", "m'q.onnx"),
    ("model", "m\ttab.onnx"),
    ("model", "m\nline.onnx"),
    ("-o", "p$(shell touch X)"),
    ("-o", "p`touch X`"),
    ("-o", "p#q"),
    ("-o", "p:q"),
    ("--stitch-output", "o$(shell touch X)"),
    ("--stitch-output", "o;touch X"),
], ids=lambda v: v.encode("unicode_escape").decode())
def test_split_refuses_names_make_or_the_shell_would_read_as_syntax(tmp_path: Path, option: str, name: str) -> None:
    model = tmp_path / "src" / (name if option == "model" else "m.onnx")
    model.parent.mkdir()
    shutil.copyfile(FIXTURES / "split.onnx", model)
    out = tmp_path / (name if option == "-o" else "parts")
    extra = ["--stitch-output", name] if option == "--stitch-output" else []
    proc = run_cli("split", model, "-o", out, *SPLIT, *extra)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, "the Make fragment cannot name it safely", "use a name of letters, digits, spaces and ._+,@/-")
    assert _files(tmp_path) == {f"src/{model.name}"}, "refused before anything was written"


@needs_make
def test_fragment_with_spaces_and_a_hostile_ep_option_runs_under_make_and_make_n(tmp_path: Path) -> None:
    """A space in -o and in the model's name works; an EP option holding Make and shell syntax reaches the compile
    verbatim and runs nothing, under `make -n` (which expands $(shell ...)) as under `make`."""
    (tmp_path / "src dir").mkdir()
    shutil.copyfile(FIXTURES / "split.onnx", tmp_path / "src dir" / "my model.onnx")
    value = "$(shell touch INJECTED1)`touch INJECTED2`$$(touch INJECTED3);touch INJECTED4 #c\\#d 'q' \"dq\" \\"
    _ok(run_cli("split", "src dir/my model.onnx", "-o", "my parts", *SPLIT, "--ep-option", f"x={value}", "-q", cwd=tmp_path))
    fragment = "my parts/my model.parts.mk"

    dry = _make(tmp_path, fragment, "-n")
    assert dry.returncode == 0 and dry.stdout.count("-m ortcompile compile") == 5
    assert not list(tmp_path.rglob("INJECTED*")) and not (tmp_path / "my parts" / "compiled").exists()

    assert _make(tmp_path, fragment, "-j", "2").returncode == 0
    assert not list(tmp_path.rglob("INJECTED*"))
    stitched = tmp_path / "my parts" / "stitched"
    assert (stitched / "my model_ctx.onnx").is_file()
    manifest = json.loads((tmp_path / "my parts" / "compiled" / "my model.part03_ctx.manifest.json").read_text())
    assert manifest["options"]["ep_options"] == {"x": value}, "the shell got the option exactly as given"
    assert "ortcompile" not in _make(tmp_path, fragment).stdout, "nothing to do the second time"


# ---------------------------------------------------------------- split --force (defect 5)


def test_split_force_removes_only_unchanged_parts_its_own_plan_proves_it_wrote(tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    parts.mkdir()
    source = parts / "split.onnx"  # the source beside its parts: a plan naming it must not get it deleted
    shutil.copyfile(FIXTURES / "split.onnx", source)
    (parts / "keep.txt").write_text("unrelated")
    _ok(run_cli("split", source, "-o", parts, *SPLIT, "-q"))
    plan_path = parts / "split.parts.json"
    plan = json.loads(plan_path.read_text())
    assert len(plan["parts"]) == 5
    # a hand-edited (or hostile) plan: the input model and an unrelated file listed among the parts and their files
    hostile = ["split.onnx", "keep.txt"]
    plan["parts"] += hostile
    plan.get("part_files", [[]])[-1].extend({"name": n, "size": (parts / n).stat().st_size, "sha256": sha256(parts / n)} for n in hostile)
    plan_path.write_text(json.dumps(plan))
    rejected = run_cli("split", source, "-o", parts, "--ep", "cpu", "--partition", "1GiB", "--force", "-q")
    assert rejected.returncode == 0, rejected.stderr
    left = {p.name for p in parts.iterdir()}
    assert {"split.onnx", "keep.txt"} <= left and sha256(source) == sha256(FIXTURES / "split.onnx")
    assert "split.part04.onnx" in left, "a plan that is not what split writes proves nothing: nothing it names is removed"

    # the plan split wrote: its unchanged parts go, the edited file and everything else stays
    shutil.rmtree(parts)
    parts.mkdir()
    shutil.copyfile(FIXTURES / "split.onnx", source)
    (parts / "keep.txt").write_text("unrelated")
    _ok(run_cli("split", source, "-o", parts, *SPLIT, "-q"))
    (parts / "split.part02.onnx.data").write_bytes(b"edited by hand")  # changed since the split wrote it: kept
    _ok(run_cli("split", source, "-o", parts, "--ep", "cpu", "--partition", "1GiB", "--force", "-q"))
    assert sorted(p.name for p in parts.iterdir()) == ["keep.txt", "split.onnx", "split.part00.onnx", "split.part00.onnx.data",
                                                       "split.part02.onnx.data", "split.parts.json", "split.parts.mk", "split.skeleton.onnx"]


# ---------------------------------------------------------------- stale and tampered parts (defects 6, 7)


def _change_a_weight(model: Path) -> None:
    """Same graph, one weight changed: the parts reading it get other data; the graph protos of all parts stay."""
    proto = onnx.load(str(model))
    weight = next(t for t in proto.graph.initializer if t.name == "W3")
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * np.float32(2), "W3"))
    onnx.save(proto, str(model))


def test_stitch_refuses_parts_compiled_from_an_earlier_split(work: Path) -> None:
    _change_a_weight(work / "src" / "split.onnx")
    _ok(run_cli("split", work / "src" / "split.onnx", "-o", work / "parts", *SPLIT, "--force", "-q"))
    for check in ("auto", "none"):
        proc = _stitch(work, "--check", check)
        assert proc.returncode == 2, proc.stderr
        line = assert_one_line_error(proc.stderr, "was compiled from another split.part04.onnx than the one this plan split")
        assert "part split.part04.onnx" in line and "compile it again with: ortcompile compile" in line
        assert not (work / "out").exists()
    _compile_parts(work / "parts", work / "parts" / "compiled")  # compiled again: stitched, under the new digest
    _ok(_stitch(work, "-q"))
    manifest = json.loads((work / "out" / "split_ctx.manifest.json").read_text())
    assert manifest["input"]["files"][0]["sha256"] == sha256(work / "src" / "split.onnx")
    assert _ok(run_cli("verify", work / "out" / "split_ctx.onnx", "--reference", work / "src" / "split.onnx", "-q"))


@pytest.mark.parametrize("target", ["split.part02_ctx.onnx.data", "split.part02_ctx.onnx"])
def test_stitch_refuses_a_compiled_part_changed_after_it_was_compiled(work: Path, target: str) -> None:
    """Same size, other bytes: only the sha256 sees it. Refused under --check none too, naming the part."""
    compiled = work / "parts" / "compiled"
    path = compiled / (published(compiled, target) if target.endswith(".data") else target)
    target = path.name
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    proc = _stitch(work, "--check", "none")
    assert proc.returncode == 3, proc.stderr
    assert_one_line_error(proc.stderr, f"part split.part02.onnx: {target} is not the file its manifest records (sha256 differs)",
                          "compile it again with: ortcompile compile")
    assert not (work / "out").exists()


def test_stitch_refuses_a_compiled_part_naming_a_file_its_manifest_does_not_list(work: Path) -> None:
    """The graph and its manifest rewritten together (sizes and sha256 fresh): the graph names a data file elsewhere."""
    compiled = work / "parts" / "compiled"
    model = onnx.load(str(compiled / "split.part00_ctx.onnx"), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "split.part02_ctx.onnx.data"
    _rewrite_with_fresh_manifest(compiled, "split.part00_ctx", model)
    proc = _stitch(work)
    assert proc.returncode == 3, proc.stderr
    assert_one_line_error(proc.stderr, "part split.part00.onnx: its graph names split.part02_ctx.onnx.data, which its manifest does not list")


def _rewrite_with_fresh_manifest(compiled: Path, base: str, model: onnx.ModelProto) -> None:
    path = compiled / f"{base}.onnx"
    path.write_bytes(model.SerializeToString())
    manifest_path = compiled / f"{base}.manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for entry in manifest["files"]:
        if entry["name"] == path.name:
            entry.update(size=path.stat().st_size, sha256=sha256(path))
    manifest_path.write_text(json.dumps(manifest))


# ---------------------------------------------------------------- malformed plans (defect 13)


def _set(*keys: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(plan: dict[str, Any]) -> None:
        target = plan
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return edit


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda plan: plan.pop(key)


MALFORMED = [
    ("parts-empty", _set("parts", value=[]), "'parts' must list at least one part"),
    ("parts-text", _set("parts", value="split.part00.onnx"), "'parts' must be a list"),
    ("parts-parent", _set("parts", 0, value="../split.part00.onnx"), "'parts[0]' must be 'split.part00.onnx'"),
    ("parts-absolute", _set("parts", 1, value="/etc/passwd"), "'parts[1]' must be 'split.part01.onnx'"),
    ("parts-reordered", lambda p: p["parts"].reverse(), "'parts[0]' must be 'split.part00.onnx'"),
    ("skeleton-parent", _set("skeleton", value="../x.onnx"), "'skeleton' must be 'split.skeleton.onnx'"),
    ("skeleton-absolute", _set("skeleton", value="/etc/passwd"), "'skeleton' must be 'split.skeleton.onnx'"),
    ("source-parent", _set("source", value="../split.onnx"), "'source' must be the source model's file name"),
    ("source-number", _set("source", value=7), "'source' must be the source model's file name"),
    ("source-path-null", _set("source_path", value=None), "'source_path' must be a path relative to the plan"),
    ("budget-text", _set("plan", "budget_bytes", value="1KiB"), "'plan.budget_bytes' must be an integer of at least 1"),
    ("budget-zero", _set("plan", "budget_bytes", value=0), "'plan.budget_bytes' must be an integer of at least 1"),
    ("nodes-gap", _set("plan", "parts", 2, "nodes", value=[4, 5]), "'plan.parts[2].nodes' must be [3, STOP]"),
    ("nodes-short", _set("plan", "nodes", value=99), "'plan.parts' must cover the graph's 99 nodes"),
    ("part-dropped", lambda p: (p["parts"].pop(), p["plan"]["parts"].pop(), p["part_files"].pop()), "'plan.parts' must cover the graph's"),
    ("specs-fewer", lambda p: p["plan"]["parts"].pop(), "'plan.parts' must describe the 5 parts"),
    ("weight-negative", _set("plan", "parts", 0, "weight_bytes", value=-1), "'plan.parts[0].weight_bytes' must be an integer of at least 0"),
    ("dims-negative", _set("dims", value={"batch": -1}), "'dims' must map names to integers"),
    ("dims-text", _set("dims", value={"batch": "1"}), "'dims' must map names to integers"),
    ("ep-number", _set("options", "ep", value=5), "'options.ep' must be an EP name"),
    ("ep-options-number", _set("options", "ep_options", value={"a": 1}), "'options.ep_options' must map option names to text"),
    ("align-zero", _set("options", "layout", "align", value=0), "'options.layout' is not a layout ortcompile writes"),
    ("align-float", _set("options", "layout", "align", value=4096.0), "'options.layout.align' must be an integer"),
    ("embed-bad", _set("options", "embed", value="sometimes"), "'options.embed' must be auto, always or never"),
    ("option-unknown", _set("options", "colour", value="red"), "'options.colour' is not an option split records"),
    ("share-weights", _set("options", "share_weights", value=True), "'options.share_weights' must be false"),
    ("digest-wrong", _set("input", "sha256", value="0" * 64), "'input.sha256' must be the digest of input.files"),
    ("digest-missing", _set("input", value=None), "'input' must be an object"),
    ("input-file-size", _set("input", "files", 0, "size", value="big"), "'input.files[0].size' must be an integer"),
    ("part-files-missing", _set("part_files", value=None), "'part_files' must be a list"),
    ("part-files-foreign", _set("part_files", 0, 1, "name", value="split.onnx"), "'part_files[0]' must name split.part00.onnx and its data"),
    ("part-files-sha", _set("part_files", 0, 0, "sha256", value="x"), "'part_files[0][0].sha256' must be a sha256 in hex"),
    ("compile-args", _set("compile_args", value="--ep cpu"), "'compile_args' must be a list"),
    ("source-ops", _set("source_ops", value={"MatMul": "3"}), "'source_ops' must map names to integers"),
    ("weights-negative", _set("source_weight_bytes", value=-5), "'source_weight_bytes' must be an integer of at least 0"),
    ("field-missing", _drop("skeleton"), "'skeleton' is missing"),
    ("field-unknown", _set("extra", value=1), "'extra' is not a field of a parts plan"),
]


@pytest.mark.parametrize(("edit", "needle"), [pytest.param(e, n, id=i) for i, e, n in MALFORMED])
def test_stitch_refuses_a_malformed_plan_naming_the_field(work: Path, edit: Callable[[dict[str, Any]], None], needle: str) -> None:
    plan_path = work / "parts" / "split.parts.json"
    plan = json.loads(plan_path.read_text())
    edit(plan)
    plan_path.write_text(json.dumps(plan))
    proc = _stitch(work)
    assert proc.returncode == 3, proc.stderr
    assert_one_line_error(proc.stderr, f"{plan_path}: invalid parts plan: {needle}", "write it again with ortcompile split")
    assert not (work / "out").exists()


def test_stitch_refuses_a_skeleton_that_resolves_outside_the_plans_directory(work: Path) -> None:
    skeleton = work / "parts" / "split.skeleton.onnx"
    shutil.move(skeleton, work / "elsewhere.onnx")
    skeleton.symlink_to(work / "elsewhere.onnx")
    proc = _stitch(work)
    assert proc.returncode == 3, proc.stderr
    assert_one_line_error(proc.stderr, "the skeleton path 'split.skeleton.onnx' resolves outside")


def test_stitch_refuses_an_old_plan_format_and_files_that_are_no_plan(work: Path) -> None:
    plan_path = work / "parts" / "split.parts.json"
    plan = json.loads(plan_path.read_text())
    plan_path.write_text(json.dumps({**plan, "format": "ortcompile-parts/1"}))
    proc = _stitch(work)
    assert proc.returncode == 3 and "a parts plan of another ortcompile version" in proc.stderr and "split the model again" in proc.stderr
    for content in ("[1, 2]", "{\"format\": 3}", "\xff\xfe"):
        plan_path.write_text(content)
        proc = _stitch(work)
        assert proc.returncode == 3, proc.stderr
        assert_one_line_error(proc.stderr, "not a parts plan written by ortcompile split")


def test_a_source_path_that_is_not_the_source_split_read_is_not_used(work: Path) -> None:
    """The check then loads the output only (-v says why); --verify, which needs the source, is refused."""
    (work / "src" / "split.onnx").write_bytes(b"not an onnx model")
    verify = _stitch(work, "--verify")
    assert verify.returncode == 2, verify.stderr
    assert_one_line_error(verify.stderr, "--verify compares with the source:", "is not the model split read (it changed since)")
    proc = _ok(_stitch(work, "-v"))
    assert "is not the model split read (it changed since): loading the output only" in proc.stderr
    assert (work / "out" / "split_ctx.onnx").is_file()


# ---------------------------------------------------------------- QNN parts: blobs


@pytest.fixture(scope="module")
def qnn_built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The split fixture as QNN parts, their blobs beside them (--embed never)."""
    pytest.importorskip("onnxruntime_qnn")
    root = tmp_path_factory.mktemp("qnn")
    (root / "src").mkdir()
    shutil.copyfile(FIXTURES / "split.onnx", root / "src" / "split.onnx")
    _ok(run_cli("split", root / "src" / "split.onnx", "-o", root / "parts", "--ep", "qnn", "--partition", "200KiB", "--embed", "never", "-q"))
    _compile_parts(root / "parts", root / "parts" / "compiled")
    return root


def test_stitch_refuses_a_tampered_blob_and_a_blob_path_outside_the_parts(qnn_built: Path, tmp_path: Path) -> None:
    work = tmp_path / "w"
    shutil.copytree(qnn_built, work)
    compiled = work / "parts" / "compiled"
    blobs = sorted(compiled.glob("*_qnn.*.bin"))
    assert blobs, sorted(p.name for p in compiled.iterdir())
    data = bytearray(blobs[0].read_bytes())
    data[len(data) // 2] ^= 0x01
    blobs[0].write_bytes(bytes(data))
    part = blobs[0].name.split("_ctx", 1)[0]
    proc = _stitch(work, "--check", "none")
    assert proc.returncode == 3, proc.stderr
    assert_one_line_error(proc.stderr, f"part {part}.onnx: {blobs[0].name} is not the file its manifest records (sha256 differs)")

    # the graph and its manifest rewritten together: the EPContext node names a blob outside --parts
    shutil.rmtree(work)
    shutil.copytree(qnn_built, work)
    model = onnx.load(str(compiled / f"{part}_ctx.onnx"), load_external_data=False)
    node = next(n for n in model.graph.node if n.op_type == "EPContext")
    next(a for a in node.attribute if a.name == "ep_cache_context").s = b"../../src/split.onnx"
    _rewrite_with_fresh_manifest(compiled, f"{part}_ctx", model)
    proc = _stitch(work)
    assert proc.returncode == 3, proc.stderr
    assert_one_line_error(proc.stderr, f"part {part}.onnx: its graph names the file '../../src/split.onnx', which is not a plain file name")
    assert snapshot(work / "out") is None
