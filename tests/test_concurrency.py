"""Concurrent builds (issue 4): `make -j` runs many `ortcompile compile` processes into one output directory.

Real processes, real onnxruntime and the real QNN EP. Checked after every batch: every process exits 0 with no
traceback; every published output is complete (the manifest's files exist with its sizes and sha256, the model
references only them) and byte-identical to the same compile run alone; the directory holds exactly the outputs'
files; no staging directory is left.

The racing compiles are `python -m ortcompile` processes (popen_process); the references they are compared with
("run alone") and the inspect checks run in this process (helpers.run_cli).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from genmodels import (  # noqa: E402
    STAGE_PREFIX,
    check_published,
    cli_env,
    external_mlp,
    mlp,
    popen_process,
    run_cli,
    save,
    stage_dirs,
)

BUGS = "/tmp/ortcompile-bugs"
ROUNDS = 2


def _env(root: Path) -> dict[str, str]:
    return cli_env({"XDG_CACHE_HOME": str(root / "xdg")})


def _files(directory: Path, stem: str) -> dict[str, bytes]:
    return {n: (directory / n).read_bytes() for n in sorted(os.listdir(directory)) if n.startswith(f"{stem}_ctx")}


def _run_all(commands: list[list[object]], env: dict[str, str]) -> list[tuple[int, str, str]]:
    """Start every command at once, then wait for all."""
    procs = [popen_process(*cmd, env=env) for cmd in commands]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        results.append((proc.returncode, out, err))
    return results


def _assert_all_ok(results: list[tuple[int, str, str]]) -> None:
    for code, _out, err in results:
        assert "Traceback" not in err and "internal error" not in err, err
        assert code == 0, err


def _assert_only_outputs(directory: Path, stems: list[str]) -> None:
    """Nothing in the directory but the listed outputs' files and manifests (no stage, no stray blob)."""
    expected: set[str] = set()
    for stem in stems:
        manifest = json.loads((directory / f"{stem}_ctx.manifest.json").read_text())
        expected |= {f["name"] for f in manifest["files"]} | {f"{stem}_ctx.manifest.json"}
    assert set(os.listdir(directory)) == expected, sorted(set(os.listdir(directory)) ^ expected)


# ---------------------------------------------------------------- 8 different models, one directory

# (name, builder, ep, extra options): CPU pass-through with and without external data, QNN with embedded and
# separate blobs, shards, other alignment.
EIGHT = [
    ("c0", lambda d: external_mlp(d, name="c0", seed=0), "cpu", []),
    ("c1", lambda d: external_mlp(d, name="c1", seed=1, width=128), "cpu", ["--shard-size", "64K"]),
    ("c2", lambda d: save(mlp(seed=2), d / "c2.onnx"), "cpu", ["--inline-threshold", "0"]),
    ("c3", lambda d: external_mlp(d, name="c3", seed=3, layers=4), "cpu", ["--align", "64K", "--align-threshold", "0"]),
    ("c4", lambda d: external_mlp(d, name="c4", seed=4, width=256), "cpu", []),
    ("q5", lambda d: external_mlp(d, name="q5", seed=5), "qnn", []),
    ("q6", lambda d: external_mlp(d, name="q6", seed=6, width=128), "qnn", ["--embed", "never"]),
    ("q7", lambda d: save(mlp(seed=7, layers=3), d / "q7.onnx"), "qnn", ["--embed", "never"]),
]


@pytest.fixture(scope="module")
def eight(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[object]], dict[str, dict[str, bytes]]]:
    """The 8 models, their compile commands (without -o) and each one's output compiled alone (the reference)."""
    root = tmp_path_factory.mktemp("eight")
    commands, reference = {}, {}
    for name, build, ep, extra in EIGHT:
        model = build(root / "src")
        commands[name] = ["compile", model, "--ep", ep, *extra]
        alone = root / "alone" / name
        result = run_cli(*commands[name], "-o", alone, env=_env(root))
        assert result.returncode == 0, result.stderr
        reference[name] = _files(alone, name)
    assert any("_qnn." in n and n.endswith(".bin") for n in reference["q6"]), "QNN wrote no separate blob with --embed never"
    return root, commands, reference


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_eight_models_into_one_directory(round_: int, eight, tmp_path: Path) -> None:
    root, commands, reference = eight
    out = tmp_path / "build"
    results = _run_all([[*cmd, "-o", out] for cmd in commands.values()], _env(tmp_path))
    _assert_all_ok(results)
    for name in commands:
        check_published(out, name)
        assert _files(out, name) == reference[name], f"{name}: differs from the same compile run alone"
    _assert_only_outputs(out, list(commands))
    assert not stage_dirs(out)
    result = run_cli("inspect", out / "q6_ctx.onnx", "--check", env=_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- 4 compiles of one model to one destination

@pytest.fixture(scope="module")
def one_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Callable[..., Path]]:
    """m.onnx (external data, read-only for the tests) and `alone(ep, *options)`: its output compiled alone with those
    options (the reference a race must reproduce), compiled on first use and shared by every round."""
    root = tmp_path_factory.mktemp("one-model")
    model = external_mlp(root / "src", width=128)
    done: dict[tuple[str, ...], Path] = {}

    def alone(ep: str, *extra: str) -> Path:
        if (ep, *extra) not in done:
            out = root / f"alone-{len(done)}"
            assert run_cli("compile", model, "-o", out, "--ep", ep, *extra, env=_env(root)).returncode == 0
            done[(ep, *extra)] = out
        return done[(ep, *extra)]

    return model, alone


@pytest.mark.parametrize("ep", ["cpu", "qnn"])
@pytest.mark.parametrize("round_", range(ROUNDS))
def test_four_identical_compiles_with_force(ep: str, round_: int, one_model: tuple[Path, Callable[..., Path]], tmp_path: Path) -> None:
    model, compiled_alone = one_model
    extra = ["--embed", "never"] if ep == "qnn" else ["--shard-size", "64K"]
    alone = compiled_alone(ep, *extra)
    reference = _files(alone, "m")
    out = tmp_path / "build"
    shutil.copytree(alone, out)  # a previous output, replaced 4 times at once
    results = _run_all([["compile", model, "-o", out, "--ep", ep, "--force", *extra] for _ in range(4)], _env(tmp_path))
    _assert_all_ok(results)
    check_published(out, "m")
    assert _files(out, "m") == reference
    _assert_only_outputs(out, ["m"])
    assert not stage_dirs(out)


def _waits_for_a_lock(pid: int) -> bool:
    """The process sleeps in the kernel waiting for a file lock (our flock)."""
    try:
        return "lock" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("round_", range(3))
def test_four_compiles_with_different_options_never_mix(round_: int, one_model: tuple[Path, Callable[..., Path]], tmp_path: Path) -> None:
    """Same model, same destination, two layouts racing: the result is exactly one of the two, never a mix."""
    model, compiled_alone = one_model
    layouts = {"A": ["--shard-size", "64K", "--inline-threshold", "0"], "B": ["--align", "16K", "--align-threshold", "0"]}
    reference = {key: _files(compiled_alone("cpu", *extra), "m") for key, extra in layouts.items()}
    assert reference["A"] != reference["B"]
    out = tmp_path / "build"
    order = ["A", "B", "A", "B"] if round_ % 2 == 0 else ["B", "A", "B", "A"]
    results = _run_all([["compile", model, "-o", out, "--ep", "cpu", "--force", *layouts[k]] for k in order], _env(tmp_path))
    _assert_all_ok(results)
    check_published(out, "m")
    assert _files(out, "m") in (reference["A"], reference["B"])
    _assert_only_outputs(out, ["m"])
    assert not stage_dirs(out)


def test_without_force_exactly_one_wins(tmp_path: Path) -> None:
    """4 compiles of one model into an empty directory without --force: one publishes, the others are refused with
    exit 4 'already exists' (re-checked under the publish lock), nothing is mixed, no stage is left."""
    model = external_mlp(tmp_path / "src", width=128)
    out = tmp_path / "build"
    results = _run_all([["compile", model, "-o", out, "--ep", "cpu"] for _ in range(4)], _env(tmp_path))
    codes = sorted(code for code, _, _ in results)
    assert codes.count(0) >= 1 and set(codes) <= {0, 4}, results
    for code, _, err in results:
        assert "Traceback" not in err
        if code == 4:
            assert "already exists; replace it with --force" in err
    assert codes.count(0) == 1, f"{codes.count(0)} processes published the same output without --force"
    check_published(out, "m")
    assert not stage_dirs(out)


# ---------------------------------------------------------------- stale stages and concurrent runs

def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _stale_committed_stage(dest: Path, source: Path, stem: str, tag: int) -> Path:
    """What a publisher SIGKILLed right after committing its journal leaves: staged files + publish.journal."""
    stage = dest / f"{STAGE_PREFIX}{_dead_pid()}-{tag:08x}"
    stage.mkdir()
    names = sorted(n for n in os.listdir(source) if n.startswith(f"{stem}_ctx"))
    order = [*(n for n in names if not n.endswith((".onnx", ".manifest.json"))), f"{stem}_ctx.onnx", f"{stem}_ctx.manifest.json"]
    for name in order:
        shutil.copyfile(source / name, stage / name)
    (stage / "publish.journal").write_text(json.dumps({"move": order, "delete": []}))
    return stage


def test_concurrent_runs_recovering_the_same_stale_stages(eight, tmp_path: Path) -> None:
    """`make -j8` after CI jobs were killed mid-publish: 48 stale committed stages in build/, 8 compiles start at once.
    Each run recovers stale stages first; they must not trip over each other (3 rounds: the race needs overlap)."""
    root, commands, _ = eight
    stems = ("c0", "c1", "c2", "q5", "q6")  # their staged files: the fixture's outputs compiled alone, same commands
    failures = []
    for round_ in range(3):
        out = tmp_path / f"build{round_}"
        out.mkdir()
        for tag in range(48):
            stem = stems[tag % len(stems)]
            _stale_committed_stage(out, root / "alone" / stem, stem, tag)
        results = _run_all([[*cmd, "-o", out, "--force"] for cmd in commands.values()], _env(tmp_path))
        failures += [err.strip().splitlines()[-1] for code, _, err in results if code != 0 or "Traceback" in err]
        if not failures:
            for name in commands:
                check_published(out, name)
            assert not stage_dirs(out)
    assert not failures, failures


def test_stale_stage_is_only_recovered_under_the_publish_lock(tmp_path: Path) -> None:
    """Rolling a killed publish forward is a publish: while another process holds the directory's publish lock (it
    may be renaming a newer output of the same model into place) nobody else may move files in."""
    model = external_mlp(tmp_path / "src")
    alone = tmp_path / "alone"
    assert run_cli("compile", model, "-o", alone, "--ep", "cpu", env=_env(tmp_path)).returncode == 0
    out = tmp_path / "build"
    out.mkdir()
    stale = _stale_committed_stage(out, alone, "m", 1)
    other = save(mlp(seed=3), tmp_path / "src2" / "other.onnx")
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # we are "a publisher in the middle of its renames"
        proc = popen_process("compile", other, "-o", out, "--ep", "cpu", "-v", env=_env(tmp_path))
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and stale.exists() and not _waits_for_a_lock(proc.pid):
            time.sleep(0.01)
        time.sleep(0.3)
        recovered_while_locked = not stale.exists()
    finally:
        os.close(fd)  # release
    proc.wait(60)
    reader.join(10)
    assert proc.returncode == 0, "".join(lines)
    assert not recovered_while_locked, "the stale stage was rolled forward while the publish lock was held by someone else"
    assert not stage_dirs(out)
    check_published(out, "m")
    check_published(out, "other")
