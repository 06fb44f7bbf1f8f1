"""Does a compiled model fit the devices present? ONNX Runtime asks the EP that compiled it.

ONNX Runtime 1.31 writes ``ep_compatibility_info.<EP name>`` into a compiled model's metadata (one string per
EP, in the EP's own format); ``get_model_compatibility_for_ep_devices`` hands that string back to the EP with
the devices found here. Verdicts: **optimal**, **prefer-recompiling** (runs, but a compile for this device
would be better), **not-supported** (will not run here: recompile, or use the source model), **unknown** (the
EP cannot tell: it does not check, or cannot on this machine; the reason says which).

Reading the info needs only the graph proto (`read_compatibility_info`, for `inspect`); asking the EP loads it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ortcompile import native
from ortcompile.child import answer_parent, run_child
from ortcompile.eps.discovery import lookup
from ortcompile.eps.loading import devices_of
from ortcompile.eps.registry import register
from ortcompile.eps.targets import QNN_TARGETS, DeviceInfo, describe_device
from ortcompile.errors import ComponentMissing, InvalidModel, UsageError, first_line
from ortcompile.jsonedge import JsonObject
from ortcompile.onnxfacts import epcontext_attrs, epcontext_nodes

METADATA_PREFIX = "ep_compatibility_info."
VERDICTS = {
    "EP_SUPPORTED_OPTIMAL": "optimal",
    "EP_SUPPORTED_PREFER_RECOMPILATION": "prefer-recompiling",
    "EP_UNSUPPORTED": "not-supported",
    "EP_NOT_APPLICABLE": "unknown",
}
_ORDER = ("optimal", "prefer-recompiling", "unknown", "not-supported")  # overall verdict: the worst EP's


@dataclass(frozen=True)
class EpCompatibility:
    ep_name: str
    info: str | None  # the raw string the EP wrote at compile time
    verdict: str
    reason: str = ""
    devices: tuple[DeviceInfo, ...] = ()
    decoded: JsonObject | None = None  # decode_info's fields (OpenVINO's info is its own JSON, free-form)

    def to_json(self) -> JsonObject:
        return {"ep_name": self.ep_name, "verdict": self.verdict, "reason": self.reason, "compatibility_info": self.info,
                "decoded": self.decoded, "devices": [d.to_json() for d in self.devices]}

    def to_answer(self) -> JsonObject:
        """The child's answer to the parent (one JSON line), read back by from_answer."""
        return {**self.__dict__, "devices": [d.to_json() for d in self.devices]}

    @classmethod
    def from_answer(cls, answer: JsonObject) -> EpCompatibility:
        return cls(**{**answer, "devices": tuple(DeviceInfo(**d) for d in answer["devices"])})


@dataclass(frozen=True)
class CompatibilityReport:
    model: str
    eps: list[EpCompatibility]
    epcontext_nodes: int

    @property
    def verdict(self) -> str:
        if not self.eps:
            return "optimal"  # nothing compiled for an EP: runs wherever onnxruntime does
        return max((e.verdict for e in self.eps), key=_ORDER.index)

    @property
    def usable(self) -> bool:
        return self.verdict in ("optimal", "prefer-recompiling")

    def to_json(self) -> JsonObject:
        return {"model": self.model, "verdict": self.verdict, "usable": self.usable, "epcontext_nodes": self.epcontext_nodes,
                "eps": [e.to_json() for e in self.eps]}


def read_compatibility_info(model: str | Path) -> tuple[dict[str, str], dict[str, int]]:
    """(EP name → compatibility string, EP name → EPContext nodes) from the graph proto; weights are not read."""
    import onnx

    try:
        proto = onnx.load(str(model), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, OSError, ...
        raise InvalidModel(f"{model}: cannot read the model: {first_line(exc)}") from exc
    infos = {p.key[len(METADATA_PREFIX):]: p.value for p in proto.metadata_props if p.key.startswith(METADATA_PREFIX)}
    nodes: dict[str, int] = {}
    for node in epcontext_nodes(proto):
        if node.domain == "com.microsoft":
            source = epcontext_attrs(node).source or "unknown"
            nodes[source] = nodes.get(source, 0) + 1
    return infos, nodes


def decode_info(ep_name: str, info: str) -> JsonObject | None:
    """Human-readable fields of the formats we know (QNN's v2 string, OpenVINO's JSON); None otherwise."""
    if ep_name == "QNNExecutionProvider" and info.startswith("v2:"):
        parts = info.split(":")  # v2:<backend id>:<QNN SDK>:<backend API>:<htp archs>:<soc models>:<vtcm MBs>:<user driver>
        if len(parts) == 8:
            socs = [int(s) for s in parts[5].split(",") if s.isdigit()]
            names = [next((t.name for t in QNN_TARGETS if t.option_dict.get("soc_model") == str(s)), None) for s in socs]
            return {"format": "qnn-v2", "backend_id": parts[1], "qnn_sdk": parts[2], "backend_api": parts[3],
                    "htp_arch": parts[4], "soc_model": parts[5], "vtcm_mb": parts[6], "htp_user_driver": parts[7] == "1",
                    "targets": [n for n in names if n]}
    if info.startswith("{"):
        try:
            data = json.loads(info)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None
    return None


def check_compatibility(model: str | Path, isolate: bool = True, fork: bool = False) -> CompatibilityReport:
    """Ask each EP that compiled part of `model` whether it fits the (real) devices present here.

    With `isolate` (the default) each EP is asked in a child process: QNN's check segfaults in a process
    that has already compiled with it (onnxruntime-qnn 2.7.0), and a crash must not take the caller down.
    `fork`: the child may be a fork of this process (child.run_child), for a caller whose EP work ran in children
    (the compile driver): ~5 ms of CPU instead of ~0.2 s for a fresh interpreter that imports onnxruntime.
    """
    infos, nodes = read_compatibility_info(model)
    entries = []
    for ep_name in sorted(set(infos) | {n for n in nodes if n != "unknown"}):
        info = infos.get(ep_name)
        decoded = decode_info(ep_name, info) if info else None
        if info is None:
            entries.append(EpCompatibility(ep_name, None, "unknown", "the model records no compatibility info for this EP "
                                           "(compiled by an older onnxruntime or an EP that writes none)"))
            continue
        entries.append(_ask_in_child(ep_name, info, decoded, fork) if isolate else _ask(ep_name, info, decoded))
    if "unknown" in nodes and not entries:
        entries.append(EpCompatibility("unknown", None, "unknown", "EPContext nodes name no source EP"))
    return CompatibilityReport(str(model), entries, sum(nodes.values()))


_MARK = "ortcompile-compat: "


def _ask_in_child(ep_name: str, info: str, decoded: JsonObject | None, fork: bool = False, timeout: float = 300) -> EpCompatibility:
    run = run_child("ortcompile.eps.compat:_child_main", {"ep": ep_name, "info": info}, _MARK, timeout, fork=fork)
    if run.answer is not None:
        return EpCompatibility.from_answer(run.answer)
    if run.returncode is None:
        why = f"{ep_name} did not answer within {timeout:.0f} s"
    elif run.killed_by_signal:
        why = f"{ep_name} crashed while checking ({run.crash})"
    else:
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        why = f"{ep_name} could not check: {lines[-1] if lines else f'exit code {run.returncode}'}"
    return EpCompatibility(ep_name, info, "unknown", why, decoded=decoded)


def _child_main() -> None:
    """Child side of _ask_in_child: one JSON line on stdout."""
    spec = json.loads(sys.argv[1])
    entry = _ask(spec["ep"], spec["info"], decode_info(spec["ep"], spec["info"]))
    answer_parent(_MARK, entry.to_answer())


def _ask(ep_name: str, info: str, decoded: JsonObject | None) -> EpCompatibility:
    from onnxruntime.capi import _pybind_state as binding

    try:
        ep = lookup(ep_name)
        register(ep)
    except UsageError as exc:
        return EpCompatibility(ep_name, info, "not-supported", f"the EP is not available here: {exc.message}", decoded=decoded)
    except ComponentMissing as exc:
        return EpCompatibility(ep_name, info, "not-supported", exc.message, decoded=decoded)
    devices = devices_of(ep)
    described = tuple(describe_device(d) for d in devices)
    if not devices:
        return EpCompatibility(ep_name, info, "not-supported", f"{ep_name} claims no device on this machine", decoded=decoded)
    try:
        with native.captured_native_output():
            result = binding.get_model_compatibility_for_ep_devices(devices, info)
    except Exception as exc:  # the EP cannot judge on these devices (QNN on x86_64: only NPU devices)
        return EpCompatibility(ep_name, info, "unknown", f"{ep_name} could not check: {first_line(exc)}", described, decoded)
    verdict = VERDICTS.get(result.name, "unknown")
    reason = {"optimal": "compiled for these devices",
              "prefer-recompiling": "runs here, but recompiling for these devices would be better",
              "not-supported": f"{ep_name} cannot run this compiled model on these devices: recompile it here, or ship the source model",
              "unknown": f"{ep_name} does not judge compatibility ({result.name})"}[verdict]
    return EpCompatibility(ep_name, info, verdict, reason, described, decoded)
