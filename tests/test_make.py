"""examples/Makefile and `--depfile`: ortcompile driven by GNU make, as a project's build would.

Everything runs the real `make` on a copy of examples/Makefile and of the fixtures in tmp_path, with the real
ortcompile (QNN's HTP simulator via `--ep auto`). What counts as "make did nothing" is proved twice: make's own
words ("Nothing to be done", `make -q` exit 0, no recipe line echoed) and the outputs' inode, mtime and bytes.
Each test gets its own XDG cache, so --if-changed stamps never leak between tests or into ~/.cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest
from helpers import FIXTURES, REPO, run_cli, without_digest

from ortcompile.errors import OutputError
from ortcompile.output.incremental import make_escape

MAKEFILE = REPO / "examples" / "Makefile"
ORTCOMPILE = f"{shlex.quote(sys.executable)} -m ortcompile"  # the interpreter under test, not whatever is on PATH

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


# ---------------------------------------------------------------- helpers


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """tmp_path/examples/Makefile and tmp_path/fixtures/{mlp,split}.onnx: the repo's layout, in a sandbox."""
    (tmp_path / "examples").mkdir()
    shutil.copyfile(MAKEFILE, tmp_path / "examples" / "Makefile")
    (tmp_path / "fixtures").mkdir()
    for name in ("mlp.onnx", "split.onnx"):
        shutil.copyfile(FIXTURES / name, tmp_path / "fixtures" / name)
    return tmp_path


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "XDG_CACHE_HOME": str(root / "xdg-cache")}


def make(project: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["make", f"ORTCOMPILE={ORTCOMPILE}", *args], cwd=project / "examples", env=_env(project),
                          capture_output=True, text=True, timeout=timeout)
    print(f"$ make {' '.join(args)}  -> {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return proc


def make_ok(project: Path, *args: str) -> str:
    proc = make(project, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def compiled(stdout: str) -> set[str]:
    """Models whose recipe make ran (make echoes each recipe line)."""
    return {line.split("compile ../fixtures/", 1)[1].split(".onnx", 1)[0]
            for line in stdout.splitlines() if " -m ortcompile compile ../fixtures/" in line}


def state(directory: Path) -> dict[str, tuple[int, int, str]]:
    """name -> (inode, mtime_ns, sha256) of every file: a republish changes the inode, a rewrite the bytes."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(directory.iterdir()) if p.is_file()}


def of_model(snapshot: dict[str, tuple[int, int, str]], stem: str) -> dict[str, tuple[int, int, str]]:
    return {name: v for name, v in snapshot.items() if name.startswith(f"{stem}_ctx") or name == f"{stem}.d"}


def rule(target: str, *deps: str) -> str:
    """A depfile rule as gcc -MD -MP writes it (paths already escaped): the rule, then one empty rule per
    prerequisite so that a prerequisite which disappears later does not stop make."""
    return f"{target}: \\\n  " + " \\\n  ".join(deps) + "\n" + "".join(f"\n{d}:\n" for d in deps)


def bump_mtime(path: Path) -> None:
    """`touch` that is certainly newer than anything built before it (coarse kernel clocks tick in ms)."""
    time.sleep(0.05)
    os.utime(path)


def rewrite_with_new_bytes(model_path: Path) -> None:
    """Same graph, different bytes (a doc string), so the sha256 changes but the model stays valid."""
    model = onnx.load(str(model_path))
    model.doc_string = f"edited {time.time_ns()}"
    onnx.save(model, str(model_path))
    bump_mtime(model_path)


def external_data_model(path: Path, data_name: str) -> Path:
    """The mlp fixture with its weights in `data_name` beside it (ORT resolves it relative to the model)."""
    model = onnx.load(str(FIXTURES / "mlp.onnx"))
    onnx.save(model, str(path), save_as_external_data=True, location=data_name, size_threshold=1024)
    assert (path.parent / data_name).stat().st_size > 500_000
    return path


def flip_bytes(path: Path) -> None:
    """Change bytes, keep the size (the cheap size check cannot see it; only the digest can)."""
    data = bytearray(path.read_bytes())
    data[100:104] = bytes(b ^ 0x01 for b in data[100:104])
    path.write_bytes(bytes(data))
    bump_mtime(path)


# ---------------------------------------------------------------- the example Makefile


def test_second_make_does_nothing_and_a_touched_input_rebuilds_only_its_model(project: Path) -> None:
    build = project / "examples" / "build"
    out = make_ok(project, "-j2")
    assert compiled(out) == {"mlp", "split"}
    for stem in ("mlp", "split"):
        manifest = json.loads((build / f"{stem}_ctx.manifest.json").read_text())
        assert manifest["model"] == f"{stem}_ctx.onnx"
        assert manifest["input"]["files"][0]["sha256"] == hashlib.sha256((project / "fixtures" / f"{stem}.onnx").read_bytes()).hexdigest()
        # the depfile: output path as make knows it, input path as given on the command line
        assert (build / f"{stem}.d").read_text() == rule(f"build/{stem}_ctx.onnx", f"../fixtures/{stem}.onnx")
    first = state(build)

    # second run: make starts nothing, and nothing on disk moves
    out = make_ok(project, "-j2")
    assert "Nothing to be done for 'all'" in out and compiled(out) == set()
    assert make(project, "-q").returncode == 0  # make's question mode: everything up to date
    assert state(build) == first

    # touch ONE input (same bytes): make reruns only that rule; --if-changed finds the digest unchanged and
    # publishes nothing (same inode, same bytes, manifest untouched); the recipe's `touch -c` moves the
    # model's mtime so the next make is quiet again
    bump_mtime(project / "fixtures" / "mlp.onnx")
    assert make(project, "-q").returncode == 1  # make now wants to rebuild mlp
    out = make_ok(project, "-j2")
    assert compiled(out) == {"mlp"}
    after = state(build)
    assert of_model(after, "split") == of_model(first, "split")
    for name in ("mlp_ctx.onnx", "mlp_ctx.manifest.json"):
        assert after[name][0] == first[name][0] and after[name][2] == first[name][2], name
    assert after["mlp_ctx.manifest.json"][1] == first["mlp_ctx.manifest.json"][1]
    assert after["mlp_ctx.onnx"][1] > first["mlp_ctx.onnx"][1]
    out = make_ok(project, "-j2")
    assert "Nothing to be done for 'all'" in out and state(build) == after

    # change ONE input's bytes: only that model is compiled again and republished
    rewrite_with_new_bytes(project / "fixtures" / "split.onnx")
    out = make_ok(project, "-j2")
    assert compiled(out) == {"split"}
    rebuilt = state(build)
    assert of_model(rebuilt, "mlp") == of_model(after, "mlp")
    assert rebuilt["split_ctx.onnx"][0] != after["split_ctx.onnx"][0]  # a new file was renamed into place
    manifest = json.loads((build / "split_ctx.manifest.json").read_text())
    assert manifest["input"]["files"][0]["sha256"] == hashlib.sha256((project / "fixtures" / "split.onnx").read_bytes()).hexdigest()
    out = make_ok(project, "-j2")
    assert "Nothing to be done for 'all'" in out and state(build) == rebuilt


def test_depfile_lists_external_data_and_a_weights_only_edit_rebuilds(project: Path) -> None:
    build = project / "examples" / "build"
    external_data_model(project / "fixtures" / "ext.onnx", "ext.onnx.data")
    models = "MODELS=mlp split ext"
    assert compiled(make_ok(project, "-j2", models)) == {"mlp", "split", "ext"}
    assert (build / "ext.d").read_text() == rule("build/ext_ctx.onnx", "../fixtures/ext.onnx", "../fixtures/ext.onnx.data")
    assert "Nothing to be done" in make_ok(project, "-j2", models)
    before = state(build)

    # only the weights change: make sees it through the depfile, ortcompile through the digest
    flip_bytes(project / "fixtures" / "ext.onnx.data")
    assert compiled(make_ok(project, "-j2", models)) == {"ext"}
    after = state(build)
    assert of_model(after, "mlp") == of_model(before, "mlp") and of_model(after, "split") == of_model(before, "split")
    assert after["ext_ctx.onnx"][0] != before["ext_ctx.onnx"][0]
    recorded = {f["name"]: f["sha256"] for f in json.loads((build / "ext_ctx.manifest.json").read_text())["input"]["files"]}
    assert recorded["ext.onnx.data"] == hashlib.sha256((project / "fixtures" / "ext.onnx.data").read_bytes()).hexdigest()
    assert "Nothing to be done" in make_ok(project, "-j2", models)


def test_makefile_variables_ep_and_out(project: Path) -> None:
    """EP= and OUT= reach ortcompile: a CPU build into another directory, recorded in its manifest."""
    out = make_ok(project, "EP=cpu", "OUT=build-cpu", "MODELS=split")
    assert "--ep cpu" in out and "-o build-cpu" in out
    manifest = json.loads((project / "examples" / "build-cpu" / "split_ctx.manifest.json").read_text())
    assert manifest["options"]["ep"] == "cpu" and manifest["nodes"]["epcontext"] == 0
    assert (project / "examples" / "build-cpu" / "split.d").read_text().startswith("build-cpu/split_ctx.onnx: ")
    assert not (project / "examples" / "build").exists()


def test_recheck_catches_an_option_change_make_cannot_see(project: Path) -> None:
    """Changing ORTCOMPILE_FLAGS touches no file: plain make does nothing; RECHECK=1 lets --if-changed rebuild."""
    build = project / "examples" / "build"
    make_ok(project, "EP=cpu", "MODELS=split")
    first = state(build)
    assert "Nothing to be done" in make_ok(project, "EP=cpu", "MODELS=split", "ORTCOMPILE_FLAGS=--align 64")
    assert state(build) == first
    out = make_ok(project, "EP=cpu", "MODELS=split", "ORTCOMPILE_FLAGS=--align 64", "RECHECK=1")
    assert compiled(out) == {"split"}
    manifest = json.loads((build / "split_ctx.manifest.json").read_text())
    assert manifest["options"]["layout"]["align"] == 64
    assert state(build)["split_ctx.manifest.json"][0] != first["split_ctx.manifest.json"][0]
    # RECHECK with nothing changed runs ortcompile, which publishes nothing (the depfile is rewritten, same bytes)
    settled = state(build)
    out = make_ok(project, "EP=cpu", "MODELS=split", "ORTCOMPILE_FLAGS=--align 64", "RECHECK=1")
    assert compiled(out) == {"split"}
    now = state(build)
    assert now["split.d"][2] == settled["split.d"][2]
    assert {n: (ino, sha) for n, (ino, _, sha) in now.items() if n != "split.d"} == \
           {n: (ino, sha) for n, (ino, _, sha) in settled.items() if n != "split.d"}


def test_removed_data_file_does_not_break_make(project: Path) -> None:
    """A model re-exported with another data file name: the old name in the depfile must not stop make."""
    fixtures = project / "fixtures"
    external_data_model(fixtures / "ext.onnx", "ext.onnx.data")
    make_ok(project, "MODELS=ext")
    external_data_model(fixtures / "ext.onnx", "weights.bin")
    (fixtures / "ext.onnx.data").unlink()
    bump_mtime(fixtures / "ext.onnx")
    proc = make(project, "MODELS=ext")
    assert proc.returncode == 0, proc.stderr
    assert compiled(proc.stdout) == {"ext"}
    assert (project / "examples" / "build" / "ext.d").read_text() == rule("build/ext_ctx.onnx", "../fixtures/ext.onnx", "../fixtures/weights.bin")
    assert "Nothing to be done" in make_ok(project, "MODELS=ext")


# ---------------------------------------------------------------- escaping paths for make


def test_make_escape() -> None:
    assert make_escape("plain/path.onnx") == "plain/path.onnx"
    assert make_escape("we ird $dir#1:x/m data.bin") == r"we\ ird\ $$dir\#1\:x/m\ data.bin"
    with pytest.raises(OutputError, match="newline"):
        make_escape("a\nb")


@pytest.mark.parametrize("spelling", ["absolute", "relative"])  # relative: /tmp/ortcompile-bugs/pipeline-5.md
def test_depfile_with_space_dollar_hash_colon_is_read_right_by_make(spelling: str, tmp_path: Path) -> None:
    """A real make reads the escaped depfile: it is quiet when nothing changed and rebuilds when the external
    data file (in a directory named with a space, `$`, `#` and `:`, itself named with a space) changes.
    A wrong escape shows up as 'No rule to make target' or as a change make never notices."""
    src_dir = tmp_path / "we ird $dir#1:x"
    src_dir.mkdir()
    model = external_data_model(src_dir / "m.onnx", "m data.bin")
    prefix = f"{tmp_path}/" if spelling == "absolute" else ""
    rel_model, target = f"{prefix}we ird $dir#1:x/m.onnx", "out put/m_ctx.onnx"  # ($(@D) would split at the space)
    (tmp_path / "Makefile").write_text(
        f"{make_escape(target)}: {make_escape(rel_model)}\n"
        f"\t$(ORTCOMPILE) compile '$<' -o 'out put' --ep cpu --if-changed --depfile deps.d -q\n"
        f"-include deps.d\n"
    )

    def run_make() -> str:
        proc = subprocess.run(["make", f"ORTCOMPILE={ORTCOMPILE}"], cwd=tmp_path, env=_env(tmp_path),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    assert f"compile '{rel_model}'" in run_make()
    escaped_dir = prefix.replace(" ", "\\ ") + r"we\ ird\ $$dir\#1\:x"  # (tmp_path has no special characters)
    assert (tmp_path / "deps.d").read_text() == rule(r"out\ put/m_ctx.onnx", f"{escaped_dir}/m.onnx", f"{escaped_dir}/m\\ data.bin")
    assert "is up to date" in run_make()
    manifest = tmp_path / "out put" / "m_ctx.manifest.json"
    before = manifest.stat().st_ino

    flip_bytes(src_dir / "m data.bin")
    assert "compile" in run_make()
    assert manifest.stat().st_ino != before
    recorded = {f["name"]: f["sha256"] for f in json.loads(manifest.read_text())["input"]["files"]}
    assert recorded == {"m.onnx": hashlib.sha256(model.read_bytes()).hexdigest(),
                        "m data.bin": hashlib.sha256((src_dir / "m data.bin").read_bytes()).hexdigest()}
    assert "is up to date" in run_make()


def test_depfile_for_a_batch_has_one_rule_per_model(tmp_path: Path, fixture_copy) -> None:
    mlp, split = fixture_copy("mlp.onnx"), fixture_copy("split.onnx")
    proc = run_cli("compile", mlp, split, "-o", tmp_path / "out", "--ep", "cpu", "--depfile", tmp_path / "all.d", "-q", env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "all.d").read_text() == rule(f"{tmp_path}/out/mlp_ctx.onnx", str(mlp)) + rule(f"{tmp_path}/out/split_ctx.onnx", str(split))


# ---------------------------------------------------------------- examples/ci.sh

CI_SCRIPT = REPO / "examples" / "ci.sh"


def run_ci(tmp_path: Path, model: str, artifacts: str, **env: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["bash", str(CI_SCRIPT), model, artifacts], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**_env(tmp_path), "ORTCOMPILE": ORTCOMPILE, **env})
    print(proc.stderr)
    return proc


def test_ci_script_compiles_verifies_inspects_and_archives_reproducibly(tmp_path: Path) -> None:
    shutil.copyfile(FIXTURES / "split.onnx", tmp_path / "split.onnx")
    proc = run_ci(tmp_path, "split.onnx", "art")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[-1] == "ci: ok: art/split_ctx.tar.gz"
    art = tmp_path / "art"

    compile_report = json.loads((art / "reports" / "compile.json").read_text())["outputs"][0]
    assert compile_report["model"] == "art/model/split_ctx.onnx" and compile_report["epcontext_nodes"] == 3
    assert "verify" in compile_report["timings"]  # compiled with --verify
    inspect_report = json.loads((art / "reports" / "inspect.json").read_text())
    assert inspect_report["problems"] == [] and inspect_report["manifest"]["ok"] is True
    assert inspect_report["manifest"]["hashed"] is True  # --check
    verify_report = json.loads((art / "reports" / "verify.json").read_text())
    assert verify_report["ok"] is True and [r["seed"] for r in verify_report["runs"]] == [0, 1, 2]

    manifest = json.loads((art / "model" / "split_ctx.manifest.json").read_text())
    expected = sorted(["split_ctx.manifest.json", *(f["name"] for f in manifest["files"])])
    assert sorted(os.listdir(art / "model")) == expected
    import tarfile

    with tarfile.open(art / "split_ctx.tar.gz") as archive:
        members = {m.name: m for m in archive.getmembers() if m.isfile()}
        assert sorted(members) == [f"model/{n}" for n in expected]
        for name, member in members.items():
            assert archive.extractfile(member).read() == (art / name).read_bytes()
            assert (member.mtime, member.uid, member.gid) == (0, 0, 0)
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=art, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.count(": OK") == 4, check.stdout

    # the same job again, elsewhere and later: the archive is byte-identical
    time.sleep(1.1)
    again = run_ci(tmp_path, str(tmp_path / "split.onnx"), str(tmp_path / "second run"))
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "second run" / "split_ctx.tar.gz").read_bytes() == (art / "split_ctx.tar.gz").read_bytes()


@pytest.mark.parametrize(("criterion", "why"), [
    ({"PRECISION": "fp32", "RTOL": "0", "ATOL": "0"}, "256/256 elements outside rtol=0.0 atol=0.0"),
    ({"RTOL": "0", "ATOL": "0", "MIN_SNR": "90"}, "dB < 90 dB"),
], ids=["fp32-zero-tolerance", "min-snr"])
def test_ci_script_stops_with_exit_5_and_publishes_nothing_on_a_mismatch(tmp_path: Path, criterion: dict[str, str], why: str) -> None:
    """A criterion QNN's correct output cannot meet, so compile --verify must refuse to publish: judged as an fp32 EP
    with tolerance 0 (QNN computes in fp16: max abs diff ~4e-4 on split), or by its fp16 criterion with SNR >= 90 dB
    (measured 64-66 dB). Under the fp16 criterion an output whose every element is within RTOL/ATOL passes whatever
    MIN_SNR says, hence RTOL=0 ATOL=0 there; and RTOL=0 ATOL=0 alone would still pass on SNR and cosine."""
    shutil.copyfile(FIXTURES / "split.onnx", tmp_path / "split.onnx")
    proc = run_ci(tmp_path, "split.onnx", "art", EP="qnn", **criterion)
    assert proc.returncode == 5
    lines = proc.stderr.splitlines()
    assert lines[-1] == "ci: compile failed (exit 5); see the error above and art/reports/compile.json"
    assert lines[-2].startswith("ortcompile: error: not published: output 'y' differs from the source on the CPU EP (seed 0): ")
    assert why in lines[-2]
    art = tmp_path / "art"
    assert not (art / "model" / "split_ctx.onnx").exists() and not (art / "split_ctx.tar.gz").exists()
    assert os.listdir(art / "reports") == ["compile.json"]  # --json: the error as a JSON object, for the CI log
    error = json.loads((art / "reports" / "compile.json").read_text())["error"]
    assert error["exit_code"] == 5 and error["message"] == lines[-2][len("ortcompile: error: "):]


def test_ci_script_passes_fix_dims_and_stops_with_exit_2_without_them(tmp_path: Path) -> None:
    shutil.copyfile(FIXTURES / "dynamic.onnx", tmp_path / "dynamic.onnx")
    failed = run_ci(tmp_path, "dynamic.onnx", "art")
    assert failed.returncode == 2 and "add --fix-dim batch=N" in failed.stderr
    assert failed.stderr.splitlines()[-1] == "ci: compile failed (exit 2); see the error above and art/reports/compile.json"
    fixed = run_ci(tmp_path, "dynamic.onnx", "art", FIX_DIMS="batch=1")
    assert fixed.returncode == 0, fixed.stderr
    verify_report = json.loads((tmp_path / "art" / "reports" / "verify.json").read_text())
    assert verify_report["ok"] is True and verify_report["dims"] == {"batch": 1}


# ---------------------------------------------------------------- split's Make fragment


def test_split_fragment_stitches_beside_the_parts_and_never_over_another_output(tmp_path: Path) -> None:
    """The fragment's stitch goes into the parts directory (`parts/stitched/`), replacing only its own earlier stitch;
    pointed (--stitch-output) at an earlier compile's output, it refuses instead of forcing over it."""
    shutil.copyfile(FIXTURES / "split.onnx", tmp_path / "split.onnx")
    assert run_cli("compile", "split.onnx", "-o", "out", "--ep", "cpu", "-q", cwd=tmp_path).returncode == 0
    earlier = state(tmp_path / "out")
    split = ["split", "split.onnx", "--ep", "cpu", "--partition", "1KiB", "-q"]
    assert run_cli(*split, "-o", "parts", cwd=tmp_path).returncode == 0

    def run_make(fragment: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["make", "-f", fragment, "-j", "2", f"ORTCOMPILE={ORTCOMPILE}"], cwd=tmp_path, env=_env(tmp_path),
                              capture_output=True, text=True, timeout=600)
        print(proc.stdout + proc.stderr)
        return proc

    assert run_make("parts/split.parts.mk").returncode == 0
    stitched = tmp_path / "parts" / "stitched"
    first = state(stitched)
    assert sorted(without_digest(n) for n in first) == ["split_ctx.data", "split_ctx.manifest.json", "split_ctx.onnx"]
    bump_mtime(tmp_path / "parts" / "split.part02.onnx")  # a part rebuilt: make stitches again, over its own output
    again = run_make("parts/split.parts.mk")
    assert again.returncode == 0 and "-m ortcompile stitch" in again.stdout
    assert state(stitched)["split_ctx.onnx"][0] != first["split_ctx.onnx"][0], "republished"
    assert state(tmp_path / "out") == earlier

    assert run_cli(*split, "-o", "parts2", "--stitch-output", "out", cwd=tmp_path).returncode == 0
    # The same parts, compiled by the same recipes above: copied in (newer than the parts, so make takes them as
    # built) instead of 5 more compiles; what is left for make is the stitch, which is the subject here.
    shutil.copytree(tmp_path / "parts" / "compiled", tmp_path / "parts2" / "compiled", copy_function=shutil.copyfile)
    refused = run_make("parts2/split.parts.mk")
    assert "-m ortcompile compile" not in refused.stdout and "-m ortcompile stitch" in refused.stdout
    assert refused.returncode != 0
    assert "out/split_ctx.onnx already exists and is not a stitched split.onnx: --replace-stitched replaces only an earlier stitch" in refused.stderr
    assert state(tmp_path / "out") == earlier, "the earlier compile's output is untouched"
