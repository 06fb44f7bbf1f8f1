"""The trust model (docs/security.md, issue 18): what ortcompile reads, loads and executes, and what it refuses.

An adversary who can plant a file above the user's directory (a config in /tmp, a cloned repository) or edit an
output's files (its manifest, a blob symlink) must not choose code for ortcompile's process or the caller's, nor
make it read outside the model's directory; a damaged library or a hostile config is a one-line error, never a
crash. Real onnxruntime, the real QNN EP; the planted library is a real shared object whose constructor leaves a
mark when anything loads it (built with the C compiler; without one, a copy of a real extension module stands in
and only the outcome is checked).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import onnxruntime_qnn
import pytest
from helpers import FIXTURES, assert_one_line_error, cli_env, popen_process, published, run_cli, run_process, without_digest

import ortcompile
from ortcompile import CompileOptions, compile_model, eps
from ortcompile.config import find_config, resolve_config
from ortcompile.errors import EpUnavailable, InvalidModel, OrtCompileWarning

QNN = "QNNExecutionProvider"
NOBODY = 65534


@dataclass
class Planted:
    """A shared library an attacker would plant, and the file its constructor writes when it is loaded."""

    path: Path
    mark: Path | None  # None: no C compiler here, so loading leaves no mark (the outcome is still checked)

    @property
    def loaded(self) -> bool:
        return self.mark is not None and self.mark.exists()


@pytest.fixture
def planted(tmp_path: Path) -> Planted:
    directory = tmp_path / "attacker"
    directory.mkdir()
    library, mark = directory / "libplanted.so", directory / "LOADED"
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        shutil.copyfile(sys.modules["_ctypes"].__file__, library)  # a real ELF, not an EP plugin nor a QNN backend
        return Planted(library, None)
    source = directory / "planted.c"
    source.write_text('#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {\n'
                      f'  FILE *f = fopen("{mark}", "a"); if (f) {{ fputs("loaded\\n", f); fclose(f); }}\n}}\n')
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True, capture_output=True)
    return Planted(library, mark)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path/shared/work is the current directory, holding mlp.onnx; tmp_path/shared is the directory above it
    where a config can be planted; tmp_path/.git ends every search there."""
    work = tmp_path / "shared" / "work"
    work.mkdir(parents=True)
    shutil.copyfile(FIXTURES / "mlp.onnx", work / "mlp.onnx")
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("ORTCOMPILE_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return work


@pytest.fixture(scope="module")
def qnn_mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mlp.onnx compiled for QNN with its blob in a file of its own (mlp_ctx_qnn.bin)."""
    out = tmp_path_factory.mktemp("qnn-mlp")
    return compile_model(FIXTURES / "mlp.onnx", out, CompileOptions(ep="qnn", embed="never")).model_path


def copied(model: Path, directory: Path) -> Path:
    shutil.copytree(model.parent, directory)
    return directory / model.name


# ---------------------------------------------------------------- defect 1: a planted config loads no code


@pytest.mark.parametrize("text", [
    'ep-library = "{lib}"\n',
    'ep-option = {{ backend_path = "{lib}" }}\n',
    '[models.mlp]\nep-option = {{ op_packages = "Custom:{lib}:Provider" }}\n',
    'ep-option = {{ some_plugin = "{lib}" }}\n',  # a key ortcompile does not know, whose value names a library
], ids=["ep-library", "backend_path", "op_packages", "library-value"])
def test_a_config_found_by_searching_may_not_name_a_library(project: Path, planted: Planted, text: str) -> None:
    config = project.parent / "ortcompile.toml"
    config.write_text(text.format(lib=planted.path))
    proc = run_cli("compile", "mlp.onnx", "-o", "out", "--ep", "qnn")
    assert proc.returncode == 2, proc.stderr
    line = assert_one_line_error(proc.stderr, "../ortcompile.toml: ", "names a library to load", "--config ../ortcompile.toml")
    assert "ep-" in line and not planted.loaded
    assert not (project / "out").exists()


def test_a_config_the_user_names_may_name_a_library(project: Path, planted: Planted) -> None:
    """--config (or $ORTCOMPILE_CONFIG) says the file is trusted: its backend_path reaches QNN, which loads it."""
    config = project.parent / "ortcompile.toml"
    config.write_text(f'ep-option = {{ backend_path = "{planted.path}" }}\n')
    for args, env in ((["--config", config], None), ([], {**cli_env(), "ORTCOMPILE_CONFIG": str(config)})):
        proc = run_cli("compile", "mlp.onnx", "-o", "out", "--ep", "qnn", *args, env=env)
        assert proc.returncode == 2, proc.stderr
        assert_one_line_error(proc.stderr, f"refused --ep-option backend_path={planted.path}")
        assert planted.loaded or planted.mark is None


def _give_away(path: Path, group_only: bool = False) -> None:
    try:
        os.chown(path, -1 if group_only else NOBODY, NOBODY)
    except PermissionError:
        pytest.skip("making a file another user's needs root")


@pytest.mark.parametrize("case", ["other-writable file", "group-writable file", "other-writable directory", "someone else's file",
                                  "someone else's directory", "someone else's file through a symlink"])
def test_a_found_config_someone_else_could_have_written_is_ignored_with_a_warning(project: Path, case: str) -> None:
    config = project.parent / "ortcompile.toml"
    config.write_text("align = 3\n")  # read, it would be an error
    if case == "other-writable file":
        config.chmod(0o646)
    elif case == "group-writable file":
        config.chmod(0o664)
        _give_away(config, group_only=True)  # a group that is not the user's own
    elif case == "other-writable directory":
        project.parent.chmod(0o777)
    elif case == "someone else's file":
        _give_away(config)
    elif case == "someone else's directory":
        _give_away(project.parent)
    else:
        elsewhere = project.parent.parent / "elsewhere"
        elsewhere.mkdir()
        config.rename(elsewhere / "theirs.toml")
        _give_away(elsewhere / "theirs.toml")
        config.symlink_to(elsewhere / "theirs.toml")
    with pytest.warns(OrtCompileWarning, match=r"ignoring the config file \.\./ortcompile\.toml: .*; name it with --config"):
        assert resolve_config().path is None
    proc = run_cli("compile", "mlp.onnx", "-o", "out", "--ep", "cpu", "--check", "none")
    assert proc.returncode == 0, proc.stderr
    assert "ortcompile: warning: ignoring the config file ../ortcompile.toml" in proc.stderr
    named = run_cli("compile", "mlp.onnx", "-o", "out", "--force", "--config", "../ortcompile.toml")
    assert named.returncode == 2 and "align: expected a power of two" in named.stderr  # named: read, as the user asked


def test_a_config_of_the_users_own_in_a_sticky_directory_is_read(project: Path) -> None:
    """/tmp's case: anyone may add files, nobody may replace the user's."""
    project.parent.chmod(0o1777)
    (project.parent / "ortcompile.toml").write_text('ep = "cpu"\ncheck = "none"\nalign = 64\n')
    assert resolve_config().defaults["align"] == 64


def test_the_search_stops_at_the_project_root(project: Path) -> None:
    (project.parent / "ortcompile.toml").write_text("align = 3\n")
    assert find_config() == project.parent / "ortcompile.toml"
    (project / "pyproject.toml").write_text('[project]\nname = "mine"\n')  # a project without ortcompile settings
    assert find_config() is None
    ok = run_cli("compile", "mlp.onnx", "-o", "out", "--ep", "cpu", "--check", "none")
    assert ok.returncode == 0, ok.stderr


def test_the_search_does_not_leave_the_filesystem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ortcompile.toml").write_text("align = 3\n")  # on the filesystem above the mount
    mount = tmp_path / "mnt"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "ortcompile-test", str(mount)], capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        (mount / "work").mkdir()
        assert find_config(mount / "work") is None
        (mount / "ortcompile.toml").write_text("align = 64\n")
        assert find_config(mount / "work") == mount / "ortcompile.toml"
    finally:
        subprocess.run(["umount", str(mount)], check=True)


# ---------------------------------------------------------------- defect 14: hostile config text is a usage error


@pytest.mark.parametrize("data, needle", [
    (b'ep = "cpu"\nalign = "\xff\xfe"\n', "not valid TOML: not UTF-8 text (line 2)"),
    (b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply"),
    (b"fix-shape = { x = " + b"[" * 100 + b"1" + b"]" * 100 + b" }\n", "fix-shape.x: expected a positive whole number"),
], ids=["not-utf8", "deep-arrays", "deep-shape"])
def test_a_config_that_is_not_text_or_nested_too_deeply_is_a_usage_error(project: Path, data: bytes, needle: str) -> None:
    (project / "ortcompile.toml").write_bytes(data)
    for args in ([], ["--config", "ortcompile.toml"]):
        proc = run_cli("compile", "mlp.onnx", "-o", "out", *args)
        assert proc.returncode == 2, proc.stderr
        line = assert_one_line_error(proc.stderr, "ortcompile.toml: ", needle)
        assert len(line) < 400


# ---------------------------------------------------------------- defect 2: a tampered manifest loads no code


@pytest.fixture
def tampered(qnn_mlp: Path, planted: Planted, tmp_path: Path) -> Path:
    """The compiled mlp with `backend_path` of the planted library written into its manifest's ep_options."""
    model = copied(qnn_mlp, tmp_path / "tampered")
    manifest = model.with_name("mlp_ctx.manifest.json")
    document = json.loads(manifest.read_text())
    document["options"]["ep_options"]["backend_path"] = str(planted.path)
    manifest.write_text(json.dumps(document))
    return model


def test_load_session_ignores_a_library_a_manifest_names(tampered: Path, planted: Planted) -> None:
    with pytest.warns(OrtCompileWarning, match="ignoring the recorded ep_options backend_path="):
        session = ortcompile.load_session(tampered)
    assert session.get_providers()[0] == QNN
    assert session.get_provider_options()[QNN]["backend_path"] == onnxruntime_qnn.get_qnn_htp_path()  # QNN's own
    assert not planted.loaded


def test_load_session_takes_a_library_the_caller_passes(tampered: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", OrtCompileWarning)  # the caller chose it: nothing ignored, nothing to say
        session = ortcompile.load_session(tampered, ep_options={"backend_path": onnxruntime_qnn.get_qnn_htp_path()})
    assert session.get_providers()[0] == QNN


def test_verify_and_placement_ignore_a_library_a_manifest_names(tampered: Path, planted: Planted) -> None:
    verified = run_cli("verify", tampered, "--reference", FIXTURES / "mlp.onnx")
    assert verified.returncode == 0, verified.stderr
    assert "ortcompile: warning: " in verified.stderr and "ignoring the recorded ep_options backend_path=" in verified.stderr
    placed = run_cli("inspect", tampered, "--placement")
    assert placed.returncode == 0, placed.stderr
    assert "ignoring the recorded ep_options backend_path=" in placed.stderr and f"ep       {QNN}: 1 node" in placed.stdout
    assert not planted.loaded


def test_stitch_ignores_a_library_its_parts_plan_names(planted: Planted, tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    split = run_cli("split", FIXTURES / "split.onnx", "-o", parts, "--ep", "qnn", "--no-config", "--partition", "100K")
    assert split.returncode == 0, split.stderr
    plan = parts / "split.parts.json"
    document = json.loads(plan.read_text())
    document["options"]["ep_options"] = {"backend_path": str(planted.path)}
    plan.write_text(json.dumps(document))
    proc = run_cli("stitch", plan, "--parts", parts, "-o", tmp_path / "out")
    assert proc.returncode == 2, proc.stderr  # the parts were never compiled: what matters is what came before
    assert "ignoring the recorded ep_options backend_path=" in proc.stderr and "is not compiled" in proc.stderr
    assert not planted.loaded


def test_a_manifest_whose_ep_options_are_not_a_table_is_invalid(qnn_mlp: Path, tmp_path: Path) -> None:
    model = copied(qnn_mlp, tmp_path / "odd")
    manifest = model.with_name("mlp_ctx.manifest.json")
    document = json.loads(manifest.read_text())
    document["options"]["ep_options"] = [["backend_path", "x.so"]]
    manifest.write_text(json.dumps(document))
    with pytest.raises(InvalidModel, match="recorded ep_options are not a table of provider options"):
        ortcompile.load_session(model)


# ---------------------------------------------------------------- defect 4: load_session keeps the path-safety rule


def test_load_session_refuses_a_blob_symlinked_outside_the_models_directory(qnn_mlp: Path, tmp_path: Path) -> None:
    model = copied(qnn_mlp, tmp_path / "out")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    blob = model.with_name(published(model.parent, "mlp_ctx_qnn.bin"))
    blob.rename(outside / blob.name)
    blob.symlink_to(outside / blob.name)
    with pytest.raises(InvalidModel, match=rf"EP context path '{re.escape(blob.name)}' resolves outside the model's directory"):
        ortcompile.load_session(model)
    placed = run_cli("inspect", model, "--placement")
    assert placed.returncode == 3
    assert_one_line_error(placed.stderr, "resolves outside the model's directory")


# ---------------------------------------------------------------- defect 9: a damaged library is an error, not a crash


@pytest.fixture
def truncated_library(tmp_path: Path) -> Path:
    """The first 64 KiB of QNN's real plugin library: an ELF whose segments point past the end of the file."""
    library = tmp_path / "libtruncated.so"
    with open(onnxruntime_qnn.get_library_path(), "rb") as real:
        library.write_bytes(real.read(64 * 1024))
    return library


def test_a_truncated_ep_library_is_a_one_line_error(truncated_library: Path, tmp_path: Path) -> None:
    # a process: before the fix, loading it killed ortcompile with SIGBUS
    proc = run_process("compile", FIXTURES / "mlp.onnx", "-o", tmp_path / "out", "--no-config", "--ep", QNN, "--ep-library", truncated_library)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, f"--ep-library {truncated_library}: loading it crashed", "not a working EP plugin library")
    assert not (tmp_path / "out").exists()


def test_load_session_with_a_truncated_library_raises_in_the_caller(qnn_mlp: Path, truncated_library: Path) -> None:
    # a process: the caller whose life is at stake
    code = ("import ortcompile\nfrom ortcompile.errors import OrtCompileError\n"
            "try:\n"
            f"    ortcompile.load_session({str(qnn_mlp)!r}, ep={QNN!r}, ep_library={str(truncated_library)!r})\n"
            "except OrtCompileError as exc:\n"
            "    print(type(exc).__name__, exc.exit_code, exc.message)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=cli_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"EpUnavailable 2 --ep-library {truncated_library}: loading it crashed"), proc.stdout


def test_a_library_given_for_a_packaged_ep_does_not_replace_the_package_afterwards(planted: Planted) -> None:
    """A long-lived process (a service, this test run): one --ep-library for QNN must not become every later `qnn`."""
    with contextlib.suppress(EpUnavailable):
        eps.resolve(QNN, library=str(planted.path))
    assert eps.lookup("qnn").library is None and eps.lookup(QNN).library is None


# ---------------------------------------------------------------- defect 12: the option check's child dies with its parent


def _children(pid: int, marker: str) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            name = Path(f"/proc/{entry}/comm").read_text().strip()  # a forked child names itself after its module
        except OSError:
            continue
        if int(status.rsplit(")", 1)[1].split()[1]) == pid and (marker in command or name == marker.rsplit(".", 1)[-1]):
            found.append(int(entry))
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


def test_the_option_check_child_dies_with_a_sigkilled_parent(tmp_path: Path) -> None:
    # a process: the subject is what happens when it is SIGKILLed
    parent = popen_process("compile", FIXTURES / "mlp.onnx", "-o", tmp_path / "out", "--no-config", "--ep", "qnn",
                           "--ep-option", "htp_graph_finalization_optimization_mode=2")
    try:
        deadline, children = time.monotonic() + 120, []
        while not children and time.monotonic() < deadline and parent.poll() is None:
            children = _children(parent.pid, "ortcompile.eps.probechild")  # (eps/validate.py starts it with child.run_child)
            time.sleep(0.02)
        assert children, "the option check's child never started"
        time.sleep(0.3)  # the child is probing the EP
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.communicate()
    killed = time.monotonic()
    while any(map(_running, children)) and time.monotonic() - killed < 10:
        time.sleep(0.01)
    assert not any(map(_running, children)), "the child outlived its parent by 10 s"
    assert time.monotonic() - killed < 1.0


# ---------------------------------------------------------------- defect 17: --share-weights with a batch pin


def test_share_weights_with_a_pin_only_some_models_have(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fix the docs suggest for a dynamic member: --fix-dim applies to the models that have the dim, as in any batch."""
    for name in ("mlp.onnx", "dynamic.onnx"):
        shutil.copyfile(FIXTURES / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    proc = run_cli("compile", "--share-weights", "mlp.onnx", "dynamic.onnx", "--fix-dim", "batch=1", "--no-config", "-o", "out")
    assert proc.returncode == 0, proc.stderr
    pins = {stem: json.loads((tmp_path / "out" / f"{stem}_ctx.manifest.json").read_text())["options"]["fix_dims"] for stem in ("mlp", "dynamic")}
    assert pins == {"mlp": {}, "dynamic": {"batch": 1}}
    files = {stem: {f["name"] for f in json.loads((tmp_path / "out" / f"{stem}_ctx.manifest.json").read_text())["files"] if f["shared"]}
             for stem in ("mlp", "dynamic")}
    assert files["mlp"] == files["dynamic"] and "mlp_ctx_qnn.bin" in {without_digest(n) for n in files["mlp"]}  # one EP context, as for any shared batch
