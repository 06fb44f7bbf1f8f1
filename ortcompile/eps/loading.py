"""Loading EP plugins into ONNX Runtime: registering their libraries (once per process) and listing the devices
they claim. The one module that registers a library.

A name maps to an EpInfo (catalog.py, discovery.py); its package gives the shared library, registered under the
EP's name (and under ``<EP name>.virtual`` when a virtual device is the target); ONNX Runtime then lists the
devices the EP claims. A library given by path (--ep-library) is loaded in a child process first
(validate.probe_library: a file that is not a working plugin kills the process that loads it); once it loaded
here, its EP is remembered (libraries.py), so lookups by its names find it. A package built for a newer CUDA
than the driver supports is refused before it is loaded.

`load` is the resolve pipeline's loading stage: from what is asked (ask.EpAsk) to the devices listed
(`Loaded`), with the reasons a failure to load is told (diagnose.py) worked out once, at its end.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
from dataclasses import dataclass, field
from typing import Any

from ortcompile import ortmarkers
from ortcompile.eps import diagnose
from ortcompile.eps.ask import EpAsk
from ortcompile.eps.catalog import CPU_EP, EpInfo
from ortcompile.eps.libraries import remember
from ortcompile.errors import ComponentMissing, EpUnavailable, OrtCompileError
from ortcompile.native import apply_ort_log_level, native_stdout_to_stderr

VIRTUAL_SUFFIX = ".virtual"
EXTRAS = ("qnn", "openvino", "webgpu", "nvtensorrtrtx")  # pyproject optional-dependencies named after the EP
_REGISTERED: set[str] = set()  # registration names this process registered


@dataclass(frozen=True)
class Loaded:
    """The loading stage's answer: the plugin module, the devices the EP claims (virtual ones listed only where a
    device target is asked for), and what the EP cannot start without; or why it could not be loaded (`failure`: the
    orchestrator keeps it, and matching.match_target raises it once an option target was looked up)."""

    info: EpInfo
    module: Any = None
    devices: list[Any] = field(default_factory=list)  # ort.OrtEpDevice, real ones
    virtual_devices: list[Any] = field(default_factory=list)
    required: dict[str, str] = field(default_factory=dict)  # options the EP cannot start without (QNN: backend_path)
    version: str = "unknown"
    notes: tuple[str, ...] = ()
    no_device_hint: str = ""  # what to do when no device fits
    failure: OrtCompileError | None = None


def load(ask: EpAsk) -> Loaded:
    """Register the EP (and its virtual devices' registration where a device target is asked for), list its devices."""
    info = ask.info
    module, refused, registered = _register(info)  # ImportError / CUDA mismatch raise here; ONNX Runtime's refusal is kept
    virtual = _virtual_devices(info) if ask.lists_virtual and refused is None else []
    devices = devices_of(info) if refused is None else []  # after the virtual registration, as compiles list them
    required = _required_options(info, module)
    version = version_of(info, devices or virtual)
    # diagnose.py last, once: the words for a refused library, a wheel installed twice, what to do without a device
    failure = diagnose.load_failure(info, refused) if refused is not None else None
    twice = diagnose.installed_twice(info) if info.cuda_major else None
    hint = diagnose.no_device_hint(info)
    if failure is not None:
        raise failure from refused
    if registered and info.library is not None:
        remember(info)
    return Loaded(info, module, devices, virtual, required, version, (twice,) if twice else (), hint)


def register_library(info: EpInfo, virtual: bool = False) -> Any:
    """Import the plugin package (if any) and register its library (once per process); returns the module.
    A library given by path is probed in a child first by the caller (registry.register)."""
    module, refused, registered = _register(info, virtual)
    if refused is not None:
        raise diagnose.load_failure(info, refused) from refused
    if registered and info.library is not None:
        remember(info)
    return module


def _register(info: EpInfo, virtual: bool = False) -> tuple[Any, Exception | None, bool]:
    """(module, what ONNX Runtime raised when it refused the library or None, whether this call registered it)."""
    import onnxruntime as ort

    apply_ort_log_level()
    if info.ep_name == CPU_EP:
        return None, None, False
    module = _import_plugin(info) if info.library is None else None
    name = info.ep_name + (VIRTUAL_SUFFIX if virtual else "")
    if name in _REGISTERED or (not virtual and any(d.ep_name == info.ep_name and not _is_virtual(d) for d in ort.get_ep_devices())):
        return module, None, False  # registered already (by us, or by the application: tests register QNN themselves)
    mismatch = cuda_mismatch(info, info.distribution, cuda_driver_version()) if module is not None and info.cuda_major else None
    if mismatch:
        raise ComponentMissing(mismatch)
    try:
        path = info.library or module.get_library_path()
        with native_stdout_to_stderr(quiet_stderr=True):
            ort.register_execution_provider_library(name, path)
    except Exception as exc:  # ORT raises its own Fail/RuntimeError types; packages raise FileNotFoundError
        if ortmarkers.ALREADY_REGISTERED not in str(exc):
            return module, exc, False
        _REGISTERED.add(name)
        return module, None, False
    _REGISTERED.add(name)
    return module, None, True


def _import_plugin(info: EpInfo) -> Any:
    try:
        return importlib.import_module(info.module or "")
    except ImportError as exc:
        extra = f" (or 'pip install ortcompile[{info.short_name}]')" if info.short_name in EXTRAS else ""
        raise EpUnavailable(f"{info.short_name}: package {info.pip_name} is not installed; install it with "
                            f"'pip install {info.pip_name}'{extra}", detail=str(exc)) from exc


def _virtual_devices(info: EpInfo) -> list[Any]:
    """The EP's virtual devices, where it offers any when registered as <name>.virtual (none when that fails)."""
    try:
        refused = _register(info, virtual=True)[1]
    except (EpUnavailable, ComponentMissing):
        return []
    return [] if refused is not None else devices_of(info, virtual=True)


def _required_options(info: EpInfo, module: Any) -> dict[str, str]:
    """Options the EP cannot start without, computed from its package (QNN: backend_path)."""
    if module is None:
        return {}
    return {key: str(getattr(module, func)()) for key, func in info.injected_options if hasattr(module, func)}


def _is_virtual(device: Any) -> bool:
    return dict(device.device.metadata).get("is_virtual") == "1"


def devices_of(info: EpInfo, virtual: bool = False) -> list[Any]:
    """The devices ONNX Runtime lists for this EP (registered already), real or virtual ones."""
    import onnxruntime as ort

    return [d for d in ort.get_ep_devices() if d.ep_name == info.ep_name and _is_virtual(d) == virtual]


def version_of(info: EpInfo, devices: list[Any] | None = None) -> str:
    if info.ep_name == CPU_EP:
        import onnxruntime as ort

        return ort.__version__
    if info.library is not None:
        meta = dict(devices[0].ep_metadata) if devices else {}
        return meta.get("version", "unknown")
    try:
        return importlib.metadata.version(info.distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def cuda_driver_version() -> int | None:
    """The CUDA version the installed NVIDIA driver supports (e.g. 12080), or None without a driver. No stand-in
    library is ever loaded: the driver is only asked for its version when it is really there."""
    for name in ("libcuda.so.1", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        version = ctypes.c_int(0)
        try:
            if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
                return version.value
        except AttributeError:
            return None
    return None


def cuda_mismatch(info: EpInfo, distribution: str, driver_version: int | None) -> str | None:
    """An EP wheel built for a newer CUDA major than the driver supports: what to install instead."""
    major = info.cuda_major.get(distribution)
    if major is None or driver_version is None:
        return None
    driver_major, driver_minor = driver_version // 1000, (driver_version % 1000) // 10
    if major <= driver_major:
        return None
    others = [d for d, m in info.cuda_major.items() if m <= driver_major]
    fix = f"install {others[-1]} instead, or update the NVIDIA driver" if others else "update the NVIDIA driver"
    return (f"{info.short_name}: {distribution} is built for CUDA {major}, but this NVIDIA driver supports CUDA up to "
            f"{driver_major}.{driver_minor}: {fix}")
