"""An EP ready to configure a session: what `eps.resolve` gives (its devices, provider options, target)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ortcompile.eps.catalog import CPU_EP, EpInfo
from ortcompile.eps.targets import Target, describe_device
from ortcompile.jsonedge import JsonObject

if TYPE_CHECKING:
    import onnxruntime as ort


@dataclass
class ResolvedEp:
    """An EP ready to configure a session: its devices, the provider options to pass, the target."""

    info: EpInfo
    devices: list[Any]  # ort.OrtEpDevice
    options: dict[str, str]
    version: str
    target: Target | None = None
    overridden: tuple[str, ...] = ()  # target options the user replaced with --ep-option
    warnings: list[str] = field(default_factory=list)
    defaults: dict[str, str] = field(default_factory=dict)  # the options without the user's: required + target

    @property
    def name(self) -> str:
        return self.info.ep_name

    def configure(self, session_options: ort.SessionOptions, provider_options: Mapping[str, str] | None = None) -> None:
        """Add the EP (its devices; `provider_options`, else its resolved options) to `session_options`."""
        if self.info.ep_name == CPU_EP:
            return  # the CPU EP is always there; adding it explicitly changes nothing
        session_options.add_provider_for_devices(self.devices, dict(self.options if provider_options is None else provider_options))

    def target_record(self) -> JsonObject | None:
        """What the manifest records: the target's name and options, and the device compiled for (JSON: the manifest
        keeps it as written, and inspect and verify read it back from there)."""
        if self.target is None:
            return None
        record: JsonObject = {"name": self.target.name, "default": self.target.default, "virtual": self.target.virtual,
                                  "options": {k: self.options[k] for k, _ in self.target.options if k in self.options}}
        if self.overridden:
            record["overridden_by_ep_option"] = list(self.overridden)
        if self.devices and self.info.ep_name != CPU_EP:
            device = describe_device(self.devices[0])
            record["device"] = {"type": device.type, "vendor": device.vendor, "virtual": device.virtual,
                                **{k: v for k, v in device.ep_metadata.items() if k in ("npu_platform", "ov_device")}}
        return record
