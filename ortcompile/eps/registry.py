"""The EPs this process can use: `resolve` (an EP by name, ready to configure sessions), `register`, and the
listings of `ortcompile eps` (`list_eps`) and `ortcompile eps --targets` (`list_targets`).

`resolve` reads what --ep names (discovery.choose_ep) and hands it to the pipeline of resolution.py (what is asked,
the library loaded, the target matched, the options checked). A library given by path (--ep-library) is first
loaded in a child process (validate.probe_library): a file that is not a working plugin (a truncated ELF kills the
loading process with SIGBUS) becomes a one-line error here instead of killing ortcompile, or an application calling
load_session. Packaged plugins are loaded directly (loading.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ortcompile.eps.catalog import CPU_EP, EpInfo
from ortcompile.eps.diagnose import no_device_hint
from ortcompile.eps.discovery import all_eps, choose_ep, is_installed, lookup
from ortcompile.eps.loading import devices_of, register_library, version_of
from ortcompile.eps.resolution import resolve_choice
from ortcompile.eps.resolved import ResolvedEp
from ortcompile.eps.targets import Target, describe_device, device_targets, static_targets
from ortcompile.eps.validate import probe_library
from ortcompile.errors import ComponentMissing, EpUnavailable
from ortcompile.jsonedge import JsonObject
from ortcompile.native import apply_ort_log_level


def resolve(name: str = "auto", options: dict[str, str] | None = None, target: str | None = None, library: str | None = None,
            validate: bool = False) -> ResolvedEp:
    """Find, register and pick a device and target for an EP; with `validate` (compiles do), check the options
    with the EP itself (validate.py: in a child process, on a one-node model).

    Raises UsageError (bad name, target or option value: exit 2), EpUnavailable (not installed, no device:
    exit 2) or ComponentMissing (a driver or device compiler missing: exit 1). Warnings (options that do
    nothing, undocumented keys) go through `warnings.warn` as OrtCompileWarning and stay in `.warnings`.
    """
    apply_ort_log_level()  # the first use of onnxruntime in every command that needs it
    choice = choose_ep(name, library)
    return resolve_choice(choice, dict(options or {}), target, validate)


def register(info: EpInfo, virtual: bool = False) -> Any:
    """Import the plugin package (if any) and register its library (once per process; a library given by path is
    loaded in a child first); returns the module."""
    probe_library(info)
    return register_library(info, virtual)


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
                note = "" if usable else f"installed, but claims no device here; {no_device_hint(info)}"
                listings.append(TargetListing(info, list(static_targets(info)), usable, note))
            else:
                targets = list_device_targets(info)
                usable = any(not t.virtual for t in targets) or (info.compiles and bool(targets))
                listings.append(TargetListing(info, targets, usable, "" if usable else f"no device here; {no_device_hint(info)}"))
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
