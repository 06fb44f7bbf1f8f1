"""The child side of eps/validate.py: resolve as the parent did and probe, or register a library given by path;
answer with one JSON line on stdout. A crash here kills only this child (the parent names the EP and the options)."""

from __future__ import annotations

import json
import sys
import warnings

from ortcompile import native
from ortcompile.child import answer_parent, die_with_parent
from ortcompile.eps.discovery import library_info
from ortcompile.eps.loading import devices_of
from ortcompile.eps.registry import register, resolve
from ortcompile.eps.validate import MARK, check_options
from ortcompile.errors import OrtCompileError
from ortcompile.worker import mark_crash_contained


def main() -> None:
    """Child side of _check_in_child and probe_library: resolve as the parent did and probe, or register the
    library; answer with one JSON line on stdout."""
    spec = json.loads(sys.argv[1])
    die_with_parent(spec["parent"])
    mark_crash_contained()
    if spec["verbose"]:
        native.set_ort_log_level(True)
    try:
        if spec.get("probe") == "library":
            info = library_info(spec["ep"], spec["library"])
            register(info)
            answer: dict = {"devices": len(devices_of(info))}  # listing them runs the library's factories too
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                resolved = resolve(spec["ep"], spec["options"], target=spec["target"], library=spec["library"])
            user = {k: v for k, v in spec["options"].items() if k in resolved.options}
            answer = {"warnings": check_options(resolved, user, spec["target"] is not None)}
    except OrtCompileError as exc:
        answer = {"error": {"class": type(exc).__name__, "message": exc.message, "detail": exc.detail}}
    answer_parent(MARK, answer)
