"""Small float models with the patterns fp16 EPs get wrong (issue 21), and realistic inputs that expose them.

- `log_frontend_model`: an audio-like front end `Log(x*x + 1e-10)`, a min-max normalization and a projection. On
  white noise fp16 is close enough; on tones over silence x*x underflows fp16 and the Log goes to -inf / -16.6.
- `gem_model`: GeM pooling `Pow(x, 3)` -> ReduceMean -> `Pow(1/3)` over a Conv's small activations, then a Gemm.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FRAMES, BINS = 64, 128


def save_model(path: Path, nodes: list[onnx.NodeProto], inputs: list, outputs: list, initializers: list) -> Path:
    model = helper.make_model(helper.make_graph(nodes, path.stem, inputs, outputs, initializers),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def log_frontend_nodes(log_name: str = "log") -> list[onnx.NodeProto]:
    """x -> Log(x*x + eps) -> min-max normalization -> MatMul by proj_w -> y (initializers `eps` and `proj_w`)."""
    return [
        helper.make_node("Mul", ["x", "x"], ["power"], name="square"),
        helper.make_node("Add", ["power", "eps"], ["power_eps"], name="add_eps"),
        helper.make_node("Log", ["power_eps"], ["log_power"], name=log_name),
        helper.make_node("ReduceMin", ["log_power"], ["lo"], name="min", keepdims=1),
        helper.make_node("ReduceMax", ["log_power"], ["hi"], name="max", keepdims=1),
        helper.make_node("Sub", ["log_power", "lo"], ["centered"], name="center"),
        helper.make_node("Sub", ["hi", "lo"], ["span"], name="span"),
        helper.make_node("Div", ["centered", "span"], ["normalized"], name="normalize"),
        helper.make_node("MatMul", ["normalized", "proj_w"], ["y"], name="proj"),
    ]


def log_frontend_model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((BINS, 16)) * 0.1).astype(np.float32), "proj_w")
    eps = numpy_helper.from_array(np.array(1e-10, np.float32), "eps")
    return save_model(path, log_frontend_nodes(), [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, FRAMES, BINS])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, FRAMES, 16])], [weight, eps])


def tones_over_silence(seed: int = 0) -> np.ndarray:
    """Real audio as a spectrogram-like frame stack: quiet tones (amplitude 1e-3..3e-2) over near-silence (1e-5)."""
    rng = np.random.default_rng(seed)
    t = np.arange(BINS, dtype=np.float64)
    frames = []
    for f in range(FRAMES):
        amplitude = 0.0 if f % 4 == 0 else 10 ** rng.uniform(-3, -1.5)
        frames.append(amplitude * np.sin(2 * np.pi * (3 + f % 7) * t / BINS) + 1e-5 * rng.standard_normal(BINS))
    return np.asarray(frames, np.float32)[None]


def gem_model(path: Path) -> Path:
    rng = np.random.default_rng(1)
    conv = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.05).astype(np.float32), "conv_w")
    fc = numpy_helper.from_array((30 * rng.standard_normal((8, 10))).astype(np.float32), "fc_w")
    three = numpy_helper.from_array(np.array(3.0, np.float32), "p")
    third = numpy_helper.from_array(np.array(1.0 / 3.0, np.float32), "inv_p")
    floor = numpy_helper.from_array(np.array(1e-6, np.float32), "floor")
    nodes = [
        helper.make_node("Conv", ["x", "conv_w"], ["features"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["features"], ["act"], name="relu"),
        helper.make_node("Max", ["act", "floor"], ["clamped"], name="clamp"),
        helper.make_node("Pow", ["clamped", "p"], ["cubed"], name="gem_pow"),
        helper.make_node("ReduceMean", ["cubed"], ["mean"], name="gem_mean", axes=[2, 3], keepdims=0),
        helper.make_node("Pow", ["mean", "inv_p"], ["pooled"], name="gem_root"),
        helper.make_node("MatMul", ["pooled", "fc_w"], ["logits"], name="fc"),
    ]
    return save_model(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                 [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], [conv, fc, three, third, floor])


def small_images(seed: int = 0) -> np.ndarray:
    """Dim, smooth images (values 0..0.01), as a normalized dark photo gives."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:32, 0:32] / 32.0
    channels = [0.01 * (0.5 + 0.5 * np.sin(2 * np.pi * (xx * rng.uniform(0.5, 2) + yy * rng.uniform(0.5, 2)))) for _ in range(3)]
    return np.asarray(channels, np.float32)[None]


def save_npy(path: Path, array: np.ndarray) -> Path:
    np.save(path, array)
    return path
