"""Which outputs count as "the same" as the reference's, for an EP of a given precision and a given purpose.

Two kinds:

- ``tolerance`` (fp32 EPs, verify): every element within ``numpy.isclose(rtol, atol)``, NaN equals NaN,
  exactly as ``ortcompile verify`` has always compared. An fp32 EP differs from the CPU EP by summation
  order only (QNN HTP on fp32 fixtures: 2.6e-7).
- ``parity`` (fp16 and quantized EPs): the metrics used for accelerator parity.
  An output passes when every element is within a loose elementwise tolerance (``rtol``, ``atol``: the size
  of fp16 rounding for values of order 1 — below it, near-zero outputs cannot be judged at fp16 precision),
  or else when all of these hold over the elements:
  SNR >= ``min_snr_db`` (10·log10(Σref² / Σ(got-ref)²); Qualcomm and MediaTek tools report it, >= 30 dB is
  "good" for fp16), cosine >= ``min_cosine``, PSNR >= ``min_psnr_db`` when set (Qualcomm AI Hub's definition,
  peak = max |ref|; not required by default: on sparse outputs garbage scores high, measured 49 dB for the OCR
  detector fed other inputs), and top-1 agreement >= ``min_top1`` over the *decisive* rows of the last axis
  (rows whose winner beats the runner-up by more than twice the elementwise tolerance, so fp16 rounding
  cannot swap them: near-ties say nothing). Integer, bool and string outputs pass when the fraction of equal
  elements is >= ``min_equal_fraction`` (an argmax over near-ties may flip at fp16).

Defaults below were chosen from QNN HTP (fp16) against the CPU EP on the real-model corpus (OCR detector and
recognizer, captcha CRNN and YOLO, silero VAD x4, a chemistry transformer; random inputs, seeds 0 and 1):

- correct outputs: SNR 34.2 .. 75 dB wherever the elementwise tolerance did not already pass them (min:
  the transformer's attention, seed 1), cosine >= 0.9998, decisive top-1 agreement 1.0 everywhere;
  near-zero outputs (the OCR detector's sigmoid map, max 4.9e-3: SNR -4 .. 11.6 dB, cosine 0.76 .. 0.97;
  one-element VAD probabilities 0.0194 vs 0.0178, 0.0246 vs 0.0220) all within rtol 5e-2 / atol 5e-3;
- wrong outputs (the same model's output for other inputs; shuffled outputs): SNR <= 19 dB except one
  detector whose boxes are dominated by the anchor grid (30.9 dB); shuffled <= 0.5 dB; decisive top-1
  agreement <= 0.22 where the winner depends on the input.

Every threshold is a field: `criterion_for(..., min_snr_db=40)` tightens one, and they are calibrated here.

The pre-publish check (purpose ``check``) judges by the very criterion `verify` uses for the same precision, on the
same seed-0 inputs: a default compile never publishes what a default verify rejects (issue 24: a looser check once
published a QDQ output at 9.7 dB that verify then rejected at its 15 dB). Only the purpose, and so the `why`, differ.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ortcompile.errors import UsageError
from ortcompile.jsonedge import JsonObject

PRECISIONS = ("fp32", "fp16", "bf16", "quantized")
PURPOSES = ("verify", "check")

WHY_PRECISION = {
    "fp32": "the EP computes in fp32: it differs from the CPU EP by summation order only",
    "fp16": "the EP computes in fp16: correct outputs differ from the fp32 CPU reference by fp16 rounding",
    "bf16": "the EP computes in bf16 (OpenVINO's CPU plugin on a CPU with native bf16): correct outputs differ from the "
            "fp32 CPU reference by bf16 rounding, 8x fp16's",
    "quantized": "the EP computes in integers: correct outputs differ from the CPU reference by quantization steps",
}
WHY_PURPOSE = {
    "verify": "release gate",
    "check": "pre-publish check, by verify's criterion: a default compile publishes nothing a default verify rejects",
}


@dataclass(frozen=True)
class Criterion:
    kind: str  # "tolerance" | "parity"
    precision: str  # one of PRECISIONS
    purpose: str  # "verify" | "check"
    rtol: float
    atol: float
    min_snr_db: float | None = None
    min_psnr_db: float | None = None
    min_cosine: float | None = None
    min_top1: float | None = None
    min_equal_fraction: float = 1.0
    why: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("tolerance", "parity"):
            raise UsageError(f"criterion kind {self.kind!r}: expected tolerance or parity")
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise UsageError(f"{name} must be a finite number >= 0, not {value}")
        for name in ("min_cosine", "min_top1", "min_equal_fraction"):
            value = getattr(self, name)
            if value is not None and not -1.0 <= value <= 1.0:
                raise UsageError(f"{name} must be between -1 and 1 (0 and 1 for fractions), not {value}")

    def describe(self) -> str:
        """One line: which criterion applied and why."""
        if self.kind == "tolerance":
            rule = f"tolerance: every element within rtol={self.rtol:g} atol={self.atol:g}"
        else:
            parts = [f"SNR >= {self.min_snr_db:g} dB" if self.min_snr_db is not None else "",
                     f"PSNR >= {self.min_psnr_db:g} dB" if self.min_psnr_db is not None else "",
                     f"cosine >= {self.min_cosine:.10g}" if self.min_cosine is not None else "",
                     f"decisive top-1 agreement >= {self.min_top1:g}" if self.min_top1 is not None else ""]
            rule = (f"parity: every element within rtol={self.rtol:g} atol={self.atol:g}, else {', '.join(p for p in parts if p) or 'nothing more'}; "
                    f"integers equal on >= {self.min_equal_fraction:g} of elements")
        return f"{rule} ({self.precision} {self.purpose}: {self.why or WHY_PRECISION[self.precision]})"

    def to_json(self) -> JsonObject:
        return dataclasses.asdict(self)  # every value is finite or None: RFC 8259


# verify's element-by-element tolerance since ortcompile 0.1: fp32 EPs, release gate.
FP32_VERIFY = Criterion("tolerance", "fp32", "verify", rtol=1e-3, atol=1e-4)
# fp16 EPs (QNN HTP), release gate. Calibrated on the real-model corpus (13 models, 7 input sets each: realistic,
# uniform, normal; 282 correct runs) against 1 KiB byte flips in the QNN blob: correct outputs had SNR >= 26.2 dB
# and cosine >= 0.9988 wherever the elementwise bound did not already pass them (min: silero's LSTM hidden state
# over 64 frames); flipped ones SNR <= 6.9 dB. 20 dB / 0.995 sits between, with +6 dB of margin on the correct side.
FP16_VERIFY = Criterion("parity", "fp16", "verify", rtol=5e-2, atol=5e-3, min_snr_db=20.0, min_cosine=0.995, min_top1=1.0, min_equal_fraction=0.99)
# Quantized EPs (int8/int16 NPUs): not measured here (the corpus's one quantized model keeps its integer ops on the
# CPU EP). Int8 outputs sit a few quantization steps from the CPU's QDQ emulation, below fp16's noise: 15 dB. The
# QDQ MatMul fixture of tests/test_verify_inputs.py on QNN's HTP equals the exact CPU reference bit for bit (with
# run.sessions.EXACT_INT8_CONFIG; without it a CPU lacking VNNI saturates the reference itself, to 9.7 dB).
QUANTIZED_VERIFY = Criterion("parity", "quantized", "verify", rtol=0.1, atol=2e-2, min_snr_db=15.0, min_cosine=0.99, min_top1=0.99, min_equal_fraction=0.95)

# bf16 EPs (OpenVINO's CPU plugin on CPUs with AMX / AVX512_BF16): 3 mantissa bits fewer than fp16, so elementwise
# bounds twice fp16's and quantized's 15 dB / 0.99. Measured (OpenVINO CPU on a Xeon with AMX against the CPU EP, the
# corpus's 7 models, seed 0 and the edge input sets): correct outputs had SNR >= 19.5 dB and cosine >= 0.994 wherever
# the elementwise bound did not pass them (min: the text-direction classifier's 2-class softmax on a gradient).
BF16_VERIFY = Criterion("parity", "bf16", "verify", rtol=0.1, atol=1e-2, min_snr_db=15.0, min_cosine=0.99, min_top1=1.0, min_equal_fraction=0.99)

_VERIFY = (FP32_VERIFY, FP16_VERIFY, BF16_VERIFY, QUANTIZED_VERIFY)
DEFAULTS = {
    **{(c.precision, "verify"): c for c in _VERIFY},
    **{(c.precision, "check"): dataclasses.replace(c, purpose="check") for c in _VERIFY},
}


def criterion_for(precision: str, purpose: str = "verify", **overrides: Any) -> Criterion:
    """The default criterion for an EP's compute precision and a purpose, with fields overridden (None keeps the default)."""
    if precision not in PRECISIONS:
        raise UsageError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    if purpose not in PURPOSES:
        raise UsageError(f"purpose {purpose!r}: expected one of {', '.join(PURPOSES)}")
    fields = {f.name for f in dataclasses.fields(Criterion)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise UsageError(f"unknown criterion setting {unknown[0]!r}")
    base = DEFAULTS[(precision, purpose)]
    why = overrides.pop("why", None) or f"{WHY_PRECISION[precision]}; {WHY_PURPOSE[purpose]}"
    return dataclasses.replace(base, why=why, **{k: v for k, v in overrides.items() if v is not None})
