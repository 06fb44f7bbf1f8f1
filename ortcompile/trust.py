"""Whether a file ortcompile found (rather than was given) may have been written by someone other than the user.

A config file found by searching upwards (config.find_config) is read only when nobody else could have put it
there: it and the directories it sits in are owned by the current user or root, and neither is writable by
other users (a directory with the sticky bit, such as /tmp, is fine: others cannot replace a file in it).
Group-writable is fine for a user-private group (the group named after the user, with no other members), the
usual umask-002 setup. The rule follows OpenSSH's for its own files (docs/security.md).

Imports nothing heavy: the CLI's `--if-changed` fast path reads the config.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def why_untrusted(path: Path) -> str | None:
    """Why `path` may not be the user's own file ("owned by uid 1001 (bob)", ...); None when it is."""
    try:
        real = path.resolve(strict=True)
        checks = [(real.stat(), "it is"), *((d.stat(), f"its directory {d} is") for d in dict.fromkeys([path.absolute().parent, real.parent]))]
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop before Python 3.13
        return f"it cannot be examined ({getattr(exc, 'strerror', None) or exc})"
    for info, what in checks:
        problem = _owner_problem(info) or _writable_problem(info)
        if problem:
            return f"{what} {problem}"
    return None


def _owner_problem(info: os.stat_result) -> str | None:
    if info.st_uid in (os.getuid(), 0):
        return None
    return f"owned by {_user_name(info.st_uid)}, not by you or root"


def _writable_problem(info: os.stat_result) -> str | None:
    """Writable by other users: by anyone, or by a group that is not the user's own (sticky directories excepted)."""
    mode = info.st_mode
    if stat.S_ISDIR(mode) and mode & stat.S_ISVTX:
        return None  # others may add entries but not replace the user's
    if mode & stat.S_IWOTH:
        return f"writable by every user (mode {stat.filemode(mode)})"
    if mode & stat.S_IWGRP and not _private_group(info.st_gid):
        return f"writable by group {_group_name(info.st_gid)} (mode {stat.filemode(mode)})"
    return None


def _private_group(gid: int) -> bool:
    """The user-private group: named after the user, with no other members."""
    try:
        import grp
        import pwd

        user = pwd.getpwuid(os.getuid()).pw_name
        group = grp.getgrgid(gid)
    except (ImportError, KeyError):
        return False
    return group.gr_name == user and set(group.gr_mem) <= {user}


def _user_name(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _group_name(gid: int) -> str:
    try:
        import grp

        return grp.getgrgid(gid).gr_name
    except (ImportError, KeyError):
        return str(gid)
