"""Checking provider option values with the EP itself, before any compile (issue 15).

Most EPs do not fail on a bad option value: QNN logs "Htp performance mode not valid." as a warning and
carries on with its default; OpenVINO logs "Provider option precision is ignored". So the check creates the
EP with the user's options on a one-node model, with ONNX Runtime's log at WARNING captured from file
descriptor 2, and compares against the same probe without the user's options: log lines that only the
user's options produce are theirs. Lines that say a value is invalid (or an EP that fails to start) become
a UsageError naming the option and quoting the EP on one line; other new lines become warnings. When
several options were given, each is probed alone to find the one the EP refused.

A probe that fails because a library is missing (OpenVINO's NPU compiler, for a virtual NPU target)
becomes ComponentMissing (exit 1) before anything is written.

The same child loads a plugin library given by path before any ortcompile process does (`probe_library`).
Both die with their parent (child.die_with_parent).
"""

from __future__ import annotations

import io
import os
import re
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ortcompile import errors, native, ortmarkers, worker
from ortcompile.child import run_child
from ortcompile.eps import diagnose
from ortcompile.eps.catalog import CPU_EP
from ortcompile.eps.sessionopts import session_options
from ortcompile.errors import CompilationFailed, ComponentMissing, EpUnavailable, UsageError, first_line
from ortcompile.onnxfacts import tiny_static_model

if TYPE_CHECKING:
    from ortcompile.eps.catalog import EpInfo
    from ortcompile.eps.resolved import ResolvedEp

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CACHE: dict[tuple, list[str]] = {}
_PROBED: set[str] = set()  # library paths a child process loaded without crashing


@dataclass(frozen=True)
class LogLine:
    severity: str  # W, E, F
    where: str  # file.cc:line
    func: str
    message: str  # with continuation lines joined
    headline: str = ""  # the record's first line

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.where, self.func, self.headline)

    @property
    def refuses(self) -> bool:
        return self.severity in "EF" or bool(ortmarkers.OPTION_REFUSAL.search(self.message))


@dataclass
class ProbeResult:
    error: str | None  # the exception text, if the probe failed
    lines: list[LogLine]


def parse_log(text: str) -> list[LogLine]:
    """ORT log records at warning and above; a record's continuation lines are joined to it."""
    records: list[LogLine] = []
    for raw in _ANSI.sub("", text).splitlines():
        match = ortmarkers.ORT_LOG_RECORD.search(raw)
        if match:
            if match["sev"] in "WEF":
                message = match["msg"].strip()
                records.append(LogLine(match["sev"], match["where"], match["func"].strip(), message, message))
            else:
                records.append(LogLine("I", "", "", ""))  # a boundary, dropped below
        elif records and raw.strip():
            last = records[-1]
            records[-1] = replace(last, message=f"{last.message} {raw.strip()}".strip())
    return [r for r in records if r.severity != "I"]


def probe(ep: ResolvedEp, options: dict[str, str]) -> ProbeResult:
    """Create the EP with these options and compile the one-node model (what a real compile does first)."""
    import onnxruntime as ort

    model = tiny_static_model().SerializeToString()
    error = None
    with tempfile.TemporaryDirectory(prefix="ortcompile-probe-") as scratch, native.captured_native_output() as log:
        # log severity 2, warnings: where EPs say a value is not valid
        probe_options = session_options(ep, config={"ep.context_file_path": str(Path(scratch) / "probe_ctx.onnx")}, provider_options=options,
                                        log_severity=2)
        flags = ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED if ep.info.compiles else ort.OrtCompileApiFlags.NONE
        try:
            compiler = ort.ModelCompiler(probe_options, model, flags=flags)
            compiler.compile_to_stream(io.BytesIO().write)
        except Exception as exc:  # the EP's reason, whatever its type
            error = str(exc)
    return ProbeResult(error, parse_log(log.getvalue()))


def _new_lines(result: ProbeResult, baseline: ProbeResult | None) -> list[LogLine]:
    seen = {line.key for line in baseline.lines} if baseline else set()
    return [line for line in result.lines if line.key not in seen]


def _refusal(result: ProbeResult, baseline: ProbeResult | None) -> str | None:
    """Why the EP refused: its first new refusing log line, else the exception's message; None if it did not."""
    for line in _new_lines(result, baseline):
        if line.refuses:
            return line.message
    return _ort_message(result.error) if result.error else None


def _ort_message(text: str) -> str:
    """ORT errors read '[ONNXRuntimeError] : 1 : FAIL : <where> <message>', sometimes after a C++ signature."""
    line = next((raw.strip() for raw in text.splitlines() if raw.strip()), text.strip())
    return line.split(" : ")[-1].strip() if " : " in line else first_line(Exception(line))


def validate_options(ep: ResolvedEp, user_options: dict[str, str], explicit_target: bool = False, isolate: bool = True) -> list[str]:
    """Raise UsageError for option values the EP refuses, ComponentMissing for missing libraries; return warnings.

    With `isolate` (the default) the probes run in a child process: an EP that crashes (onnxruntime-ep-webgpu
    0.4.0 aborts compile sessions on a software Vulkan) cannot take the caller down, and the compile that follows starts from
    a fresh EP state (QNN's process-wide counters reach its context binary: the output bytes do not depend on
    whether options were checked).
    """
    info = ep.info
    if info.ep_name == CPU_EP:
        return [f"cpu: --ep-option {k} has no effect: the CPU EP takes no provider options here" for k in user_options]
    found = [f"{info.short_name}: --ep-option {k} has no effect on the compiled model (it applies when a session runs); "
             "pass it to the session that loads the model" for k in user_options if k in info.runtime_only_keys]
    key = (info.ep_name, info.library, tuple(sorted(ep.options.items())), tuple(str(d.device.device_id) for d in ep.devices),
           ep.target.name if ep.target else None)
    if key not in _CACHE:
        user = {k: v for k, v in user_options.items() if k in ep.options}
        _CACHE[key] = _check_in_child(ep, user_options, explicit_target) if isolate else check_options(ep, user, explicit_target)
    return found + _CACHE[key]


MARK = "ortcompile-validate: "


def _check_in_child(ep: ResolvedEp, user_options: dict[str, str], explicit_target: bool) -> list[str]:
    spec = {"ep": ep.info.ep_name, "library": ep.info.library, "options": user_options, "verbose": native._show_native_output,
            "target": ep.target.name if ep.target is not None and explicit_target else None}
    answer, crash, log = _run_child(spec)
    if crash is not None:
        blame = "check the --ep-option values (-v shows its log)"
        if user_options and _run_child({**spec, "options": {}})[1] is not None:
            blame = "even without --ep-option: this EP cannot compile on this machine"
        raise CompilationFailed(f"{ep.info.short_name}: {ep.name} crashed ({crash}) when started on a one-node model; {blame}", detail=log)
    if "error" in answer:
        cls = getattr(errors, answer["error"]["class"], CompilationFailed)
        raise cls(answer["error"]["message"], detail=answer["error"]["detail"])
    return answer["warnings"]


def probe_library(info: EpInfo) -> None:
    """Register `info.library` (a plugin library given by path) in a child process first, once per path (not in a
    worker, whose crash is contained already): EpUnavailable (exit 2) naming the library when loading it kills the
    child (a truncated or damaged file) or fails."""
    if info.library is None or worker.crash_contained or info.library in _PROBED:
        return
    spec = {"probe": "library", "ep": info.ep_name, "library": info.library, "verbose": native._show_native_output}
    answer, crash, log = _run_child(spec)
    if crash is not None:
        raise EpUnavailable(f"--ep-library {info.library}: loading it crashed the process that tried ({crash}): "
                            "not a working EP plugin library (truncated or damaged?)", detail=log)
    if "error" in answer:
        cls = getattr(errors, answer["error"]["class"], EpUnavailable)
        raise cls(answer["error"]["message"], detail=answer["error"]["detail"])
    _PROBED.add(info.library)


def _run_child(spec: dict) -> tuple[dict, str | None, str]:
    """(answer, how it crashed or None, its stderr)."""
    spec = {**spec, "parent": os.getpid()}
    # a fork when this process has only registered EPs: the probe's own compile is what it costs, not a new
    # interpreter importing onnxruntime (~0.2 CPU s on every compile given --target or --ep-option)
    run = run_child("ortcompile.eps.probechild:main", spec, MARK, timeout=600, fork=True)
    if spec["verbose"] and run.stderr:
        sys.stderr.write(run.stderr)
    return run.answer or {}, run.crash, run.stderr


def check_options(ep: ResolvedEp, user: dict[str, str], explicit_target: bool) -> list[str]:
    info = ep.info
    doing = f"compile for target {ep.target.name}" if ep.target is not None and explicit_target else "start"
    # The baseline goes first: after a device it failed to create, QNN's next EP without an explicit
    # soc_model fails too (process-wide backend state), so probing the user's options first could spoil it.
    baseline = probe(ep, ep.defaults) if user else None
    result = probe(ep, ep.options)
    if result.error is None and (baseline is None or baseline.error is not None):
        return []  # starts (an unknown EP may need the user's options to start at all)
    if result.error is not None and (not user or baseline.error is not None):
        text = " ".join([result.error, *(line.message for line in result.lines)])
        missing = diagnose.explain_missing(info, text, doing)
        if missing:
            raise ComponentMissing(missing, detail=result.error)
        with_options = " with these --ep-option values" if user else ""
        raise CompilationFailed(f"{info.short_name}: {info.ep_name} cannot {doing}{with_options}: {_refusal(result, None)}",
                                detail=result.error)
    reason = _refusal(result, baseline)
    if reason is None:
        return [f"{info.short_name}: {info.ep_name} says about --ep-option: {line.message}" for line in _new_lines(result, baseline)]
    missing = diagnose.missing_component(info, " ".join([result.error or "", reason]))
    culprits = list(user)
    if len(user) > 1:
        culprits = [k for k, v in user.items() if _refusal(probe(ep, {**ep.defaults, k: v}), baseline) is not None] or culprits
    named = ", ".join(f"{k}={user[k]}" for k in culprits)
    raise UsageError(f"{info.short_name}: {info.ep_name} refused --ep-option {named}: {missing or reason}", detail=result.error)
