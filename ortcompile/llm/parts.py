"""`ortcompile llm --partition`: prefill and decode graphs cut into parts that each make one QNN context under the limit.

genai's decoder pipeline runs several ONNX models in order and hands each one's outputs to the later ones that read
them by name (src/models/decoder_only_pipeline.cpp), so a package can ship the parts as pipeline stages: context
part 0..n on the prompt, iterator part 0..n on generated tokens. Unlike a stitched graph, each part is its own
model, so `--share-weights` pairs context part k with iterator part k (the same weights) and no context holds more
than a part's weights. The cut is the one `ortcompile split` makes (compile/partition.py), on each stage's graph
with its pins in place; both stages are cut at the same nodes, so the two parts of a pair hold the same weights.
The tensors between parts are the builder's contrib-op outputs, which ONNX shape inference does not type: ONNX
Runtime's symbolic shape inference (which knows those ops) types them first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortcompile.compile.partfiles import part_model_of
from ortcompile.compile.partition import PartitionPlan, plan_partition
from ortcompile.errors import CompilationFailed
from ortcompile.native import return_freed_memory
from ortcompile.onnxfacts import stored_nbytes
from ortcompile.optiontable import PARTITION_AUTO
from ortcompile.plan.planner import DEFAULT_CONTEXT_SIZE
from ortcompile.plan.shapes import Pins, apply_pins
from ortcompile.readback.given import Given
from ortcompile.run.sessions import LEAN_CONFIG, open_session

AUTO = PARTITION_AUTO  # --partition auto: parts only when the weights would make a context over the EP's limit
# What QNN holds while it compiles a weight, per stored byte, where that is more than the stored byte: the packed int4
# weights of MatMulNBits (input 1) cost ~2.8x what as many fp32 bytes do (measured on the builder's int4 Llamas:
# docs/performance.md). Parts are sized by the compile's memory, so these count at that size.
HELD_PER_STORED_BYTE = {("MatMulNBits", 1): 3}


def part_budget(partition: int | None, weight_bytes: int) -> int | None:
    """Bytes of weights (as QNN holds them: held_bytes) per part, or None when the graphs compile whole (they fit in one part)."""
    if partition is None:
        return None
    budget = partition or DEFAULT_CONTEXT_SIZE
    return budget if weight_bytes > budget else None


def weight_bytes(path: Path) -> int:
    """The graph's weights as the EP's compile holds them (held_bytes)."""
    import onnx

    return sum(held_bytes(onnx.load_model(str(path), load_external_data=False)).values())


def held_bytes(model: Any) -> dict[str, int]:
    """Each initializer's stored bytes, times HELD_PER_STORED_BYTE where the node reading it makes the compile hold
    more (int4 weights): a part budget bounds the compile's memory, which the file's bytes understate."""
    sizes = {t.name: stored_nbytes(t) or 0 for t in model.graph.initializer}
    factors: dict[str, int] = {}
    for node in model.graph.node:
        for index, name in enumerate(node.input):
            factor = HELD_PER_STORED_BYTE.get((node.op_type, index), 1)
            if name in sizes and factor > factors.get(name, 1):
                factors[name] = factor
    return {name: size * factors.get(name, 1) for name, size in sizes.items()}


def split_stages(graphs: dict[str, Path], pins: dict[str, dict[str, int]], budget: int) -> dict[str, list[Path]]:
    """Each stage's graph (pins applied) cut into parts written beside it (`<stem>.partNN.onnx`, reading the same
    data file); the same cut for every stage."""
    import onnx

    parts: dict[str, list[Path]] = {}
    plans: dict[str, PartitionPlan] = {}
    for stage, path in graphs.items():
        model = onnx.load_model(str(path), load_external_data=False)
        apply_pins(model, Pins(named=pins[stage]))
        types = _typed(model)
        sizes = held_bytes(model)
        if not plans:  # the first stage sets the budget for all: the same cuts in every stage
            budget = even_budget(model, sizes, budget)
        plans[stage] = plan_partition(model, sizes, budget)
        parts[stage] = []
        for part in plans[stage].parts:
            target = path.with_name(f"{path.stem}.part{part.index:02d}.onnx")
            onnx.save_model(part_model_of(model, part, types), str(target))
            parts[stage].append(target)
    cuts = {stage: [(p.start, p.stop) for p in plan.parts] for stage, plan in plans.items()}
    if len({tuple(c) for c in cuts.values()}) != 1:  # the pairs would hold different weights: nothing to share
        raise CompilationFailed(f"cannot partition: the prefill and decode graphs were cut at different nodes ({cuts})")
    return parts


def even_budget(model: Any, sizes: dict[str, int], budget: int) -> int:
    """The smallest budget that cuts `model` into as few parts as `budget` does. A part pair's compile peak follows
    its weights, so n even parts peak lower than n - 1 full ones and a small last one (the 0.70 GB int4 Llama:
    1.00 + 0.31 GiB held at the 1 GiB budget, 4.49 GiB peak)."""
    fewest = len(plan_partition(model, sizes, budget).parts)
    low, high = 1, budget  # invariant: `high` makes `fewest` parts
    while low < high:
        middle = (low + high) // 2
        if len(plan_partition(model, sizes, middle).parts) <= fewest:
            high = middle
        else:
            low = middle + 1
    return high


def part_check_inputs(parts: list[Path], given: dict[str, Given]) -> list[dict[str, Given]]:
    """Each part's inputs for the pre-publish check: the graph's decoder inputs (inputs.py) it reads, and the hidden
    states the earlier (uncompiled) parts compute from them on the CPU, as genai would hand them on."""
    values = {name: g.value for name, g in given.items()}
    origin = next(iter(given.values())).origin
    result = []
    for path in parts:  # lean sessions (no prepacked copy of the weights), one at a time, in this process
        session = open_session(path, None, config={LEAN_CONFIG: "1"}, label=f"{path.name} on the CPU EP").session
        names = [i.name for i in session.get_inputs()]
        result.append({n: Given(values[n], origin if n in given else f"{origin}: computed by the earlier parts on the CPU") for n in names})
        values.update(zip([o.name for o in session.get_outputs()], session.run(None, {n: values[n] for n in names})))
        del session
    return_freed_memory()  # (the worker compiles next: this process should not hold what the parts' sessions used)
    return result


def _typed(model: Any) -> dict[str, Any]:  # tensor name -> onnx.ValueInfoProto (onnx is imported only when parts are cut)
    """Every tensor's type with the pins in place, contrib ops included (ONNX Runtime's symbolic shape inference)."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    try:
        inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=False, guess_output_rank=False)
    except Exception as exc:
        raise CompilationFailed(f"cannot partition: shape inference fails on the decoder ({type(exc).__name__}: {exc})") from exc
    graph = inferred.graph
    return {v.name: v for v in (*graph.value_info, *graph.input, *graph.output)}
