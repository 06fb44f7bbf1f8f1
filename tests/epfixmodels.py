"""Small models (onnx.helper, random weights) with the fused ops QNN refuses or filters off (tests/test_epfixes.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"


def _weight(name: str, shape: list[int], seed: int) -> onnx.TensorProto:
    return numpy_helper.from_array((np.random.default_rng(seed).standard_normal(shape) * 0.2).astype(np.float32), name)


def _save(nodes: list, inputs: list, outputs: list, initializers: list, path: Path) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _value(name: str, shape: list[int], dtype: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def skip_norms(path: Path, width: int = 64) -> Path:
    """MatMul -> SkipSimplifiedLayerNormalization (its skip-sum output a graph output) -> MatMul -> SkipLayerNormalization
    (beta and bias) -> MatMul: the layer pattern of onnxruntime-genai's builder (and of BERT-style encoders)."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]),
             helper.make_node("SkipSimplifiedLayerNormalization", ["a", "x", "g1"], ["n1", "", "", "residual"], domain=MS, epsilon=1e-5),
             helper.make_node("MatMul", ["n1", "w2"], ["b"]),
             helper.make_node("SkipLayerNormalization", ["b", "residual", "g2", "beta", "bias"], ["n2"], domain=MS, epsilon=1e-5),
             helper.make_node("MatMul", ["n2", "w3"], ["y"])]
    weights = [_weight("w1", [width, width], 1), _weight("w2", [width, width], 2), _weight("w3", [width, width], 3),
               numpy_helper.from_array(np.linspace(0.5, 1.5, width, dtype=np.float32), "g1"),
               numpy_helper.from_array(np.linspace(1.5, 0.5, width, dtype=np.float32), "g2"), _weight("beta", [width], 4), _weight("bias", [width], 5)]
    return _save(nodes, [_value("x", [1, 8, width])], [_value("y", [1, 8, width]), _value("residual", [1, 8, width])], weights, path)


# Einsum forms QNN 2.7.0 refuses (measured: each left one CPU node) and one it takes, all MatMul/Transpose.
REFUSED_EINSUMS = ("abc,cd->abd", "bqhd,bkhd->bhqk", "bhqk,bkhd->bqhd")


def einsums(path: Path) -> Path:
    """Attention written with Einsum: projection (abc,cd->abd), scores (bqhd,bkhd->bhqk), context (bhqk,bkhd->bqhd),
    then a batched matmul (bij,bjk->bik)."""
    nodes = [helper.make_node("Einsum", ["x", "wq"], ["q"], equation="abc,cd->abd"),
             helper.make_node("Reshape", ["q", "heads"], ["qh"]),
             helper.make_node("Einsum", ["qh", "k"], ["scores"], equation="bqhd,bkhd->bhqk"),
             helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
             helper.make_node("Einsum", ["p", "v"], ["ctx"], equation="bhqk,bkhd->bqhd"),
             helper.make_node("Reshape", ["ctx", "flat"], ["c"]),
             helper.make_node("Einsum", ["c", "wo"], ["y"], equation="bij,bjk->bik")]
    weights = [_weight("wq", [32, 32], 1), _weight("wo", [1, 32, 32], 2),
               numpy_helper.from_array(np.array([1, 8, 2, 16], np.int64), "heads"), numpy_helper.from_array(np.array([1, 8, 32], np.int64), "flat")]
    inputs = [_value("x", [1, 8, 32]), _value("k", [1, 8, 2, 16]), _value("v", [1, 8, 2, 16])]
    return _save(nodes, inputs, [_value("y", [1, 8, 32])], weights, path)


GQA = {"seq": 4, "past": 16, "heads": 2, "kv_heads": 1, "head_size": 16}


def gqa(path: Path) -> Path:
    """Projections around a GroupQueryAttention with a shared past/present buffer (static: the decoder's prefill)."""
    s, past, heads, kv, hd = GQA["seq"], GQA["past"], GQA["heads"], GQA["kv_heads"], GQA["head_size"]
    hidden = heads * hd
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("MatMul", ["x", "wv"], ["v"]),
             helper.make_node("GroupQueryAttention", ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total_seq_len"],
                              ["attn", "present_key", "present_value"], domain=MS, num_heads=heads, kv_num_heads=kv),
             helper.make_node("MatMul", ["attn", "wo"], ["y"])]
    weights = [_weight("wq", [hidden, hidden], 1), _weight("wk", [hidden, kv * hd], 2), _weight("wv", [hidden, kv * hd], 3),
               _weight("wo", [hidden, hidden], 4)]
    cache = [1, kv, past, hd]
    inputs = [_value("x", [1, s, hidden]), _value("past_key", cache), _value("past_value", cache),
              _value("seqlens_k", [1], TensorProto.INT32), _value("total_seq_len", [1], TensorProto.INT32)]
    outputs = [_value("y", [1, s, hidden]), _value("present_key", cache), _value("present_value", cache)]
    return _save(nodes, inputs, outputs, weights, path)


def gqa_feeds(filled: int, seed: int) -> dict[str, np.ndarray]:
    """A prefill of `seq` tokens after `filled` cached ones: the cache holds small values up to `filled`, zeros after."""
    rng = np.random.default_rng(seed)
    s, past, kv, hd = GQA["seq"], GQA["past"], GQA["kv_heads"], GQA["head_size"]
    cache = np.zeros([1, kv, past, hd], np.float32)
    key, value = cache.copy(), cache.copy()
    key[:, :, :filled], value[:, :, :filled] = (rng.standard_normal([2, 1, kv, filled, hd]) * 0.5).astype(np.float32)
    total = filled + s
    return {"x": rng.standard_normal([1, s, GQA["heads"] * hd]).astype(np.float32), "past_key": key, "past_value": value,
            "seqlens_k": np.array([total - 1], np.int32), "total_seq_len": np.array([total], np.int32)}
