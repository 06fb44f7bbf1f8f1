"""Execution-provider discovery and registration: the only module that knows EP names and packages.

A short name (``qnn``) maps to a plugin package, which gives the shared library to register with ONNX
Runtime; ONNX Runtime then lists the devices the EP claims on this machine (``get_ep_devices``).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ortcompile.errors import EpUnavailable, OrtCompileWarning, UsageError, first_line
from ortcompile.native import apply_ort_log_level, native_stdout_to_stderr

if TYPE_CHECKING:
    import onnxruntime as ort

CPU_EP = "CPUExecutionProvider"


@dataclass(frozen=True)
class EpInfo:
    """What ortcompile knows about an EP before anything is loaded."""

    short_name: str
    ep_name: str
    compiles: bool  # produces EPContext nodes
    module: str | None = None  # plugin Python package (None: built into onnxruntime)
    pip_name: str | None = None
    required_options: Callable[[Any], dict[str, str]] = field(default=lambda module: {})
    option_keys: frozenset[str] = frozenset()  # documented provider options (empty: not checked)

    @property
    def distribution(self) -> str:
        return self.pip_name or "onnxruntime"


# Provider option keys the QNN EP documents (onnxruntime QNN EP docs). Keys not listed are passed on
# with a warning (a newer EP may know them); a key one typo away from a listed one is an error.
QNN_OPTION_KEYS = frozenset({
    "backend_type", "backend_path", "profiling_level", "profiling_file_path", "rpc_control_latency", "vtcm_mb",
    "htp_performance_mode", "qnn_saver_path", "qnn_context_priority", "htp_graph_finalization_optimization_mode",
    "soc_model", "htp_arch", "device_id", "enable_htp_fp16_precision", "offload_graph_io_quantization",
    "enable_htp_spill_fill_buffer", "enable_htp_shared_memory_allocator", "dump_json_qnn_graph", "json_qnn_graph_dir",
    "op_packages", "skip_qnn_version_check", "enable_vtcm_backup_buffer_sharing", "extended_udma",
})


def check_option_keys(info: EpInfo, options: dict[str, str]) -> list[str]:
    """Refuse likely typos of known provider options; return warnings for keys we do not know."""
    known = info.option_keys
    if not known:
        return []
    warnings = []
    for key in options:
        if key in known:
            continue
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.8)
        if close:
            raise UsageError(f"unknown --ep-option {key!r} for {info.short_name}; did you mean {close[0]!r}?")
        warnings.append(f"{info.short_name}: --ep-option {key!r} is not a documented {info.ep_name} option; passing it on")
    return warnings


def _qnn_options(module: Any) -> dict[str, str]:
    # Without backend_path the QNN EP fails at session creation; HTP is the NPU backend.
    return {"backend_path": module.get_qnn_htp_path()}


KNOWN_EPS: dict[str, EpInfo] = {
    "qnn": EpInfo("qnn", "QNNExecutionProvider", True, "onnxruntime_qnn", "onnxruntime-qnn", _qnn_options, QNN_OPTION_KEYS),
    "openvino": EpInfo(
        "openvino", "OpenVINOExecutionProvider", True, "onnxruntime_ep_openvino", "onnxruntime-ep-openvino"
    ),
    "webgpu": EpInfo("webgpu", "WebGpuExecutionProvider", False, "onnxruntime_ep_webgpu", "onnxruntime-ep-webgpu"),
    "cpu": EpInfo("cpu", CPU_EP, False),
}

# `--ep auto` tries these in order and takes the first that claims a device here.
AUTO_ORDER = ("qnn", "openvino", "cpu")


@dataclass
class ResolvedEp:
    """An EP ready to configure a session: its devices and the provider options to pass."""

    info: EpInfo
    devices: list[Any]  # ort.OrtEpDevice
    options: dict[str, str]
    version: str

    @property
    def name(self) -> str:
        return self.info.ep_name

    def configure(self, session_options: ort.SessionOptions) -> None:
        if self.info.ep_name == CPU_EP:
            return  # the CPU EP is always there; adding it explicitly changes nothing
        session_options.add_provider_for_devices(self.devices, self.options)


def lookup(name: str) -> EpInfo:
    """Map a short name or a full ONNX Runtime EP name to what we know about it."""
    key = name.strip()
    if key.lower() in KNOWN_EPS:
        return KNOWN_EPS[key.lower()]
    for info in KNOWN_EPS.values():
        if info.ep_name.lower() == key.lower():
            return info
    known = ", ".join([*KNOWN_EPS, "auto"])
    raise UsageError(f"unknown execution provider {name!r}; use one of: {known}, or a full EP name listed by 'ortcompile eps'")


def parse_ep_options(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Parse repeated KEY=VALUE provider options."""
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"bad --ep-option {pair!r}: expected KEY=VALUE, e.g. htp_performance_mode=burst")
        options[key.strip()] = value.strip()
    return options


def _register_plugin(info: EpInfo) -> Any:
    """Import the plugin package and register its library with ONNX Runtime (once per process)."""
    import onnxruntime as ort

    try:
        module = importlib.import_module(info.module or "")
    except ImportError as exc:
        raise EpUnavailable(
            f"{info.short_name}: package {info.pip_name} is not installed; install it with "
            f"'pip install {info.pip_name}' (or 'pip install ortcompile[{info.short_name}]')",
            detail=str(exc),
        ) from exc
    registered = {d.ep_name for d in ort.get_ep_devices()}
    if info.ep_name not in registered:
        try:
            with native_stdout_to_stderr(quiet_stderr=True):
                ort.register_execution_provider_library(info.ep_name, module.get_library_path())
        except Exception as exc:  # ORT raises its own Fail/RuntimeError types
            raise EpUnavailable(f"{info.short_name}: could not load {info.pip_name}: {first_line(exc)}") from exc
    return module


def _version_of(info: EpInfo) -> str:
    try:
        return importlib.metadata.version(info.distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def resolve(name: str = "auto", options: dict[str, str] | None = None) -> ResolvedEp:
    """Find, register and pick devices for an EP; raise EpUnavailable with what to install."""
    apply_ort_log_level()  # the first use of onnxruntime in every command that needs it
    if name.strip().lower() == "auto":
        return _resolve_auto(options or {})
    return _resolve_one(lookup(name), options or {})


def _resolve_auto(options: dict[str, str]) -> ResolvedEp:
    for short in AUTO_ORDER:
        try:
            return _resolve_one(KNOWN_EPS[short], options)
        except EpUnavailable:
            continue
    raise EpUnavailable("no execution provider is available")  # unreachable: the CPU EP always is


def _resolve_one(info: EpInfo, options: dict[str, str]) -> ResolvedEp:
    import onnxruntime as ort

    module = _register_plugin(info) if info.module else None
    devices = [d for d in ort.get_ep_devices() if d.ep_name == info.ep_name]
    if not devices:
        hint = "run 'ortcompile eps' to see what is available"
        if info.short_name == "webgpu" and not os.environ.get("ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER"):
            hint = "without a GPU, set ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 to use a software (Vulkan) adapter"
        raise EpUnavailable(f"{info.short_name}: {info.ep_name} is installed but claims no device on this machine; {hint}")
    for warning in check_option_keys(info, options):
        warnings.warn(warning, OrtCompileWarning, stacklevel=2)
    merged = {**(info.required_options(module) if module else {}), **options}
    version = ort.__version__ if info.module is None else _version_of(info)
    return ResolvedEp(info=info, devices=devices[:1], options=merged, version=version)


@dataclass(frozen=True)
class EpListing:
    short_name: str
    ep_name: str
    package: str
    installed: bool
    version: str | None
    devices: list[dict[str, str]]
    compiles: bool
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.short_name,
            "ep_name": self.ep_name,
            "package": self.package,
            "installed": self.installed,
            "version": self.version,
            "devices": self.devices,
            "produces_epcontext": self.compiles,
            "available": self.installed and bool(self.devices),
            "note": self.note,
        }


def list_eps() -> list[EpListing]:
    """Every known EP: installed or not, the devices it claims here, whether it produces EPContext."""
    import onnxruntime as ort

    apply_ort_log_level()
    listings = []
    for info in KNOWN_EPS.values():
        note = ""
        installed = True
        try:
            if info.module:
                _register_plugin(info)
        except EpUnavailable as exc:
            installed, note = False, exc.message
        devices = [_describe_device(d) for d in ort.get_ep_devices() if d.ep_name == info.ep_name]
        if installed and not devices:
            note = "installed, but claims no device on this machine"
        version = (ort.__version__ if info.module is None else _version_of(info)) if installed else None
        listings.append(EpListing(info.short_name, info.ep_name, info.distribution, installed, version, devices, info.compiles, note))
    return listings


def _describe_device(device: Any) -> dict[str, str]:
    hw = device.device
    return {"type": hw.type.name, "vendor": device.ep_vendor or hw.vendor, "vendor_id": str(hw.vendor_id)}
