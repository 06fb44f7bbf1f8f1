"""The one graph change a static decoder needs: GroupQueryAttention fed from genai's sequence-length inputs.

onnxruntime-genai's builder computes GQA's `seqlens_k` (ReduceSum(attention_mask) - 1) and `total_sequence_length`
(Shape(attention_mask)[1]) from a 0/1 attention mask over the tokens so far. In a static graph that mask would
be [1, context] and genai's static (windowed) mode does not feed it; it feeds `past_seq_len` [1, 1] and
`total_seq_len` [1] (int32), which are exactly those two values. So the mask input and its subgraph go, and
every GQA node reads the two inputs (the first through a Reshape to GQA's [batch] shape). The weights are not
touched: only the graph proto is rewritten, its external data references unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortcompile.errors import InvalidModel
from ortcompile.llm.genai import PAST_SEQ_LEN, TOTAL_SEQ_LEN, GenaiModel

GQA = "GroupQueryAttention"


def rewrite_decoder(model: GenaiModel, out: Path) -> dict[str, Any]:
    """Write the rewritten graph proto to `out` (its data file must sit beside it); return the symbolic dims by role."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    proto = onnx.load_model(str(model.model_file), load_external_data=False)
    graph = proto.graph
    attention = [n for n in graph.node if n.op_type == GQA and n.domain == "com.microsoft"]
    if not attention:
        raise InvalidModel(f"{model.model_file}: no {GQA} node: ortcompile llm takes decoders from onnxruntime-genai's model builder")
    if any(i.name == "position_ids" for i in graph.input):
        raise InvalidModel(f"{model.model_file}: takes position_ids: build it with rotary embeddings inside attention (the builder's default)")
    dims = _dims(graph, model)
    graph.input.extend([helper.make_tensor_value_info(PAST_SEQ_LEN, TensorProto.INT32, [1, 1]),
                        helper.make_tensor_value_info(TOTAL_SEQ_LEN, TensorProto.INT32, [1])])
    seqlens = f"/ortcompile/{PAST_SEQ_LEN}/seqlens_k"
    graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "/ortcompile/shape_1"))
    graph.node.insert(0, helper.make_node("Reshape", [PAST_SEQ_LEN, "/ortcompile/shape_1"], [seqlens], name="/ortcompile/seqlens_k"))
    for node in attention:
        node.input[5], node.input[6] = seqlens, TOTAL_SEQ_LEN
    _share_cache_dims(graph, dims)
    kept = [i for i in graph.input if i.name != model.attention_mask]
    del graph.input[:]
    graph.input.extend(kept)
    _prune(graph)
    onnx.save_model(proto, str(out))
    return dims


def _dims(graph: Any, model: GenaiModel) -> dict[str, str]:
    """The symbolic dims by role: batch, sequence (new tokens), past (cache slots), total (mask length), head (head size)."""
    by_name = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
    try:
        ids, past, mask = by_name[model.input_ids], by_name[model.past_names[0]], by_name[model.attention_mask]
    except KeyError as exc:
        raise InvalidModel(f"{model.model_file}: has no input {exc.args[0]!r} that genai_config.json names") from exc
    roles = {"batch": ids[0], "sequence": ids[1], "past": past[2], "head": past[3], "total": mask[1]}
    return {role: name for role, name in roles.items() if isinstance(name, str) and name}


def _share_cache_dims(graph: Any, dims: dict[str, str]) -> None:
    """With past and present sharing one buffer (genai's past_present_share_buffer), a present cache has as many
    slots as the past one: its `total` dim (the mask's, gone with it) is the `past` dim."""
    total, past = dims.pop("total", None), dims.get("past")
    if not total or not past:
        return
    for value in (*graph.output, *graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == total:
                dim.dim_param = past


def _prune(graph: Any) -> None:
    """Remove nodes nothing reads (the mask subgraph), repeatedly. Initializers only they read stay: the prepare
    step's ORT optimization drops them."""
    while True:
        read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
        kept = [n for n in graph.node if any(o in read for o in n.output)]
        if len(kept) == len(graph.node):
            return
        del graph.node[:]
        graph.node.extend(kept)
