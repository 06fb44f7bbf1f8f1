"""Prepare without re-writing the weights the optimizer cannot change (issue 22).

ORT's offline optimizer writes every initializer of the model it saves, so a prepare of a 1.6 GB model used
to copy 1.6 GB it never changed. Instead the optimizer runs once on a copy of the graph in which the weights it
cannot change are graph inputs of the same name, type and shape: it writes the bytes of every tensor it creates
or changes, and only those, and never reads the set-aside ones. The prepared graph is that run's, with each
set-aside weight an initializer again, referencing the source's own data file (hard-linked beside it, offsets
unchanged), after the initializers the run wrote.

Until issue 22's second round a first run optimized the whole graph as well (its data file a link to /dev/null,
for the nodes and the initializer order exactly as an ordinary run gives them), and the two had to agree node for
node: that run read every weight (1.5 CPU s of a 1.6 GB model) to write it nowhere. The nodes are the same by
construction (below); the initializer order is not (set-aside weights last), which changes the prepared graph's
bytes, not what it computes.

Which weights are set aside: those whose every use is the weight input of a MatMul or Gemm, or the table of
a Gather, whose other operand depends on a graph input (constant folding cannot fold the node, whatever the
weight holds). The BASIC rules that read such a weight's values need QDQ or BatchNormalization nodes
(WeightBiasQuantization, MatMulBNFusion): a model with either keeps the ordinary run. The other rules look
at its shape only (MatMulAddFusion), which the graph input keeps (tests/test_prepare_inplace.py compares the
two ways node for node on each pattern).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortcompile.onnxfacts import iter_graphs

WEIGHT_INPUT = {"MatMul": 1, "Gemm": 1, "Gather": 0}  # op -> the input that holds the weight
OTHER_INPUT = {"MatMul": 0, "Gemm": 0, "Gather": 1}  # the operand that must be dynamic for the node never to fold
VALUE_READERS = {"QuantizeLinear", "DequantizeLinear", "BatchNormalization"}  # BASIC rules that read weight values
SHAPE_ONLY = {"Shape", "Size", "EyeLike"}  # outputs a function of static shapes only: ORT may fold them
MIN_BYTES = 64 * 1024  # below this, re-writing costs less than the bookkeeping


@dataclass
class SetAside:
    tensors: dict[str, Any]  # name -> the initializer as restored (pointing at the linked source file)
    source_files: dict[str, Path]  # link name (as the restored tensors write it) -> its path


def set_aside(model: Any, source_paths: dict[str, Path], out_dir: Path, stem: str, inline_threshold: int) -> SetAside | None:
    """Turn the weights the optimizer cannot change into graph inputs of `model`; None: there are none, or the
    source's data files cannot be hard-linked into `out_dir` (then nothing is changed)."""
    graph = model.graph
    names = _inert_weights(model, max(MIN_BYTES, inline_threshold))
    if not names:
        return None
    links = _link(source_paths, {_location(t) for t in graph.initializer if t.name in names}, out_dir, stem)
    if links is None:
        return None
    import onnx

    kept, tensors = [], {}
    for tensor in graph.initializer:
        if tensor.name not in names:
            kept.append(tensor)
            continue
        restored = onnx.TensorProto()
        restored.CopyFrom(tensor)
        for entry in restored.external_data:
            if entry.key == "location":
                entry.value = links[entry.value][0]
        tensors[tensor.name] = restored
        graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return SetAside(tensors, {name: path for name, path in links.values()})


def restore(optimized: Any, aside: SetAside) -> bool:
    """Make the set-aside weights initializers of `optimized` again (the graph as ORT optimized it with them as
    inputs), each referencing the source's own file; one no node reads any more is left out, as ORT drops an unused
    initializer. False, `optimized` unusable, when a set-aside input is not where it was put (the run changed it)."""
    graph = optimized.graph
    inputs = {value.name: value for value in graph.input}
    if any(name not in inputs for name in aside.tensors):
        return False
    kept = [value for value in graph.input if value.name not in aside.tensors]
    del graph.input[:]
    graph.input.extend(kept)
    read = {name for node in graph.node for name in node.input} | {output.name for output in graph.output}
    graph.initializer.extend(tensor for name, tensor in aside.tensors.items() if name in read)
    return True


def _inert_weights(model: Any, min_bytes: int) -> set[str]:
    """The main graph's external initializers of at least `min_bytes` that only feed WEIGHT_INPUT slots of
    nodes that can never fold."""
    graph = model.graph
    sites = list(iter_graphs(model))
    if any(node.op_type in VALUE_READERS for site in sites for node in site.graph.node):
        return set()
    candidates = {t.name for t in graph.initializer if _is_external(t) and _nbytes(t) >= min_bytes}
    candidates -= {i.name for i in graph.input} | {o.name for o in graph.output}
    for site in sites[1:]:  # a weight a subgraph reads (outer scope) stays
        candidates -= {name for node in site.graph.node for name in node.input}
    dynamic = _dynamic_values(graph)
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name not in candidates:
                continue
            slot = WEIGHT_INPUT.get(node.op_type) if node.domain in ("", "ai.onnx") else None
            other = OTHER_INPUT.get(node.op_type)
            if slot != index or other is None or len(node.input) <= other or node.input[other] not in dynamic:
                candidates.discard(name)
    return candidates


def _dynamic_values(graph: Any) -> set[str]:
    """Values that depend on a graph input's contents through every path (so ORT never folds them). Graph
    nodes are in topological order (ONNX requires it)."""
    initialized = {t.name for t in graph.initializer}
    dynamic = {i.name for i in graph.input if i.name not in initialized}
    for node in graph.node:
        if node.op_type in SHAPE_ONLY or any(a.type in (5, 10) for a in node.attribute):  # GRAPH(S): control flow
            continue
        if any(name in dynamic for name in node.input if name):
            dynamic.update(name for name in node.output if name)
    return dynamic


def _link(source_paths: dict[str, Path], locations: set[str], out_dir: Path, stem: str) -> dict[str, tuple[str, Path]] | None:
    """Hard links to the source data files `locations` name, in `out_dir`: location -> (link name, link path)."""
    links: dict[str, tuple[str, Path]] = {}
    by_file: dict[Path, tuple[str, Path]] = {}
    made: list[Path] = []
    try:
        for location in sorted(locations):
            path = source_paths.get(location)
            if path is None:
                raise OSError(f"unchecked location {location!r}")
            if path not in by_file:
                name = f"{stem}.source{len(by_file)}.data"
                os.link(path, out_dir / name)
                made.append(out_dir / name)
                by_file[path] = (name, out_dir / name)
            links[location] = by_file[path]
    except OSError:
        for link in made:
            link.unlink(missing_ok=True)
        return None
    return links


def _is_external(tensor: Any) -> bool:
    return tensor.data_location == 1 and any(e.key == "location" for e in tensor.external_data)


def _location(tensor: Any) -> str:
    return next(e.value for e in tensor.external_data if e.key == "location")


def _nbytes(tensor: Any) -> int:
    length = next((e.value for e in tensor.external_data if e.key == "length"), None)
    if length is not None:
        return int(length)
    import onnx

    count = 1
    for dim in tensor.dims:
        count *= dim
    try:
        return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except Exception:  # strings, sub-byte types: not worth setting aside
        return 0
