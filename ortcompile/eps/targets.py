"""Compile targets: what device generation an EP compiles for, including hardware this machine lacks.

Two kinds, chosen per EP in the catalog (`EpInfo.target_kind`):

- **option** targets are provider options. QNN: ``soc_model``/``htp_arch`` (the HTP simulator compiles for
  any of them on x86_64); TensorRT RTX: ``nv_target_sm``. The tables below are data; the QNN ids are
  Qualcomm's ``QNN_SOC_MODEL_*`` values (QAIRT ``QnnTypes.h``), HTP architectures and VTCM sizes from the
  same SoC table ExecuTorch's Qualcomm backend compiles with (``backends/qualcomm/serialization/qc_schema.py``).
- **device** targets are the EP's devices: the real ones ONNX Runtime finds here, and virtual ones an EP
  offers when its library is registered under ``<EP name>.virtual`` (device metadata ``is_virtual=1``;
  OpenVINO: NPU platforms, ep metadata ``npu_platform``).

An explicit ``--ep-option`` wins over a target's option of the same key (`apply_target`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ortcompile.eps.catalog import EpInfo
from ortcompile.errors import UsageError
from ortcompile.jsonedge import JsonObject


@dataclass(frozen=True)
class Target:
    name: str
    ep: str  # short name of the EP
    description: str
    options: tuple[tuple[str, str], ...] = ()  # provider options the target sets (option targets)
    aliases: tuple[str, ...] = ()
    virtual: bool = False  # a device the EP offers only when registered as <name>.virtual
    match: tuple[tuple[str, str], ...] = ()  # device targets: ("type", "NPU"), ("ep:npu_platform", "4000"), ...
    note: str = ""
    default: bool = False

    @property
    def option_dict(self) -> dict[str, str]:
        return dict(self.options)

    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def to_json(self) -> JsonObject:
        return {"name": self.name, "ep": self.ep, "description": self.description, "options": self.option_dict,
                "aliases": list(self.aliases), "virtual": self.virtual, "default": self.default, "note": self.note}


def _qnn(name: str, soc: int, arch: int, vtcm: int, description: str, aliases: tuple[str, ...] = (), note: str = "",
         default: bool = False) -> Target:
    options = [("soc_model", str(soc))]
    if arch:
        options.append(("htp_arch", str(arch)))
    if vtcm:
        options.append(("vtcm_mb", str(vtcm)))
    return Target(name, "qnn", description, tuple(options), aliases, note=note, default=default)



# Measured on the x86_64 HTP simulator of onnxruntime-qnn 2.7.0 with 10 real float models (OCR, captcha, VAD,
# a transformer; dims pinned, ORT BASIC folding): every target compiled all 10 except where a note says
# otherwise; without soc_model 9 of 10 fail (QNN_COMMON_ERROR_MEM_ALLOC), and htp_arch alone does not help.
# The default, X Elite (v73), is the platform the onnxruntime-qnn wheels run on (Windows on Arm); per the QNN
# EP's compatibility rule (qnn_cache_compatibility_manager.cc) a v73 context is "supported, prefer recompiling"
# on later HTP generations.
QNN_TARGETS: tuple[Target, ...] = (
    _qnn("sc8380xp", 60, 73, 0, "Snapdragon X Elite / X Plus (Windows on Arm PCs), HTP v73", ("x-elite", "x-plus", "xelite"),
         default=True),
    _qnn("sm8750", 69, 79, 8, "Snapdragon 8 Elite, HTP v79", ("8-elite", "8elite")),
    _qnn("sm8650", 57, 75, 8, "Snapdragon 8 Gen 3, HTP v75", ("8-gen-3", "8gen3")),
    _qnn("sm8550", 43, 73, 8, "Snapdragon 8 Gen 2, HTP v73", ("8-gen-2", "8gen2")),
    _qnn("sm8475", 42, 69, 8, "Snapdragon 8+ Gen 1, HTP v69", ("8plus-gen-1", "8plusgen1")),
    _qnn("sm8450", 36, 69, 8, "Snapdragon 8 Gen 1, HTP v69", ("8-gen-1", "8gen1")),
    _qnn("sm8850", 87, 81, 8, "Snapdragon 8 Elite Gen 5, HTP v81", ("8-elite-gen-5",)),
    _qnn("qcs9100", 77, 73, 8, "Qualcomm QCS9100 (IoT / automotive), HTP v73"),
    _qnn("qcs8550", 66, 73, 0, "Qualcomm QCS8550 (IoT), HTP v73"),
    _qnn("sa8295", 39, 68, 8, "Snapdragon SA8295P (automotive), HTP v68"),
    _qnn("sc8280x", 37, 68, 0, "Snapdragon 8cx Gen 3 (Windows on Arm PCs), HTP v68", ("8cx-gen-3",),
         note="8 of the 10 float corpus models fail to partition on the simulator"),
    _qnn("sm8350", 30, 68, 4, "Snapdragon 888, HTP v68", ("888",),
         note="9 of the 10 float corpus models fail to finalize on the simulator (QNN_COMMON_ERROR_MEM_ALLOC)"),
)

TRT_RTX_TARGETS: tuple[Target, ...] = tuple(
    Target(sm, "nvtensorrtrtx", description, (("nv_target_sm", sm),), aliases)
    for sm, description, aliases in (
        ("sm86", "NVIDIA Ampere RTX GPUs (GeForce RTX 30xx, RTX A-series)", ("ampere",)),
        ("sm89", "NVIDIA Ada RTX GPUs (GeForce RTX 40xx, RTX Ada)", ("ada",)),
        ("sm120", "NVIDIA Blackwell RTX GPUs (GeForce RTX 50xx, RTX PRO Blackwell)", ("blackwell",)),
        ("sm121", "NVIDIA GB10 (DGX Spark)", ("gb10",)),
    )
)

# OpenVINO NPU platforms as ep metadata `npu_platform` of its virtual devices (names from Intel's and
# Google LiteRT's NPU docs; the others by number only).
OPENVINO_NPU_PLATFORMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "3720": ("Intel NPU 3720: Core Ultra series 1 (Meteor Lake, Arrow Lake)", ("meteor-lake", "mtl")),
    "4000": ("Intel NPU 4000: Core Ultra series 2 (Lunar Lake)", ("lunar-lake", "lnl")),
    "5010": ("Intel NPU 5010: Core Ultra series 3 (Panther Lake)", ("panther-lake", "ptl")),
    "5020": ("Intel NPU 5020 (NPU5 family, one DPU tile)", ()),
    "6010": ("Intel NPU 6010 (NPU6 family)", ()),
}

STATIC_TARGETS: dict[str, tuple[Target, ...]] = {"qnn": QNN_TARGETS, "nvtensorrtrtx": TRT_RTX_TARGETS}


def static_targets(info: EpInfo) -> tuple[Target, ...]:
    """Option targets from the tables above (no onnxruntime needed)."""
    return STATIC_TARGETS.get(info.short_name, ())


def default_target(info: EpInfo) -> Target | None:
    return next((t for t in static_targets(info) if t.default), None)


def find_target(name: str, targets: list[Target] | tuple[Target, ...], info: EpInfo) -> Target:
    """The target called `name` (or an alias), else a usage error listing the valid ones."""
    key = name.strip().lower()
    for target in targets:
        if key in (n.lower() for n in target.names()):
            return target
    valid = ", ".join(t.name for t in targets) or "none on this machine"
    raise UsageError(f"unknown --target {name!r} for {info.short_name}; valid targets: {valid} (see 'ortcompile eps --targets')")


def apply_target(target: Target | None, options: dict[str, str], explicit: bool) -> tuple[dict[str, str], list[str]]:
    """Provider options with the target's added; an explicit --ep-option of the same key wins.

    Returns the options and the keys the user overrode. An implicit (default) target is dropped entirely
    when the user set any of its keys: they chose their own target.
    """
    if target is None or not target.options:
        return dict(options), []
    overridden = [key for key, _ in target.options if key in options]
    if overridden and not explicit:
        return dict(options), overridden
    return {**target.option_dict, **options}, overridden


@dataclass(frozen=True)
class DeviceInfo:
    """An ORT EP device as plain data: type, vendor, ids, virtual or not, and the EP's metadata."""

    type: str  # CPU | GPU | NPU
    vendor: str
    vendor_id: str
    device_id: str
    virtual: bool
    ep_metadata: dict[str, str]  # what the EP says about the device, free-form by contract (library_path left out)

    def to_json(self) -> JsonObject:
        return {"type": self.type, "vendor": self.vendor, "vendor_id": self.vendor_id, "device_id": self.device_id,
                "virtual": self.virtual, "ep_metadata": self.ep_metadata}


def describe_device(device: Any) -> DeviceInfo:
    hw = device.device
    hw_meta = dict(hw.metadata)
    return DeviceInfo(
        type=hw.type.name,
        vendor=device.ep_vendor or hw.vendor,
        vendor_id=str(hw.vendor_id),
        device_id=str(hw.device_id),
        virtual=hw_meta.get("is_virtual") == "1",
        ep_metadata={k: v for k, v in dict(device.ep_metadata).items() if k != "library_path"},
    )


def device_targets(info: EpInfo, devices: list[Any]) -> list[Target]:
    """One target per device: real ones named by type (cpu, gpu, npu; :N when several), virtual NPUs by platform."""
    targets: list[Target] = []
    counts: dict[str, int] = {}
    seen: list[DeviceInfo] = []
    for device in devices:
        data = describe_device(device)
        if data in seen:  # a factory registered later also claims an earlier registration's virtual device
            continue
        seen.append(data)
        kind = data.type.lower()
        meta = data.ep_metadata
        match: list[tuple[str, str]] = [("type", data.type), ("virtual", "1" if data.virtual else "0"),
                                        ("device_id", data.device_id)]
        if data.virtual and "npu_platform" in meta:
            platform = meta["npu_platform"]
            description, aliases = OPENVINO_NPU_PLATFORMS.get(platform, (f"NPU platform {platform}", ()))
            name = f"npu{platform}"
            match.append(("ep:npu_platform", platform))
            targets.append(Target(name, info.short_name, description + " (virtual: cross-compile)", (), aliases, True, tuple(match)))
            continue
        base = f"virtual-{kind}" if data.virtual else kind
        counts[base] = counts.get(base, 0) + 1
        name = base if counts[base] == 1 else f"{base}:{counts[base] - 1}"
        label = f"{data.vendor} {data.type}" + (f" ({meta['ov_device']})" if "ov_device" in meta else "")
        targets.append(Target(name, info.short_name, ("virtual " if data.virtual else "") + label, (), (), data.virtual, tuple(match)))
    if targets and not any(t.virtual for t in targets[:1]):
        first = targets[0]
        targets[0] = Target(first.name, first.ep, first.description, first.options, first.aliases, first.virtual, first.match,
                            first.note, default=True)
    return targets


def device_matches(device: Any, target: Target) -> bool:
    data = describe_device(device)
    for key, value in target.match:
        if key == "type" and data.type != value:
            return False
        if key == "virtual" and ("1" if data.virtual else "0") != value:
            return False
        if key == "device_id" and data.device_id != value:
            return False
        if key.startswith("ep:") and data.ep_metadata.get(key[3:]) != value:
            return False
    return True

