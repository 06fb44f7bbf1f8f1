"""Execution providers: discovery, registration, targets, option checks, compatibility of compiled models.

The only package that knows EP names and plugin packages. Importing it loads neither onnxruntime nor any
plugin (an up-to-date `--if-changed` check asks `discovery.choose_ep` in milliseconds).

- catalog.py    per-EP knowledge as data; the short-name rule; option-key checks (`ask_for`: what is asked)
- discovery.py  installed plugin packages found by convention, read with `ast`; `lookup`
- targets.py    compile targets: QNN SoCs, TensorRT RTX SMs (options); devices, virtual ones included
- registry.py   `resolve`, `register`, `list_eps`, `list_targets`
- resolution.py resolve's pipeline, a stage per module: ask.py (what is asked) → validate.probe_library →
                loading.py (registering libraries with onnxruntime, listing devices) → matching.py (the target,
                the devices that fit, the options) → validate.validate_options
- libraries.py  EPs registered from a library path in this process, for lookups by name
- validate.py   provider option values checked by the EP itself on a one-node model; a library probed first
- compat.py     `check_compatibility`: does a compiled model fit the devices present
- diagnose.py   one-line explanations when a driver or compiler library is missing
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ortcompile.eps.catalog import (
    AUTO_ORDER,
    CPU_EP,
    KNOWN_EPS,
    PRECISION_TOLERANCE,
    QNN_OPTION_KEYS,
    EpInfo,
    check_option_keys,
    library_options,
    loads_library,
    parse_ep_options,
    recorded_options,
    short_name_for,
)
from ortcompile.eps.discovery import all_eps, check_names, installed_plugins, lookup
from ortcompile.eps.targets import QNN_TARGETS, TRT_RTX_TARGETS, Target, default_target, static_targets

if TYPE_CHECKING:
    from ortcompile.eps.compat import CompatibilityReport, EpCompatibility, check_compatibility, decode_info, read_compatibility_info
    from ortcompile.eps.registry import EpListing, ResolvedEp, TargetListing, list_eps, list_targets, register, resolve
    from ortcompile.eps.validate import validate_options

_LAZY = {  # these import onnxruntime (or onnx) when used, not when ortcompile.eps is imported
    "ResolvedEp": "registry", "EpListing": "registry", "TargetListing": "registry", "resolve": "registry",
    "list_eps": "registry", "list_targets": "registry", "register": "registry",
    "validate_options": "validate",
    "check_compatibility": "compat", "read_compatibility_info": "compat", "decode_info": "compat",
    "CompatibilityReport": "compat", "EpCompatibility": "compat",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"ortcompile.eps.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'ortcompile.eps' has no attribute {name!r}")


__all__ = [
    "AUTO_ORDER", "CPU_EP", "KNOWN_EPS", "PRECISION_TOLERANCE", "QNN_OPTION_KEYS", "QNN_TARGETS", "TRT_RTX_TARGETS",
    "CompatibilityReport", "EpCompatibility", "EpInfo", "EpListing", "ResolvedEp", "Target", "TargetListing",
    "all_eps", "check_compatibility", "check_names", "check_option_keys", "decode_info", "default_target", "installed_plugins",
    "library_options", "loads_library", "recorded_options",
    "list_eps", "list_targets", "lookup", "parse_ep_options", "read_compatibility_info", "register", "resolve",
    "short_name_for", "static_targets", "validate_options",
]
