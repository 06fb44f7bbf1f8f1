"""ortcompile.paths: every rule of resolve_inside() on a real directory tree (real symlinks, real loops)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ortcompile.paths import NAME_MAX, UnsafePath, is_plain_name, model_dir, resolve_inside


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """base/ with a file, a subdirectory and an `outside/` sibling holding a secret."""
    base = tmp_path / "base"
    (base / "sub").mkdir(parents=True)
    (base / "m.data").write_bytes(b"x")
    (base / "sub" / "w.data").write_bytes(b"y")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"s")
    return base


def refused(base: Path, name: str | bytes, plain: bool = False) -> UnsafePath:
    with pytest.raises(UnsafePath) as caught:
        resolve_inside(base, name, plain=plain)
    return caught.value


# ---------------------------------------------------------------- accepted names

@pytest.mark.parametrize("name, target", [
    ("m.data", "m.data"),
    ("sub/w.data", "sub/w.data"),
    ("./m.data", "m.data"),
    ("sub/./w.data", "sub/w.data"),
    ("sub//w.data", "sub/w.data"),
    ("ü/ñ☃.data", "ü/ñ☃.data"),  # need not exist: "missing" is the caller's message, not "unsafe"
    (" m.data", " m.data"),  # a leading space is part of a legal file name
    ("x" * NAME_MAX, "x" * NAME_MAX),
])
def test_relative_names_inside_resolve_to_their_real_path(tree: Path, name: str, target: str) -> None:
    assert resolve_inside(tree, name) == (tree / target).resolve()


def test_utf8_bytes_are_decoded(tree: Path) -> None:
    assert resolve_inside(tree, "ñ.bin".encode()) == tree.resolve() / "ñ.bin"


def test_plain_name_in_base(tree: Path) -> None:
    assert resolve_inside(tree, "m.data", plain=True) == tree.resolve() / "m.data"


def test_relative_base_resolves_from_the_working_directory(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tree.parent)
    assert resolve_inside(Path("base"), "m.data") == tree.resolve() / "m.data"


# ---------------------------------------------------------------- refused names, one rule each

@pytest.mark.parametrize("name, rule, words", [
    ("", "empty", "is empty"),
    (".", "empty", "only '.'"),
    ("./", "empty", "only '.'"),
    ("././.", "empty", "only '.'"),
    ("m.data\0.txt", "nul", "NUL byte"),
    ("/etc/passwd", "absolute", "absolute"),
    ("//etc/passwd", "absolute", "absolute"),
    ("C:\\Windows\\x", "absolute", "drive"),
    ("C:x.data", "absolute", "drive"),  # drive-relative on Windows
    ("c:/x", "absolute", "drive"),
    ("\\\\server\\share\\x", "absolute", "absolute"),
    ("\\x.data", "absolute", "absolute"),  # rooted on Windows
    ("..", "parent", "'..'"),
    ("../outside/secret", "parent", "'..'"),
    ("sub/../m.data", "parent", "'..'"),  # would stay inside, but '..' is refused outright (as ONNX does)
    ("..\\outside\\secret", "parent", "'..'"),  # Windows separators
    ("sub/..", "parent", "'..'"),
    ("x" * (NAME_MAX + 1), "too-long", f"at most {NAME_MAX}"),
    ("x" * 5000, "too-long", "at most 4095"),
    ("/".join(["d"] * 2100), "too-long", "at most 4095"),
    ("sub/" + "é" * 128, "too-long", "256 bytes"),  # 128 characters, 256 bytes in UTF-8
    ("\ud800.data", "encoding", "UTF-8"),
    ("\udcdf.data", "encoding", "UTF-8"),  # what os.fsdecode makes of a byte that is not UTF-8
    (b"m\xdf.onnx.dat", "encoding", "UTF-8"),
])
def test_each_rule(tree: Path, name: str | bytes, rule: str, words: str) -> None:
    error = refused(tree, name)
    assert (error.rule, error.name) == (rule, name)
    assert words in error.reason and words in str(error)
    assert "\n" not in str(error)
    assert isinstance(error, ValueError)


@pytest.mark.parametrize("name", ["sub/w.data", "sub\\w.data", "./m.data", "m.data/", "sub/"])
def test_plain_refuses_directory_parts(tree: Path, name: str) -> None:
    assert refused(tree, name, plain=True).rule == "not-plain"
    assert not is_plain_name(name)


def test_message_shows_a_long_name_cut(tree: Path) -> None:
    message = str(refused(tree, "/" + "a" * 5000))
    assert len(message) < 200 and "..." in message


# ---------------------------------------------------------------- symlinks

def test_symlinked_file_leaving_base(tree: Path) -> None:
    (tree / "link.data").symlink_to(tree.parent / "outside" / "secret")
    error = refused(tree, "link.data")
    assert error.rule == "outside"
    assert str(tree.resolve()) in error.reason and str((tree.parent / "outside" / "secret").resolve()) in error.reason


def test_relative_symlink_leaving_base(tree: Path) -> None:
    (tree / "rel.data").symlink_to("../outside/secret")
    assert refused(tree, "rel.data").rule == "outside"


def test_symlinked_directory_leaving_base(tree: Path) -> None:
    (tree / "weights").symlink_to(tree.parent / "outside", target_is_directory=True)
    assert refused(tree, "weights/secret").rule == "outside"


def test_dangling_symlink_leaving_base(tree: Path) -> None:
    (tree / "dangling.data").symlink_to(tree.parent / "outside" / "not-there")
    assert refused(tree, "dangling.data").rule == "outside"


def test_symlink_to_base_itself(tree: Path) -> None:
    (tree / "self").symlink_to(".")
    assert refused(tree, "self").rule == "outside"  # the directory, not a file in it


def test_symlink_inside_base_is_followed(tree: Path) -> None:
    (tree / "alias.data").symlink_to("sub/w.data")
    assert resolve_inside(tree, "alias.data", plain=True) == (tree / "sub" / "w.data").resolve()


@pytest.mark.parametrize("layout", ["self", "pair", "through-dir"])
def test_symlink_loops(tree: Path, layout: str) -> None:
    if layout == "self":
        (tree / "loop.data").symlink_to("loop.data")
        name = "loop.data"
    elif layout == "pair":
        (tree / "a").symlink_to("b")
        (tree / "b").symlink_to("a")
        name = "a"
    else:
        (tree / "d").symlink_to("d/x", target_is_directory=True)
        name = "d/w.data"
    error = refused(tree, name)
    assert (error.rule, error.reason) == ("unresolvable", "cannot be resolved (symlink loop)")


def test_base_behind_a_symlink(tree: Path) -> None:
    link = tree.parent / "base-link"
    link.symlink_to(tree, target_is_directory=True)
    assert resolve_inside(link, "sub/w.data") == (tree / "sub" / "w.data").resolve()
    assert refused(link, "../outside/secret").rule == "parent"


# ---------------------------------------------------------------- model_dir

def test_model_dir_is_the_directory_the_path_names_not_the_link_target(tree: Path) -> None:
    """ORT resolves locations beside the path it was given: a symlinked model reads data beside the link."""
    real = tree.parent / "outside" / "real.onnx"
    real.write_bytes(b"")
    (tree / "m.onnx").symlink_to(real)
    assert model_dir(tree / "m.onnx") == tree.resolve()
    assert resolve_inside(model_dir(tree / "m.onnx"), "m.data") == tree.resolve() / "m.data"


def test_model_dir_of_a_bare_name(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tree)
    assert model_dir(Path("m.onnx")) == tree.resolve()


# ---------------------------------------------------------------- is_plain_name

@pytest.mark.parametrize("name, plain", [
    ("m_ctx.onnx", True), ("m_ctx.onnx.data.1", True), ("ñ☃.bin", True), (" x", True), ("x" * NAME_MAX, True),
    ("", False), (".", False), ("..", False), ("a/b", False), ("a\\b", False), ("/x", False), ("C:x", False),
    ("x\0", False), ("x" * (NAME_MAX + 1), False), ("\udcff", False), (None, False), (b"x", False),
])
def test_is_plain_name(name: object, plain: bool) -> None:
    assert is_plain_name(name) is plain  # type: ignore[arg-type]


def test_is_plain_name_never_touches_the_filesystem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain name is plain whatever exists: even a symlink loop of that name in the working directory."""
    (tmp_path / "loop").symlink_to("loop")
    monkeypatch.chdir(tmp_path)
    assert is_plain_name("loop")


def test_importing_paths_loads_no_onnx() -> None:
    """paths is used on the CLI's fast path (--if-changed), which must not pay for onnx or onnxruntime."""
    code = "import sys, ortcompile.paths; print(sorted(m for m in sys.modules if m.split('.')[0] in ('onnx', 'onnxruntime', 'numpy')))"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------- hostile names: only UnsafePath, only inside

_BASE = Path(tempfile.mkdtemp(prefix="ortcompile-paths-"))
(_BASE / "in").mkdir()
(_BASE / "in" / "loop").symlink_to("loop")
(_BASE / "in" / "up").symlink_to("..", target_is_directory=True)
(_BASE / "in" / "f").write_bytes(b"")

NAMES = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="./\\:C\0ab", max_size=12),
    st.lists(st.sampled_from(["..", ".", "a", "loop", "up", "f", "", "C:", "\\"]), max_size=6).map("/".join),
    st.binary(max_size=20),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=NAMES, plain=st.booleans())
def test_any_name_is_either_inside_or_refused(name: str | bytes, plain: bool) -> None:
    base = _BASE / "in"
    try:
        resolved = resolve_inside(base, name, plain=plain)
    except UnsafePath as error:
        assert "\n" not in str(error) and error.rule
        return
    assert resolved.is_relative_to(base.resolve()) and resolved != base.resolve()
    if plain:
        assert is_plain_name(name if isinstance(name, str) else name.decode())
