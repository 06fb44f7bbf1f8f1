"""What an EP is asked for, as data: `EpRequest` (picklable: a worker child resolves the EP again in its own process)
and the precision its outputs are judged by. Below compile/ and readback/: both plan, check and verify with them."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
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
    judged as quantized."""
    precision = ep.info.precision or "fp32"
    if precision != "fp32" and (op_counts or {}).keys() & QUANTIZED_OPS:
        return "quantized"
    return precision
