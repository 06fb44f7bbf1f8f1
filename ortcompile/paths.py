"""The one path-safety rule: a name read from a model, a manifest or an EP must stay inside its directory.

Names come from untrusted places (external-data locations, EPContext blob paths, manifest entries, EP
callbacks), so every reader resolves them here. A name that would be unsafe on either POSIX or Windows is
refused on both: the outputs are loaded on Windows too, where `\\` separates and `C:` roots a path.

Imports nothing heavy: the CLI's fast paths (`--if-changed`) use it before onnx is loaded.
"""

from __future__ import annotations

import errno
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Literal

# Linux limits (NAME_MAX, PATH_MAX); longer names fail in open() with ENAMETOOLONG, so refuse them up front.
NAME_MAX = 255
PATH_MAX = 4095
_SHOWN = 100  # characters of a hostile name quoted in a message

Rule = Literal["encoding", "empty", "nul", "absolute", "parent", "too-long", "not-plain", "unresolvable", "outside"]
_Problem = tuple[Rule, str]


class UnsafePath(ValueError):
    """A name that must not be opened: `rule` says which check failed, `reason` says it in words.

    For rule "outside", `resolved` is where the name really leads (callers name it in their own wording).
    """

    def __init__(self, name: str | bytes, rule: Rule, reason: str, resolved: Path | None = None) -> None:
        self.name = name
        self.rule = rule
        self.reason = reason
        self.resolved = resolved
        super().__init__(f"path {shown(name)!r} {reason}")


def shown(name: str | bytes) -> str | bytes:
    """A name cut to a length fit for a one-line message."""
    return name if len(name) <= _SHOWN else name[:_SHOWN] + ("..." if isinstance(name, str) else b"...")


def model_dir(model_path: Path) -> Path:
    """Where a model's relative locations start: the directory its path names (not a symlink target's).

    ONNX Runtime resolves locations from the directory of the path it was given, so a symlinked model
    file reads its data beside the link, not beside the target.
    """
    return Path(model_path).absolute().parent.resolve()


def is_plain_name(name: str) -> bool:
    """A single file-name component, safe on POSIX and Windows (no filesystem access)."""
    return isinstance(name, str) and _static_problem(name, plain=True) is None


def resolve_inside(base: Path, name: str | bytes, *, plain: bool = False) -> Path:
    """`base / name` with symlinks resolved, or UnsafePath when it is not a relative path that stays in `base`.

    `plain=True` also requires one component (a file directly in `base`, as every output file is).
    Bytes (protobuf's answer to a string field that is not UTF-8) are decoded strictly.
    The target need not exist; callers check that, since "missing" and "unsafe" are reported differently.
    """
    text = _decoded(name)
    problem = _static_problem(text, plain)
    if problem:
        raise UnsafePath(name, *problem)
    root = Path(base).resolve()
    try:
        resolved = (root / text).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop: RuntimeError before Python 3.13, OSError from then on
        raise UnsafePath(name, "unresolvable", f"cannot be resolved ({_why(exc)})") from None
    if resolved == root:
        raise UnsafePath(name, "outside", f"resolves to {root} itself, not to a file in it", resolved)
    if not resolved.is_relative_to(root):
        raise UnsafePath(name, "outside", f"resolves outside {root} (to {resolved})", resolved)
    return resolved


def _decoded(name: str | bytes) -> str:
    if isinstance(name, str):
        return name
    try:
        return name.decode("utf-8")
    except UnicodeDecodeError:
        raise UnsafePath(name, "encoding", "is not valid UTF-8") from None


def _static_problem(name: str, plain: bool) -> _Problem | None:
    """The first rule `name` breaks on its own, before the filesystem is asked; None when it breaks none."""
    if not name:
        return "empty", "is empty"
    if "\0" in name:
        return "nul", "contains a NUL byte"
    posix, windows = PurePosixPath(name), PureWindowsPath(name)
    if posix.is_absolute() or windows.drive or windows.root:
        return "absolute", "is absolute (or names a drive)"
    if ".." in posix.parts or ".." in windows.parts:
        return "parent", "has a '..' component"
    if not windows.parts:  # ".", "./", "./.": the directory itself
        return "empty", "names no file (only '.')"
    unfit = _text_problem(name)
    if unfit:
        return unfit
    if plain and not (name == posix.name == windows.name):
        return "not-plain", "is not a plain file name (it has a directory part)"
    return None


def _text_problem(name: str) -> _Problem | None:
    """Names no file can have: not UTF-8 text, or longer than Linux allows."""
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (e.g. os.fsdecode of bytes that are not UTF-8): not text
        return "encoding", "is not valid UTF-8 text"
    if len(encoded) > PATH_MAX:
        return "too-long", f"is too long ({len(encoded)} bytes; at most {PATH_MAX})"
    longest = max(len(part) for part in encoded.replace(b"\\", b"/").split(b"/"))
    if longest > NAME_MAX:
        return "too-long", f"has a component too long for a file name ({longest} bytes; at most {NAME_MAX})"
    return None


def _why(exc: BaseException) -> str:
    if isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP:
        return "symlink loop"
    return f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}"


def not_a_model_file(path: Path) -> str | None:
    """Why `path` cannot be a model file (None when it is a regular file): missing, or a directory (naming the
    models inside, which is what was meant)."""
    if path.is_file():
        return None
    if path.is_dir():
        models = sorted(p.name for p in path.glob("*.onnx") if p.is_file())
        hint = f": give one of its models, e.g. {path / models[0]}" if models else " (it holds no .onnx model)"
        return f"{path} is a directory, not a model{hint}"
    return f"{path}: no such file" if not path.exists() else f"{path}: not a regular file"
