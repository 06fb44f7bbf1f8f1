"""The one session factory: every inference session ortcompile opens (verify, bench, the residency pool,
in-memory artifacts, the pre-publish check) is made here, so none of them can silently run on the CPU.

ONNX Runtime falls back to the CPU EP in two places: when an EP fails to create its session (the session
then lists only the CPU EP) and, in its Python wrapper, when `run()` hits an EP failure (it rebuilds the
session on the CPU EP and runs again). The first is refused by `require_provider`, the second by
`disable_fallback()` on every session: an EP failure is an error with the EP's own message.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortcompile import eps, ortmarkers
from ortcompile.child import answer_parent, run_child
from ortcompile.eps import CPU_EP, ResolvedEp
from ortcompile.eps.sessionopts import session_options
from ortcompile.errors import CompilationFailed, EpUnavailable, InvalidModel, first_line, ort_reason
from ortcompile.native import native_stdout_to_stderr

if TYPE_CHECKING:
    import numpy as np  # annotations only: loading a session needs no numpy here

RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"
# ORT's CPU kernels prepack weights at session creation (MatMul: a second, reshaped copy of each, measured 2.6 GiB
# and 20 s for a 2.4 GB model); without it a session maps aligned external data and loads in 0.05 s at 57 MiB.
LEAN_CONFIG = "session.disable_prepacking"
# Comparison sessions (verify, the pre-publish check, bench's reference) compute int8 MatMul/Conv exactly on every x86
# CPU. By default ORT's u8s8 kernels sum pairs of products with VPMADDUBSW, which saturates at int16 on CPUs without
# VNNI (AVX2, AVX-512 without VNNI): a QDQ MatMul with full-range int8 weights then differs from its exact result
# on an AMD EPYC Rome and not on a Zen 4 (issue 24: SNR 9.7 dB against QNN's exact output). With this entry ORT
# converts the weights to u8 and uses its U8U8 kernel, which cannot saturate: the same numbers on every machine.
EXACT_INT8_CONFIG = {"session.x64quantprecision": "1"}


@dataclass
class TimedSession:
    session: Any  # onnxruntime.InferenceSession
    seconds: float


def open_session(model: Path | bytes, ep: ResolvedEp | None, dims: Mapping[str, int] | None = None, *,
                 config: Mapping[str, str] | None = None, options: Any = None, label: str | None = None,
                 failure: str = "session creation failed", redirect_native: bool = True) -> TimedSession:
    """A session on `ep` (None: the CPU EP); load time measured; no CPU fallback at creation or at run time.

    `redirect_native=False` leaves file descriptors 1 and 2 alone (in an application's process, or when the
    caller captures the EP's log itself)."""
    import onnxruntime as ort

    options = options if options is not None else session_options(ep, dims, config)
    shown = label or (str(model) if isinstance(model, Path) else "the model")
    start = time.perf_counter()
    guard = native_stdout_to_stderr(quiet_stderr=True) if redirect_native else contextlib.nullcontext()
    try:
        with guard:
            session = ort.InferenceSession(str(model) if isinstance(model, Path) else model, options)
    except Exception as exc:
        text = str(exc)
        if ortmarkers.any_in(text, ortmarkers.UNREADABLE_MODEL):
            raise InvalidModel(f"{shown}: cannot load: {ort_reason(text)}", detail=text) from exc
        raise CompilationFailed(f"{shown}: {failure}: {ort_reason(text)}", detail=text) from exc
    seconds = time.perf_counter() - start
    session.disable_fallback()  # an EP failure inside run() must raise, not rerun everything on the CPU
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


def run_session(session: Any, feeds: Mapping[str, np.ndarray], label: str, ep: ResolvedEp | None = None, *,
                redirect_native: bool = True) -> dict[str, np.ndarray]:
    """All outputs by name; an EP failure at run time is a one-line CompilationFailed with the EP's message.
    `redirect_native=False`: the caller holds the redirect (another thread's, see readback/reference.py)."""
    names = [o.name for o in session.get_outputs()]
    guard = native_stdout_to_stderr() if redirect_native else contextlib.nullcontext()
    try:
        with guard:
            values = session.run(names, dict(feeds))
    except Exception as exc:
        who = f"the {ep.info.short_name} EP" if ep is not None and ep.name != CPU_EP else "ONNX Runtime"
        raise CompilationFailed(f"{label}: {who} failed while running it: {ort_reason(exc)}", detail=str(exc)) from exc
    return dict(zip(names, values))


def probe_load(model: Path, ep_name: str, ep_options: dict[str, str], dims: dict[str, int], timeout: float = 600) -> str:
    """Create a session in a child process: '' if it loads, else why not (a crash becomes a message).

    Some EP states kill the process instead of raising (QNN's HTP simulator segfaults on a shared
    EP context), so anything risky is tried where it cannot take the build down.
    """
    run = run_child("ortcompile.run.sessions:_probe_main", {"model": str(model), "ep": ep_name, "ep_options": ep_options, "dims": dims},
                    _MARK, timeout)
    if run.answer is not None:
        return run.answer.get("error", "")
    if run.returncode is None:
        return f"loading did not finish within {timeout:.0f} s"
    if run.killed_by_signal:
        return f"the EP crashed the loading process ({run.crash})"
    lines = [line for line in run.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"loading failed with exit code {run.returncode}"


_MARK = "ortcompile-probe-load: "


def _probe_main() -> None:
    """Child side of probe_load: one JSON line on stdout (the error, if the session could not be created)."""
    spec = json.loads(sys.argv[1])
    try:
        open_session(Path(spec["model"]), eps.resolve(spec["ep"], spec["ep_options"]), spec["dims"])
    except Exception as exc:
        answer_parent(_MARK, {"error": first_line(exc)})
    answer_parent(_MARK, {})
