"""--freeze NAME=VALUE: specialize a model on a control input before compiling it (part of the prepare step).

Some models switch between networks on an input: silero-vad's `If(sr == 16000)` holds a 16 kHz and an 8 kHz
network. Once the audio input is pinned to the 16 kHz frame, the dead 8 kHz branch no longer type-checks and
ONNX Runtime refuses the graph; ORT's own If inlining (constant folding with the input made an initializer)
breaks on such nested Ifs. So the branch is taken here: every If whose condition depends only on frozen
inputs and constants is evaluated (ORT on the condition's own small graph) and replaced by the branch it
takes, repeatedly (a taken branch may hold more such Ifs); nodes nothing reads any more are dropped.

The frozen input stays in the model's interface, read by nothing (an app that passes sr=16000 keeps working),
and the manifest records the value: the compiled model computes what the source computes for that value only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ortcompile.errors import UsageError
from ortcompile.onnxfacts import cone as _cone
from ortcompile.onnxfacts import input_dims

if TYPE_CHECKING:
    import numpy as np

_MAX_ROUNDS = 32  # nested Ifs inlined level by level


def parse_freeze(pairs: Any) -> dict[str, int | float]:
    """NAME=VALUE pairs (strings, or (name, value) tuples from the CLI) with numeric values."""
    frozen: dict[str, int | float] = {}
    for pair in pairs.items() if isinstance(pairs, dict) else pairs:
        name, value = pair.split("=", 1) if isinstance(pair, str) else pair
        text = str(value).strip()
        try:
            frozen[name.strip()] = int(text)
        except ValueError:
            try:
                frozen[name.strip()] = float(text)
            except ValueError:
                raise UsageError(f"bad --freeze {name}={text}: the value must be a number, e.g. sr=16000") from None
    return frozen


def freeze_inputs(model: Any, frozen: dict[str, int | float]) -> list[str]:
    """Specialize `model` (a ModelProto, changed in place) on the frozen inputs; return what was inlined."""
    import onnx

    graph = model.graph
    inputs = {i.name: i for i in graph.input}
    unknown = sorted(set(frozen) - set(inputs))
    if unknown:
        raise UsageError(f"--freeze {unknown[0]}: the model has no input {unknown[0]!r} (it has: {', '.join(inputs)})")
    values = {name: _typed(inputs[name], value) for name, value in frozen.items()}
    constants = {f"{name}__frozen": onnx.numpy_helper.from_array(array, f"{name}__frozen") for name, array in values.items()}
    _rename_uses(graph, {name: f"{name}__frozen" for name in values})
    graph.initializer.extend(constants.values())
    taken: list[str] = []
    for _ in range(_MAX_ROUNDS):
        inlined = _inline_decided_ifs(model, {c.name for c in constants.values()})
        if not inlined:
            break
        taken += inlined
    _drop_dead_nodes(graph)
    return taken


def _typed(value_info: Any, value: int | float) -> np.ndarray:
    """The frozen value with the input's element type and shape (a scalar fills its shape; an unknown dim is 1)."""
    import numpy as np
    import onnx

    dtype = onnx.helper.tensor_dtype_to_np_dtype(value_info.type.tensor_type.elem_type)
    dims = [d if isinstance(d, int) and d > 0 else 1 for d in input_dims(value_info)]
    return np.full(dims, value, dtype=dtype)


def _rename_uses(graph: Any, renames: dict[str, str]) -> None:
    """Every node (in subgraphs too) that reads a frozen input reads its constant instead."""
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name in renames:
                node.input[index] = renames[name]
        for attribute in node.attribute:
            for subgraph in [attribute.g] if attribute.type == attribute.GRAPH else list(attribute.graphs):
                _rename_uses(subgraph, renames)


def _inline_decided_ifs(model: Any, constant_names: set[str]) -> list[str]:
    """One pass over the main graph: Ifs whose condition is decided become the nodes of the branch they take."""
    from onnx import helper

    graph, nodes, inlined = model.graph, [], []
    for node in graph.node:
        condition = _evaluate(model, node.input[0], constant_names) if node.op_type == "If" else None
        if condition is None:
            nodes.append(node)
            continue
        branch_name = "then_branch" if condition else "else_branch"
        branch = next(a.g for a in node.attribute if a.name == branch_name)
        nodes.extend(branch.node)
        graph.initializer.extend(branch.initializer)
        constant_names.update(t.name for t in branch.initializer)
        nodes.extend(helper.make_node("Identity", [b.name], [o], name=f"{o}/frozen") for b, o in zip(branch.output, node.output))
        inlined.append(f"{node.name or node.output[0]}: {branch_name}")
    del graph.node[:]
    graph.node.extend(nodes)
    return inlined


def _evaluate(model: Any, target: str, constant_names: set[str]) -> bool | None:
    """The value of `target` when it depends only on constants (ORT runs its cone), else None."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    cone = _cone(model.graph, target)
    produced = {o for n in cone for o in n.output}
    reads = {i for n in cone for i in n.input if i and i not in produced}
    if target not in produced and target not in constant_names:
        return None
    initializers = [t for t in model.graph.initializer if t.name in reads | {target}]
    if reads - {t.name for t in initializers} or any(_has_subgraph(n) for n in cone):
        return None  # depends on a real input, or on a subgraph's own scope: ORT decides at run time
    graph = helper.make_graph(cone, "condition", [], [helper.make_tensor_value_info(target, TensorProto.BOOL, None)], initializers)
    condition = helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    try:
        session = ort.InferenceSession(condition.SerializeToString(), providers=["CPUExecutionProvider"])
        return bool(np.asarray(session.run(None, {})[0]).all())
    except Exception:
        return None  # not decidable here: the If stays (ORT decides at run time)


def _has_subgraph(node: Any) -> bool:
    return any(a.type in (a.GRAPH, a.GRAPHS) for a in node.attribute)


def _drop_dead_nodes(graph: Any) -> None:
    """Nodes whose outputs nothing reads (the decided conditions) go; so do initializers nothing reads."""
    outputs = {o.name for o in graph.output}
    while True:
        reads = _all_reads(graph)
        alive = [n for n in graph.node if any(o in reads or o in outputs for o in n.output)]
        if len(alive) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(alive)
    reads = _all_reads(graph) | outputs
    kept = [t for t in graph.initializer if t.name in reads]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _all_reads(graph: Any) -> set[str]:
    reads: set[str] = set()
    for node in graph.node:
        reads.update(node.input)
        for attribute in node.attribute:
            for subgraph in [attribute.g] if attribute.type == attribute.GRAPH else list(attribute.graphs):
                reads |= _all_reads(subgraph)
    return reads
