"""A tiny static standard-ops decoder, as Olive's QNN recipe exports one: batch 1, a prefill of S tokens, a fixed
KV cache of C slots as inputs (the present is past ++ new: C + S slots), RoPE cos/sin tables and an additive
mask as inputs, random weights. Every op is a standard ONNX op that QNN's HTP takes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB, HIDDEN, HEADS, HEAD, FFN = 128, 64, 2, 32, 128


def static_decoder(path: Path, layers: int = 2, seq: int = 16, cache: int = 64, seed: int = 0, qk_scale: float = 0.4) -> Path:
    """`qk_scale`: the query/key projections' weight scale (0.4: attention logits of a few tens on real positions)."""
    rng = np.random.default_rng(seed)
    inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def weight(name: str, *shape: int, scale: float | None = None) -> str:
        scale = scale if scale is not None else 1.0 / np.sqrt(shape[0])
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def const(name: str, value: object, dtype: type = np.int64) -> str:
        inits.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))
        return name

    def node(op: str, inputs: list[str], out: str, **attrs: object) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    total = cache + seq
    const("q_shape", [1, seq, HEADS, HEAD])
    const("o_shape", [1, seq, HIDDEN])
    const("half_a", [0]), const("half_b", [HEAD // 2]), const("half_e", [HEAD]), const("last", [-1])
    const("eps", 1e-5, np.float32), const("scale", 1.0 / np.sqrt(HEAD), np.float32), const("two", 2.0, np.float32)
    const("axis1", [1])
    weight("embed", VOCAB, HIDDEN, scale=1.0)
    x = node("Gather", ["embed", "input_ids"], "h0")
    cos = node("Unsqueeze", ["position_cos", "axis1"], "cos4")  # [1,1,S,HEAD]
    sin = node("Unsqueeze", ["position_sin", "axis1"], "sin4")

    def rms(x: str, tag: str) -> str:
        sq = node("Pow", [x, "two"], f"{tag}_sq")
        mean = node("ReduceMean", [sq], f"{tag}_mean", axes=[-1])
        std = node("Sqrt", [node("Add", [mean, "eps"], f"{tag}_eps")], f"{tag}_std")
        inits.append(numpy_helper.from_array(np.ones(HIDDEN, dtype=np.float32), f"{tag}_w"))
        return node("Mul", [node("Div", [x, std], f"{tag}_n"), f"{tag}_w"], f"{tag}_out")

    def rope(t: str, tag: str) -> str:
        a = node("Slice", [t, "half_a", "half_b", "last"], f"{tag}_a")
        b = node("Slice", [t, "half_b", "half_e", "last"], f"{tag}_b")
        rotated = node("Concat", [node("Neg", [b], f"{tag}_nb"), a], f"{tag}_rot", axis=-1)
        return node("Add", [node("Mul", [t, cos], f"{tag}_c"), node("Mul", [rotated, sin], f"{tag}_s")], f"{tag}_rope")

    def heads(t: str, tag: str) -> str:
        return node("Transpose", [node("Reshape", [t, "q_shape"], f"{tag}_r")], f"{tag}_t", perm=[0, 2, 1, 3])

    outputs = []
    for i in range(layers):
        n = rms(x, f"l{i}_ln1")
        q = rope(heads(node("MatMul", [n, weight(f"l{i}_wq", HIDDEN, HIDDEN, scale=qk_scale)], f"l{i}_q"), f"l{i}_q"), f"l{i}_q")
        k = rope(heads(node("MatMul", [n, weight(f"l{i}_wk", HIDDEN, HIDDEN, scale=qk_scale)], f"l{i}_k"), f"l{i}_k"), f"l{i}_k")
        v = heads(node("MatMul", [n, weight(f"l{i}_wv", HIDDEN, HIDDEN)], f"l{i}_v"), f"l{i}_v")
        keys = node("Concat", [f"past_key_values.{i}.key", k], f"present.{i}.key", axis=2)
        values = node("Concat", [f"past_key_values.{i}.value", v], f"present.{i}.value", axis=2)
        outputs += [keys, values]
        kt = node("Transpose", [keys], f"l{i}_kt", perm=[0, 1, 3, 2])
        scores = node("Add", [node("Mul", [node("MatMul", [q, kt], f"l{i}_qk"), "scale"], f"l{i}_qks"), "attention_mask"], f"l{i}_scores")
        probs = node("Softmax", [scores], f"l{i}_probs", axis=-1)
        ctx = node("Reshape", [node("Transpose", [node("MatMul", [probs, values], f"l{i}_ctx")], f"l{i}_ctxt", perm=[0, 2, 1, 3]), "o_shape"], f"l{i}_ctxr")
        x = node("Add", [x, node("MatMul", [ctx, weight(f"l{i}_wo", HIDDEN, HIDDEN)], f"l{i}_o")], f"l{i}_h1")
        n2 = rms(x, f"l{i}_ln2")
        up = node("MatMul", [n2, weight(f"l{i}_w1", HIDDEN, FFN)], f"l{i}_up")
        act = node("Mul", [up, node("Sigmoid", [up], f"l{i}_sig")], f"l{i}_silu")
        x = node("Add", [x, node("MatMul", [act, weight(f"l{i}_w2", FFN, HIDDEN)], f"l{i}_down")], f"l{i}_h2")
    logits = node("MatMul", [rms(x, "final"), weight("lm_head", HIDDEN, VOCAB)], "logits")
    f32 = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq]),
              helper.make_tensor_value_info("attention_mask", f32, [1, 1, seq, total]),
              helper.make_tensor_value_info("position_cos", f32, [1, seq, HEAD]),
              helper.make_tensor_value_info("position_sin", f32, [1, seq, HEAD])]
    for i in range(layers):
        inputs += [helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", f32, [1, HEADS, cache, HEAD]) for kind in ("key", "value")]
    outs = [helper.make_tensor_value_info(logits, f32, [1, seq, VOCAB])]
    outs += [helper.make_tensor_value_info(name, f32, [1, HEADS, total, HEAD]) for name in outputs]
    graph = helper.make_graph(nodes, "decoder", inputs, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path

