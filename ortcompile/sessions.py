"""Creating inference sessions for compiled and source models on a chosen EP, timed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortcompile.eps import ResolvedEp
from ortcompile.errors import CompilationFailed, InvalidModel, first_line
from ortcompile.native import native_stdout_to_stderr


@dataclass
class TimedSession:
    session: Any  # onnxruntime.InferenceSession
    seconds: float


def open_timed_session(model: Path, ep: ResolvedEp | None, dims: dict[str, int]) -> TimedSession:
    """A session on `ep` (None: the CPU EP), with symbolic dims pinned; load time measured."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if ep is not None:
        ep.configure(options)
    for name, value in dims.items():
        options.add_free_dimension_override_by_name(name, value)
    start = time.perf_counter()
    try:
        with native_stdout_to_stderr():
            session = ort.InferenceSession(str(model), options)
    except Exception as exc:
        text = str(exc)
        if any(marker in text for marker in ("ModelProto", "rotobuf", "No such file", "doesn't exist", "does not exist", "NO_SUCHFILE")):
            raise InvalidModel(f"{model}: cannot load: {first_line(exc)}", detail=text) from exc
        raise CompilationFailed(f"{model}: session creation failed: {first_line(exc)}", detail=text) from exc
    return TimedSession(session, time.perf_counter() - start)
