"""The resolve pipeline's targets stage (resolution.py): the target asked for, found among the option targets'
tables or the devices the EP listed (targets.py), the devices that fit it, and the provider options merged:
required, the target's, the user's. Kept out of targets.py: its tables are read on the --help path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ortcompile.eps.ask import EpAsk
from ortcompile.eps.catalog import CPU_EP
from ortcompile.eps.loading import Loaded
from ortcompile.eps.targets import Target, apply_target, default_target, device_matches, device_targets, find_target, static_targets
from ortcompile.errors import EpUnavailable


@dataclass(frozen=True)
class Matched:
    """The targets stage's answer: the target (None: none, or the user chose their own with --ep-option), the
    devices that fit it, the provider options to pass, and those without the user's (`defaults`)."""

    target: Target | None
    devices: list[Any]  # ort.OrtEpDevice
    options: dict[str, str]
    defaults: dict[str, str]
    overridden: tuple[str, ...]  # target options the user replaced with --ep-option
    notes: tuple[str, ...] = ()


def match_target(ask: EpAsk, loaded: Loaded) -> Matched:
    """The target asked for (an option target from the tables, told before a failure to load the EP; a device target
    among the devices listed), the devices that fit it, and the options: required, the target's, the user's."""
    info = ask.info
    chosen = _option_target(ask)
    if loaded.failure is not None:
        raise loaded.failure
    if ask.lists_virtual and ask.target is not None:
        real = device_targets(info, loaded.devices)
        chosen = find_target(ask.target, real + [t for t in device_targets(info, loaded.virtual_devices) if t.virtual], info)
    devices = loaded.virtual_devices if chosen is not None and chosen.virtual else loaded.devices
    if chosen is not None and chosen.match:
        devices = [d for d in devices if device_matches(d, chosen)]
    if not devices:
        raise EpUnavailable(f"{info.short_name}: {info.ep_name} is installed but claims no device on this machine; {loaded.no_device_hint}")
    if chosen is None and info.target_kind == "device" and info.ep_name != CPU_EP:
        chosen = device_targets(info, devices[:1])[0]  # the device used, recorded as the (default) target
    explicit = ask.target is not None
    required = {key: value for key, value in loaded.required.items() if key not in ask.replaced}
    defaults = {**loaded.required, **(chosen.option_dict if chosen else {})}
    merged, overridden = apply_target(chosen, ask.options, explicit)
    notes: tuple[str, ...] = ()
    if overridden and not explicit:
        chosen = None  # the user chose their own target with --ep-option
    elif overridden:
        notes = (f"{info.short_name}: --ep-option {', '.join(f'{k}={ask.options[k]}' for k in overridden)} overrides "
                 f"--target {chosen.name if chosen else ask.target}",)
    return Matched(chosen, devices, {**required, **merged}, defaults, tuple(overridden), notes)


def _option_target(ask: EpAsk) -> Target | None:
    """An option target (QNN's SoCs, TensorRT RTX's SMs): the one named, else the EP's default; None for device EPs."""
    if ask.info.target_kind != "option":
        return None
    return find_target(ask.target, static_targets(ask.info), ask.info) if ask.target else default_target(ask.info)
