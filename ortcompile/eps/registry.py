"""Registering EP libraries with ONNX Runtime and choosing a device and target: the module that loads plugins.

A name (``qnn``, ``nvtrtrtx``, ``OpenVINOExecutionProvider``) maps to an EpInfo (catalog.py, discovery.py);
its package gives the shared library, registered once per process under the EP's name (and under
``<EP name>.virtual`` when a virtual device is the target); ONNX Runtime then lists the devices the EP
claims. `resolve` returns a ResolvedEp ready to configure session options.

A library given by path (--ep-library) is first loaded in a child process (validate.probe_library): a file that
is not a working plugin (a truncated ELF kills the loading process with SIGBUS) becomes a one-line error here
instead of killing ortcompile, or an application calling load_session. Packaged plugins are loaded directly.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import warnings
from dataclasses import dataclass
from typing import Any

from ortcompile import ortmarkers, worker
from ortcompile.eps import diagnose
from ortcompile.eps.catalog import CPU_EP, EpInfo, check_option_keys
from ortcompile.eps.discovery import add_library_ep, all_eps, choose_ep, is_installed, lookup
from ortcompile.eps.resolved import ResolvedEp
from ortcompile.eps.targets import Target, apply_target, default_target, describe_device, device_matches, device_targets, find_target, static_targets
from ortcompile.eps.validate import probe_library, validate_options
from ortcompile.errors import ComponentMissing, EpUnavailable, OrtCompileWarning, UsageError, first_line
from ortcompile.jsonedge import JsonObject
from ortcompile.native import apply_ort_log_level, native_stdout_to_stderr

VIRTUAL_SUFFIX = ".virtual"
EXTRAS = ("qnn", "openvino", "webgpu", "nvtensorrtrtx")  # pyproject optional-dependencies named after the EP
_REGISTERED: set[str] = set()  # registration names this process registered
_PROBED: set[str] = set()  # library paths a child process loaded without crashing


def _import_plugin(info: EpInfo) -> Any:
    try:
        return importlib.import_module(info.module or "")
    except ImportError as exc:
        extra = f" (or 'pip install ortcompile[{info.short_name}]')" if info.short_name in EXTRAS else ""
        raise EpUnavailable(f"{info.short_name}: package {info.pip_name} is not installed; install it with "
                            f"'pip install {info.pip_name}'{extra}", detail=str(exc)) from exc


def register(info: EpInfo, virtual: bool = False) -> Any:
    """Import the plugin package (if any) and register its library (once per process); returns the module."""
    import onnxruntime as ort

    apply_ort_log_level()
    if info.ep_name == CPU_EP:
        return None
    module = _import_plugin(info) if info.library is None else None
    name = info.ep_name + (VIRTUAL_SUFFIX if virtual else "")
    if name in _REGISTERED or (not virtual and any(d.ep_name == info.ep_name and not _is_virtual(d) for d in ort.get_ep_devices())):
        return module  # registered already (by us, or by the application: tests register QNN themselves)
    if module is not None:
        mismatch = diagnose.cuda_mismatch(info, info.distribution, diagnose.cuda_driver_version()) if info.cuda_major else None
        if mismatch:
            raise ComponentMissing(mismatch)
    if info.library is not None and not worker.crash_contained and info.library not in _PROBED:
        probe_library(info)  # raises when loading it fails or kills the child
        _PROBED.add(info.library)
    try:
        path = info.library or module.get_library_path()
        with native_stdout_to_stderr(quiet_stderr=True):
            ort.register_execution_provider_library(name, path)
    except Exception as exc:  # ORT raises its own Fail/RuntimeError types; packages raise FileNotFoundError
        text = str(exc)
        if ortmarkers.ALREADY_REGISTERED in text:
            _REGISTERED.add(name)
            return module
        hint = diagnose.explain_missing(info, text, "load the EP")
        if hint:
            raise ComponentMissing(hint, detail=text) from exc
        raise EpUnavailable(f"{info.short_name}: could not load {info.library or info.distribution}: {first_line(exc)}", detail=text) from exc
    _REGISTERED.add(name)
    if info.library is not None:
        add_library_ep(info)
    return module


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


def resolve(name: str = "auto", options: dict[str, str] | None = None, target: str | None = None, library: str | None = None,
            validate: bool = False) -> ResolvedEp:
    """Find, register and pick a device and target for an EP; with `validate` (compiles do), check the options
    with the EP itself (validate.py: in a child process, on a one-node model).

    Raises UsageError (bad name, target or option value: exit 2), EpUnavailable (not installed, no device:
    exit 2) or ComponentMissing (a driver or device compiler missing: exit 1). Warnings (options that do
    nothing, undocumented keys) go through `warnings.warn` as OrtCompileWarning and stay in `.warnings`.
    """
    apply_ort_log_level()  # the first use of onnxruntime in every command that needs it
    options = dict(options or {})
    choice = choose_ep(name, library)
    if choice.named is not None:
        return _resolve_one(choice.named, options, target, validate)
    return _resolve_auto(choice.candidates, options, target, validate)


def _resolve_auto(candidates: tuple[EpInfo, ...], options: dict[str, str], target: str | None, validate: bool) -> ResolvedEp:
    refusals = []
    for info in candidates:
        try:
            return _resolve_one(info, options, target, validate)
        except EpUnavailable:
            continue
        except UsageError as exc:  # a target name another EP may own
            if target is None:
                raise
            refusals.append(exc.message)
    raise UsageError(f"no available execution provider has target {target!r}; " + "; ".join(refusals) if refusals
                     else "no execution provider is available")


def _choose_target(info: EpInfo, target: str | None) -> tuple[Target | None, bool]:
    """(target, virtual) before devices are known: option targets and the default need no device listing."""
    if info.target_kind == "option":
        return (find_target(target, static_targets(info), info) if target else default_target(info)), False
    if target is None:
        return None, False
    targets = list_device_targets(info)
    chosen = find_target(target, targets, info)
    return chosen, chosen.virtual


def _resolve_one(info: EpInfo, options: dict[str, str], target: str | None, validate: bool) -> ResolvedEp:
    notes = check_option_keys(info, options)
    for first, second in info.exclusive:
        if first in options and second in options:
            raise UsageError(f"{info.short_name}: --ep-option {first} and {second} choose the same thing; give only one "
                             f"({first} is enough: ortcompile then leaves out its own {second})")
    if info.cuda_major and (twice := diagnose.installed_twice(info)):
        notes.append(twice)
    chosen, virtual = _choose_target(info, target)
    module = register(info)
    if virtual:
        register(info, virtual=True)
    devices = devices_of(info, virtual)
    if chosen is not None and chosen.match:
        devices = [d for d in devices if device_matches(d, chosen)]
    if not devices:
        raise EpUnavailable(f"{info.short_name}: {info.ep_name} is installed but claims no device on this machine; {_no_device_hint(info)}")
    if chosen is None and info.target_kind == "device" and info.ep_name != CPU_EP:
        chosen = device_targets(info, devices[:1])[0]  # the device used, recorded as the (default) target
    required = info.required_options(module)
    for user_key, injected in info.replaces:
        if user_key in options:
            required.pop(injected, None)
    defaults = {**info.required_options(module), **(chosen.option_dict if chosen else {})}
    merged, overridden = apply_target(chosen, options, explicit=target is not None)
    if overridden and target is None:
        chosen = None  # the user chose their own target with --ep-option
    elif overridden:
        notes.append(f"{info.short_name}: --ep-option {', '.join(f'{k}={options[k]}' for k in overridden)} overrides "
                     f"--target {chosen.name if chosen else target}")
    resolved = ResolvedEp(info, devices[:1], {**required, **merged}, version_of(info, devices), chosen, tuple(overridden), defaults=defaults)
    if validate and (options or target is not None):
        notes.extend(validate_options(resolved, options, explicit_target=target is not None))
    for note in notes:
        warnings.warn(note, OrtCompileWarning, stacklevel=3)
    resolved.warnings = notes
    return resolved


def _no_device_hint(info: EpInfo) -> str:
    if info.library is not None:
        import onnxruntime as ort

        names = sorted({d.ep_name for d in ort.get_ep_devices() if dict(d.ep_metadata).get("library_path") == info.library} - {info.ep_name})
        if names:
            return f"the library registers {', '.join(names)}: use --ep {names[0]}"
    if info.short_name == "webgpu" and not os.environ.get("ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER"):
        return "without a GPU, set ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 to use a software (Vulkan) adapter"
    if info.short_name == "nvtensorrtrtx":
        return "it offers a device only for an NVIDIA RTX GPU (sm86, sm89, sm120, sm121), also to cross-compile with --target"
    return "run 'ortcompile eps --targets' to see what is available"


def list_device_targets(info: EpInfo) -> list[Target]:
    """Real devices here, then virtual ones (if the EP offers any when registered as <name>.virtual)."""
    register(info)
    real = device_targets(info, devices_of(info))
    try:
        register(info, virtual=True)
    except (EpUnavailable, ComponentMissing):
        return real
    virtual = [t for t in device_targets(info, devices_of(info, virtual=True)) if t.virtual]
    return real + virtual


@dataclass(frozen=True)
class TargetListing:
    ep: EpInfo
    targets: list[Target]
    usable: bool  # the EP can compile here (installed, loads, has a device)
    note: str = ""

    def to_json(self) -> JsonObject:
        return {"ep": self.ep.short_name, "ep_name": self.ep.ep_name, "kind": self.ep.target_kind, "usable": self.usable,
                "note": self.note, "targets": [t.to_json() for t in self.targets]}


def list_targets(name: str | None = None) -> list[TargetListing]:
    """Targets per EP (`ortcompile eps --targets`): option tables always, devices where the EP loads."""
    infos = [lookup(name)] if name else [i for i in all_eps() if i.ep_name and i.ep_name != CPU_EP]
    listings = []
    for info in infos:
        if not is_installed(info):
            listings.append(TargetListing(info, list(static_targets(info)), False, f"not installed: pip install {info.pip_name}"))
            continue
        try:
            if info.target_kind == "option":
                register(info)
                usable = bool(devices_of(info))
                note = "" if usable else f"installed, but claims no device here; {_no_device_hint(info)}"
                listings.append(TargetListing(info, list(static_targets(info)), usable, note))
            else:
                targets = list_device_targets(info)
                usable = any(not t.virtual for t in targets) or (info.compiles and bool(targets))
                listings.append(TargetListing(info, targets, usable, "" if usable else f"no device here; {_no_device_hint(info)}"))
        except (EpUnavailable, ComponentMissing) as exc:
            listings.append(TargetListing(info, list(static_targets(info)), False, exc.message))
    return listings


@dataclass(frozen=True)
class ListedDevice:
    """A device as `ortcompile eps` lists it."""

    type: str
    vendor: str
    vendor_id: str

    def to_json(self) -> JsonObject:
        return {"type": self.type, "vendor": self.vendor, "vendor_id": self.vendor_id}


@dataclass(frozen=True)
class EpListing:
    short_name: str
    ep_name: str
    package: str
    installed: bool
    version: str | None
    devices: list[ListedDevice]
    compiles: bool
    note: str = ""
    known: bool = True
    aliases: tuple[str, ...] = ()
    precision: str = "fp32"
    static_shapes: bool = False

    def to_json(self) -> JsonObject:
        return {
            "name": self.short_name,
            "ep_name": self.ep_name,
            "package": self.package,
            "installed": self.installed,
            "version": self.version,
            "devices": [d.to_json() for d in self.devices],
            "produces_epcontext": self.compiles,
            "available": self.installed and bool(self.devices),
            "note": self.note,
            "known": self.known,
            "aliases": list(self.aliases),
            "precision": self.precision,
            "static_shapes": self.static_shapes,
        }


def list_eps() -> list[EpListing]:
    """Every known or installed EP: installed or not, the devices it claims here, whether it produces EPContext."""
    apply_ort_log_level()
    listings = []
    for info in all_eps():
        if not info.ep_name:
            continue
        note, devices = (info.note if not info.known else ""), []
        installed = is_installed(info)
        if not installed:
            note = f"not installed: pip install {info.pip_name}"
        else:
            try:
                register(info)
                devices = [_listed_device(d) for d in devices_of(info)]
            except EpUnavailable as exc:
                note = exc.message
            except ComponentMissing as exc:
                note = exc.message
            if not devices and not note:
                note = "installed, but claims no device on this machine"
        version = version_of(info) if installed else None
        listings.append(EpListing(info.short_name, info.ep_name, info.distribution, installed, version, devices, info.compiles, note,
                                  info.known, info.aliases, info.precision, info.static_shapes))
    return listings


def _listed_device(device: Any) -> ListedDevice:
    data = describe_device(device)
    return ListedDevice(data.type, data.vendor, data.vendor_id)
