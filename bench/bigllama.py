#!/usr/bin/env python3
"""A Llama-shaped fp16 decoder of any size in standard ONNX ops, written without holding its weights.

The default is Llama-3-8B's shape (hidden 4096, 32 layers, 32 heads, 8 KV heads, MLP 14336, vocab 128256): 8.03 B
parameters, 16.06 GB of fp16 weights. The graph is the static prefill graph an Olive-style recipe exports: batch 1,
`--seq` new tokens over a `--context`-slot KV cache, RoPE cos/sin tables and an additive mask as inputs, every op
one the QNN EP takes (Gather, MatMul, Mul/Add/Div/Sqrt/ReduceMean RMSNorm, Reshape/Transpose/Slice/Concat/Neg RoPE,
grouped-query attention as one MatMul per KV head group, Softmax, Sigmoid SiLU). Weights are random but not
independent: slices of one 64 MiB pool of N(0, 0.02) fp16 values, written straight into one data file, so the
generator's memory stays ~0.2 GiB whatever the size.

    python bench/bigllama.py /work/heavy/llama8b                 # 16.06 GB
    python bench/bigllama.py /work/heavy/prefix --layers 4       # the same shape, 4 layers (4.6 GB)
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

POOL_ELEMENTS = 32 << 20  # fp16 values: 64 MiB
ALIGN = 4096
FP16 = TensorProto.FLOAT16


@dataclass(frozen=True)
class Shape:
    layers: int = 32
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    intermediate: int = 14336
    vocab: int = 128256
    seq: int = 128
    context: int = 1024

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


class _Writer:
    """Nodes, inputs/outputs and external fp16 initializers; the weights' bytes go to one data file as they come."""

    def __init__(self, data_path: Path, seed: int) -> None:
        self.data_path = data_path
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.position = 0
        self._fd = os.open(data_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        rng = np.random.default_rng(seed)
        self._pool = (rng.standard_normal(POOL_ELEMENTS, dtype=np.float32) * 0.02).astype(np.float16)
        self._pool_bytes = memoryview(self._pool).cast("B")
        self._count = 0

    def close(self) -> None:
        os.close(self._fd)

    def node(self, op: str, inputs: list[str], output: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def weight(self, name: str, shape: tuple[int, ...], ones: bool = False) -> str:
        """An fp16 initializer of `shape` stored externally at the next aligned offset."""
        count = int(np.prod(shape))
        self.position = -(-self.position // ALIGN) * ALIGN
        offset, length = self.position, 2 * count
        if ones:
            self._pwrite(memoryview(np.ones(count, np.float16)).cast("B"), offset)
        else:  # pool slices from a position that differs per tensor
            start = (self._count * 7_919_093) % POOL_ELEMENTS * 2
            written = 0
            while written < length:
                piece = self._pool_bytes[start:start + min(length - written, len(self._pool_bytes) - start)]
                self._pwrite(piece, offset + written)
                written += len(piece)
                start = 0
        self._count += 1
        self.position += length
        tensor = TensorProto(name=name, data_type=FP16, dims=shape, data_location=TensorProto.EXTERNAL)
        for key, value in (("location", self.data_path.name), ("offset", str(offset)), ("length", str(length))):
            tensor.external_data.add(key=key, value=value)
        self.initializers.append(tensor)
        return name

    def const(self, name: str, values: list[int] | list[float], dtype: int) -> str:
        if not any(t.name == name for t in self.initializers):
            array = np.array(values, dtype=helper.tensor_dtype_to_np_dtype(dtype))
            self.initializers.append(onnx.numpy_helper.from_array(array, name))
        return name

    def _pwrite(self, view: memoryview, offset: int) -> None:
        while view:
            done = os.pwrite(self._fd, view, offset)
            view, offset = view[done:], offset + done


def _rms(w: _Writer, x: str, weight: str, name: str) -> str:
    squared = w.node("Mul", [x, x], f"{name}/sq")
    mean = w.node("ReduceMean", [squared], f"{name}/mean", axes=[-1], keepdims=1)
    root = w.node("Sqrt", [w.node("Add", [mean, w.const("eps", [1e-5], FP16)], f"{name}/eps")], f"{name}/root")
    return w.node("Mul", [w.node("Div", [x, root], f"{name}/div"), weight], f"{name}/out")


def _rope(w: _Writer, x: str, half: int, name: str) -> str:
    first = w.node("Slice", [x, w.const("zero", [0], TensorProto.INT64), w.const("half", [half], TensorProto.INT64),
                             w.const("axis3", [3], TensorProto.INT64)], f"{name}/x1")
    second = w.node("Slice", [x, "half", w.const("full", [2 * half], TensorProto.INT64), "axis3"], f"{name}/x2")
    rotated = w.node("Concat", [w.node("Neg", [second], f"{name}/neg"), first], f"{name}/rot", axis=3)
    return w.node("Add", [w.node("Mul", [x, "cos"], f"{name}/cos"), w.node("Mul", [rotated, "sin"], f"{name}/sin")], f"{name}/out")


def _heads(w: _Writer, x: str, s: Shape, heads: int, name: str) -> str:
    """[1, S, heads * D] -> [1, heads, S, D]."""
    shaped = w.node("Reshape", [x, w.const(f"shape_{heads}h", [1, s.seq, heads, s.head_dim], TensorProto.INT64)], f"{name}/4d")
    return w.node("Transpose", [shaped], f"{name}/heads", perm=[0, 2, 1, 3])


def _layer(w: _Writer, x: str, s: Shape, i: int) -> str:
    p = f"l{i}"
    kv_width = s.kv_heads * s.head_dim
    normed = _rms(w, x, w.weight(f"{p}.input_norm", (s.hidden,), ones=True), f"{p}/norm1")
    q = _rope(w, _heads(w, w.node("MatMul", [normed, w.weight(f"{p}.q", (s.hidden, s.hidden))], f"{p}/q"), s, s.heads, f"{p}/q"),
              s.head_dim // 2, f"{p}/qrope")
    k = _rope(w, _heads(w, w.node("MatMul", [normed, w.weight(f"{p}.k", (s.hidden, kv_width))], f"{p}/k"), s, s.kv_heads, f"{p}/k"),
              s.head_dim // 2, f"{p}/krope")
    v = _heads(w, w.node("MatMul", [normed, w.weight(f"{p}.v", (s.hidden, kv_width))], f"{p}/v"), s, s.kv_heads, f"{p}/v")
    keys = w.node("Concat", [f"past_key.{i}", k], f"present_key.{i}", axis=2)
    values = w.node("Concat", [f"past_value.{i}", v], f"present_value.{i}", axis=2)
    # grouped-query attention: the `group` query heads of a KV head as one [group * S] block of rows
    grouped = w.node("Reshape", [q, w.const("shape_grouped", [1, s.kv_heads, s.group * s.seq, s.head_dim], TensorProto.INT64)], f"{p}/qg")
    scores = w.node("MatMul", [grouped, w.node("Transpose", [keys], f"{p}/kt", perm=[0, 1, 3, 2])], f"{p}/scores")
    scaled = w.node("Mul", [scores, w.const("scale", [s.head_dim ** -0.5], FP16)], f"{p}/scaled")
    mask = w.node("Concat", ["attention_mask"] * s.group, f"{p}/mask", axis=2)
    probs = w.node("Softmax", [w.node("Add", [scaled, mask], f"{p}/masked")], f"{p}/probs", axis=-1)
    context = w.node("MatMul", [probs, values], f"{p}/ctx")
    merged = w.node("Reshape", [context, w.const("shape_heads", [1, s.heads, s.seq, s.head_dim], TensorProto.INT64)], f"{p}/ctx4")
    flat = w.node("Reshape", [w.node("Transpose", [merged], f"{p}/ctxt", perm=[0, 2, 1, 3]),
                              w.const("shape_flat", [1, s.seq, s.hidden], TensorProto.INT64)], f"{p}/ctxflat")
    x = w.node("Add", [x, w.node("MatMul", [flat, w.weight(f"{p}.o", (s.hidden, s.hidden))], f"{p}/o")], f"{p}/res1")
    normed = _rms(w, x, w.weight(f"{p}.post_norm", (s.hidden,), ones=True), f"{p}/norm2")
    gate = w.node("MatMul", [normed, w.weight(f"{p}.gate", (s.hidden, s.intermediate))], f"{p}/gate")
    up = w.node("MatMul", [normed, w.weight(f"{p}.up", (s.hidden, s.intermediate))], f"{p}/up")
    silu = w.node("Mul", [gate, w.node("Sigmoid", [gate], f"{p}/sigmoid")], f"{p}/silu")
    down = w.node("MatMul", [w.node("Mul", [silu, up], f"{p}/act"), w.weight(f"{p}.down", (s.intermediate, s.hidden))], f"{p}/down")
    return w.node("Add", [x, down], f"{p}/res2")


def write_decoder(directory: Path, name: str = "llama", shape: Shape = Shape(), seed: int = 0) -> Path:
    """Write `directory/name.onnx` and its `.data`; return the model's path."""
    directory.mkdir(parents=True, exist_ok=True)
    s, past = shape, shape.context - shape.seq
    w = _Writer(directory / f"{name}.onnx.data", seed)
    try:
        x = w.node("Gather", [w.weight("embed", (s.vocab, s.hidden)), "input_ids"], "embedded", axis=0)
        for i in range(s.layers):
            x = _layer(w, x, s, i)
        normed = _rms(w, x, w.weight("final_norm", (s.hidden,), ones=True), "final_norm")
        w.node("MatMul", [normed, w.weight("lm_head", (s.hidden, s.vocab))], "logits")
    finally:
        w.close()
    kv = [(f"{kind}.{i}", [1, s.kv_heads, length, s.head_dim])
          for i in range(s.layers) for kind, length in (("past_key", past), ("past_value", past))]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, s.seq]),
              helper.make_tensor_value_info("cos", FP16, [1, 1, s.seq, s.head_dim]),
              helper.make_tensor_value_info("sin", FP16, [1, 1, s.seq, s.head_dim]),
              helper.make_tensor_value_info("attention_mask", FP16, [1, 1, s.seq, s.context]),
              *(helper.make_tensor_value_info(n, FP16, dims) for n, dims in kv)]
    outputs = [helper.make_tensor_value_info("logits", FP16, [1, s.seq, s.vocab]),
               *(helper.make_tensor_value_info(n.replace("past", "present"), FP16, [1, s.kv_heads, s.context, s.head_dim]) for n, _ in kv)]
    graph = helper.make_graph(w.nodes, name, inputs, outputs, w.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="bench/bigllama.py")
    model.ir_version = 8
    path = directory / f"{name}.onnx"
    onnx.save_model(model, str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--name", default="llama")
    for field, default in Shape().__dict__.items():
        parser.add_argument(f"--{field}", type=int, default=default)
    args = parser.parse_args()
    clock = time.perf_counter()
    shape = Shape(**{k: getattr(args, k) for k in Shape().__dict__})
    path = write_decoder(args.directory, args.name, shape)
    size = (path.parent / f"{path.name}.data").stat().st_size
    print(f"{path}: {size / 1e9:.2f} GB of weights, {shape.layers} layers, written in {time.perf_counter() - clock:.1f}s")


if __name__ == "__main__":
    main()
