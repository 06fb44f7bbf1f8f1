"""Creating inference sessions for compiled and source models on a chosen EP, timed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortcompile.eps import CPU_EP, ResolvedEp
from ortcompile.errors import CompilationFailed, EpUnavailable, InvalidModel, first_line
from ortcompile.native import configure_session_logging, native_stdout_to_stderr


@dataclass
class TimedSession:
    session: Any  # onnxruntime.InferenceSession
    seconds: float


def open_timed_session(model: Path, ep: ResolvedEp | None, dims: dict[str, int]) -> TimedSession:
    """A session on `ep` (None: the CPU EP), with symbolic dims pinned; load time measured."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    configure_session_logging(options)
    if ep is not None:
        ep.configure(options)
    for name, value in dims.items():
        options.add_free_dimension_override_by_name(name, value)
    start = time.perf_counter()
    try:
        with native_stdout_to_stderr(quiet_stderr=True):
            session = ort.InferenceSession(str(model), options)
    except Exception as exc:
        text = str(exc)
        if any(marker in text for marker in ("ModelProto", "rotobuf", "No such file", "doesn't exist", "does not exist", "NO_SUCHFILE")):
            raise InvalidModel(f"{model}: cannot load: {first_line(exc)}", detail=text) from exc
        raise CompilationFailed(f"{model}: session creation failed: {first_line(exc)}", detail=text) from exc
    seconds = time.perf_counter() - start
    require_provider(session, ep)
    return TimedSession(session, seconds)


def require_provider(session: Any, ep: ResolvedEp | None) -> None:
    """ORT silently retries on the CPU EP when an EP fails to create its session: refuse that here."""
    if ep is None or ep.name == CPU_EP:
        return
    used = session.get_providers()
    if not used or used[0] != ep.name:
        hint = ""
        if ep.info.short_name == "webgpu":
            hint = "; without a GPU, install Mesa's Vulkan 25.x (mesa-vulkan-drivers from bookworm-backports)"
        raise EpUnavailable(f"{ep.info.short_name}: {ep.name} could not create a session on this machine "
                            f"(ONNX Runtime fell back to {used}){hint}")


def probe_load(model: Path, ep_name: str, ep_options: dict[str, str], dims: dict[str, int], timeout: float = 600) -> str:
    """Create a session in a child process: '' if it loads, else why not (a crash becomes a message).

    Some EP states kill the process instead of raising (QNN's HTP simulator segfaults on a shared
    EP context), so anything risky is tried where it cannot take the build down.
    """
    import json
    import signal
    import subprocess
    import sys

    spec = json.dumps({"model": str(model), "ep": ep_name, "ep_options": ep_options, "dims": dims})
    try:
        child = subprocess.run([sys.executable, "-c", "from ortcompile.run.sessions import _probe_main; _probe_main()", spec],
                               capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"loading did not finish within {timeout:.0f} s"
    if child.returncode == 0:
        return ""
    if child.returncode < 0:
        return f"the EP crashed the loading process ({signal.Signals(-child.returncode).name})"
    lines = [line for line in child.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"loading failed with exit code {child.returncode}"


def _probe_main() -> None:
    """Child side of probe_load."""
    import json
    import os
    import sys

    from ortcompile import eps

    spec = json.loads(sys.argv[1])
    try:
        open_timed_session(Path(spec["model"]), eps.resolve(spec["ep"], spec["ep_options"]), spec["dims"])
    except Exception as exc:  # reported to the parent as the last stderr line
        print(first_line(exc), file=sys.stderr, flush=True)
        os._exit(1)
    os._exit(0)
