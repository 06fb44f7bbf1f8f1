"""The graph changes a static decoder needs: GroupQueryAttention (and position ids) fed from genai's sequence-length inputs.

onnxruntime-genai's builder computes GQA's `seqlens_k` (ReduceSum(attention_mask) - 1) and `total_sequence_length`
(Shape(attention_mask)[1]) from a 0/1 attention mask over the tokens so far. In a static graph that mask would
be [1, context] and genai's static (windowed) mode does not feed it; it feeds `past_seq_len` [1, 1] and
`total_seq_len` [1] (int32), which are exactly those two values. So the mask input and its subgraph go, and
every GQA node reads the two inputs (the first through a Reshape to GQA's [batch] shape).

A decoder with a `position_ids` input (the builder's form with RotaryEmbedding outside attention) gets its positions
from `past_seq_len` too: genai's windowed position ids count a right-padded last prompt window's padding as
positions, while `past_seq_len` is reset to the real token count, so deriving them keeps rotary positions and cache
slots in step. Each consumer gets its own small copy of these computations, so the cuts of a partitioned graph cross
only the hidden states. The weights are not touched: only the graph proto is rewritten, its external data
references unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortcompile.errors import InvalidModel
from ortcompile.llm.genai import PAST_SEQ_LEN, TOTAL_SEQ_LEN, GenaiModel

GQA, ROTARY, MS_DOMAIN = "GroupQueryAttention", "RotaryEmbedding", "com.microsoft"
OTHER_ATTENTION = {"MultiHeadAttention", "Attention", "PagedAttention", "PackedAttention", "PackedMultiHeadAttention",
                   "DecoderMaskedMultiHeadAttention", "SparseAttention"}
PLAIN_ATTENTION = "Softmax"  # attention written in standard ops


def rewrite_decoder(model: GenaiModel, out: Path, sequence: int) -> dict[str, str]:
    """Write the rewritten graph proto of a graph taking `sequence` tokens at once to `out` (its data file must sit
    beside it); return the symbolic dims by role."""
    import onnx
    from onnx import TensorProto, helper

    proto = onnx.load_model(str(model.model_file), load_external_data=False)
    graph = proto.graph
    refuse_other_attention(graph, model.model_file)
    dims = _dims(graph, model)
    graph.input.extend([helper.make_tensor_value_info(PAST_SEQ_LEN, TensorProto.INT32, [1, 1]),
                        helper.make_tensor_value_info(TOTAL_SEQ_LEN, TensorProto.INT32, [1])])
    _feed_before_consumers(graph, {n.input[5] for n in graph.node if _is_gqa(n)}, _seqlens_nodes)
    for node in (n for n in graph.node if _is_gqa(n)):
        node.input[6] = TOTAL_SEQ_LEN
    _rotary_into_attention(graph)
    dropped = {model.attention_mask}
    position_ids = next((i for i in graph.input if i.name == model.position_ids), None)
    if position_ids is not None:
        dtype = position_ids.type.tensor_type.elem_type
        _feed_before_consumers(graph, {position_ids.name}, lambda output: _position_nodes(output, sequence, dtype))
        dropped.add(position_ids.name)
    _share_cache_dims(graph, dims)
    kept = [i for i in graph.input if i.name not in dropped]
    del graph.input[:]
    graph.input.extend(kept)
    _prune(graph)
    onnx.save_model(proto, str(out))
    return dims


def _rotary_into_attention(graph: Any) -> None:
    """GroupQueryAttention fed by RotaryEmbedding nodes (the builder's form for EPs without fused rotary) gets the rotation
    back inside (do_rotary=1 with the same cos/sin caches): QNN refuses RotaryEmbedding, and GQA's own positions are
    the ones genai's past_seq_len gives. Left as it is when the two rotations differ in their inputs or attributes."""
    from onnx import helper

    producers = {o: n for n in graph.node for o in n.output}
    for node in (n for n in graph.node if _is_gqa(n) and _int_attr(n, "do_rotary") == 0):
        ropes = [producers.get(name) for name in node.input[:2]]
        if not all(r is not None and r.op_type == ROTARY and r.domain == MS_DOMAIN for r in ropes):
            continue
        query, key = ropes
        if list(query.input[1:4]) != list(key.input[1:4]) or {a.name: a for a in query.attribute} != {a.name: a for a in key.attribute}:
            continue
        if _int_attr(query, "rotary_embedding_dim") or _int_attr(query, "num_heads") or len(node.input) < 9:
            continue  # a partial rotation or an explicit head count: GQA's rotary takes neither
        node.input[0], node.input[1], node.input[7], node.input[8] = query.input[0], key.input[0], query.input[2], query.input[3]
        kept = [a for a in node.attribute if a.name not in ("do_rotary", "rotary_interleaved")]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("do_rotary", 1),
                               helper.make_attribute("rotary_interleaved", _int_attr(query, "interleaved"))])


def _int_attr(node: Any, name: str) -> int:
    return next((a.i for a in node.attribute if a.name == name), 0)


def refuse_other_attention(graph: Any, path: Path) -> None:
    """The rewrite needs GroupQueryAttention (the builder's attention for -e cpu, fp32 or int4): one line saying so."""
    if any(_is_gqa(n) for n in graph.node):
        return
    ops = {n.op_type for n in graph.node}
    found = sorted(ops & OTHER_ATTENTION) or (["plain ops (Softmax)"] if PLAIN_ATTENTION in ops else [])
    what = f"its attention is {', '.join(found)}, not {GQA}" if found else f"it has no {GQA} node"
    raise InvalidModel(f"{path}: {what}: ortcompile llm takes decoders with {GQA} (onnxruntime-genai's model builder with -e cpu "
                       "-p fp32 or int4); build it so, or compile static graphs with 'ortcompile compile --share-weights'")


def _is_gqa(node: Any) -> bool:
    return node.op_type == GQA and node.domain == MS_DOMAIN


def _feed_before_consumers(graph: Any, names: set[str], make: Callable[[str], list[Any]]) -> None:
    """Each node reading one of `names` reads instead its own copy, computed right before it by `make(copy_name)`."""
    nodes = []
    for index, node in enumerate(graph.node):
        for position, name in enumerate(node.input):
            if name in names:
                copy = f"/ortcompile/{name.strip('/')}/node{index}_{position}"
                nodes.extend(make(copy))
                node.input[position] = copy
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


def _seqlens_nodes(output: str) -> list[Any]:
    """GroupQueryAttention's seqlens_k [batch] from genai's past_seq_len [1, 1]."""
    import numpy as np
    from onnx import helper

    shape, reshape = _constant(f"{output}/shape", np.array([1], np.int64))
    return [shape, helper.make_node("Reshape", [PAST_SEQ_LEN, reshape], [output], name=f"{output}/Reshape")]


def _position_nodes(output: str, sequence: int, dtype: int) -> list[Any]:
    """position_ids [1, S] of a graph taking S tokens: past_seq_len + 1 - S + [0, 1, ..., S - 1]. genai sets past_seq_len
    to the position of the graph's last token (a prompt window's last slot; a generated token's own position)."""
    import numpy as np
    from onnx import TensorProto, helper

    offsets, name = _constant(f"{output}/offsets", (np.arange(sequence, dtype=np.int32) - sequence + 1).reshape(1, -1))
    positions = output if dtype == TensorProto.INT32 else f"{output}/int32"
    nodes = [offsets, helper.make_node("Add", [PAST_SEQ_LEN, name], [positions], name=f"{output}/Add")]
    if positions != output:
        nodes.append(helper.make_node("Cast", [positions], [output], name=f"{output}/Cast", to=dtype))
    return nodes


def _constant(name: str, value: Any) -> tuple[Any, str]:
    from onnx import helper, numpy_helper

    return helper.make_node("Constant", [], [name], name=f"{name}/Constant", value=numpy_helper.from_array(value, name)), name


def _dims(graph: Any, model: GenaiModel) -> dict[str, str]:
    """The symbolic dims by role: batch, sequence (new tokens), past (cache slots), total (mask length), head (head size)."""
    by_name = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
    try:
        ids, past, mask = by_name[model.input_ids], by_name[model.past_names[0]], by_name[model.attention_mask]
    except KeyError as exc:
        raise InvalidModel(f"{model.model_file}: has no input {exc.args[0]!r} that genai_config.json names") from exc
    if isinstance(ids[0], int) and ids[0] > 1:  # the package runs one sequence (genai's windowed prompt needs batch 1)
        raise InvalidModel(f"{model.model_file}: its {model.input_ids} has a fixed batch of {ids[0]}; `ortcompile llm` builds "
                           "batch-1 packages only: export the decoder with a dynamic batch dimension (the builder does)")
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
