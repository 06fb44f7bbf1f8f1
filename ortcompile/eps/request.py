"""What an EP is asked for, as data: `EpRequest` (picklable: a worker child resolves the EP again in its own process)
and the precision its outputs are judged by. Below compile/ and readback/: both plan, check and verify with them."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ortcompile.eps.registry import resolve

if TYPE_CHECKING:
    from ortcompile.eps.resolved import ResolvedEp

# Ops that mark a quantized model (QDQ format, or integer compute): an NPU runs these in integers.
QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger",
                 "DynamicQuantizeLinear"}


@dataclass(frozen=True)
class EpRequest:
    """What `eps.resolve` needs, picklable: the worker child resolves the EP again in its own process
    (the plan already validated the options, so the child does not ask the EP again)."""

    name: str
    options: dict[str, str] = field(default_factory=dict)
    target: str | None = None
    library: str | None = None

    def resolve(self) -> ResolvedEp:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the plan reported them once
            return resolve(self.name, self.options, target=self.target, library=self.library)


def ep_precision(ep: ResolvedEp, op_counts: Mapping[str, int] | None = None) -> str:
    """The precision the EP computes in, which decides how its outputs are judged: the catalog's, except that a
    quantized (QDQ / integer-op) model (`op_counts`: the source's ops) on an EP that does not compute in fp32 is
    judged as quantized, and OpenVINO's CPU device on a CPU with native bf16 computes in bf16."""
    precision = ep.info.precision or "fp32"
    if precision == "fp32" and computes_in_bf16(ep):
        precision = "bf16"
    if precision != "fp32" and (op_counts or {}).keys() & QUANTIZED_OPS:
        return "quantized"
    return precision


def computes_in_bf16(ep: ResolvedEp) -> bool:
    """OpenVINO's CPU plugin runs float models in bf16 by default where the CPU has it natively (AMX, AVX512_BF16:
    the device lists BF16 among its OPTIMIZATION_CAPABILITIES), unless a `load_config` file asks for f32. Measured
    on a Xeon with AMX: the MLP fixture 51.5 dB from the CPU EP (max abs diff 4.6e-3: every fp32-criterion check
    refused it); with {"CPU": {"INFERENCE_PRECISION_HINT": "f32"}} within the fp32 tolerance."""
    if ep.info.short_name != "openvino" or not ep.devices:
        return False
    metadata = dict(ep.devices[0].ep_metadata)
    if metadata.get("ov_device") != "CPU" or "BF16" not in metadata.get("OPTIMIZATION_CAPABILITIES", "").split():
        return False
    return _cpu_precision_hint(ep.options.get("load_config")) not in ("f32", "FP32")


def _cpu_precision_hint(load_config: str | None) -> str | None:
    """The CPU INFERENCE_PRECISION_HINT an OpenVINO `load_config` JSON file sets (None: none or unreadable, the
    EP then reports its own error)."""
    if not load_config:
        return None
    try:
        hint = json.loads(Path(load_config).read_text()).get("CPU", {}).get("INFERENCE_PRECISION_HINT")
    except (OSError, ValueError, AttributeError):
        return None
    return hint if isinstance(hint, str) else None
