"""Per-node placement on an EP whose only control is per op type: cut the graph where the pinned nodes are.

QNN's `op_affinity` (cpunodes.py) keeps every node of an op type off the EP. When the nodes to keep off are only
some of their op type's nodes (one fragile `Log` beside ordinary ones), that would move the others too and cut the
EP's graph at each of them. Instead the graph is cut with the partition machinery (split.py, stitch.py), in graph
order, before and after each run of pinned nodes:

- the pinned nodes' parts are compiled with every op type they hold refused to the EP (op_affinity), so the EP
  takes nothing of them and they stay plain ONNX nodes, which ONNX Runtime runs on the CPU EP;
- the other parts are compiled for the EP as any model, with the op types pinned whole (all their nodes pinned)
  refused there through op_affinity, as a whole-model compile would;
- the compiled parts are stitched into one output, which plain onnxruntime loads with the EP: the EP takes the
  EPContext nodes of a model that has them, and leaves the plain nodes to the CPU EP.

A whole op type stays with op_affinity (one compile, no cut): `placement_of` decides per op type.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortcompile.compile.cpunodes import CpuPins, cpu_placement
from ortcompile.compile.finish import Built, Finished, FinishPlan, given_inputs
from ortcompile.compile.partpool import CompileOne, compile_parts
from ortcompile.compile.parts import COMPILED_DIR, PARTS_DIR
from ortcompile.compile.split import split_model
from ortcompile.compile.stitch import StitchJob
from ortcompile.errors import CompilationFailed, OrtCompileWarning
from ortcompile.onnxfacts import EPCONTEXT
from ortcompile.options import CompileOptions, CompileResult, PartitionOptions
from ortcompile.plan.planner import CompilePlan, part_options
from ortcompile.readback.lint import node_label


class CannotCut(CompilationFailed):
    """The graph cannot be cut where the pins are (a tensor between parts without a static shape): the caller moves
    the pinned nodes' whole op types instead."""


UNBOUNDED = 1 << 62  # no budget: without --partition, the graph is cut only around the pinned nodes
ALL_NODES = "*"  # --cpu-nodes glob naming every node of a part: the EP takes none of it


@dataclass(frozen=True)
class Placement:
    """How the pins reach the EP: op types refused whole (op_affinity) and single nodes kept off by cutting the graph."""

    op_types: tuple[str, ...] = ()  # sorted
    cut: tuple[str, ...] = ()  # node labels, in graph order
    cut_ops: tuple[str, ...] = ()  # their op types

    def describe(self, before: Placement | None = None) -> str:
        """`Add, Log` and/or `node log_small (Log) alone, cut out of the graph`: what moved (since `before`)."""
        before = before or Placement()
        types = [t for t in self.op_types if t not in before.op_types]
        cut = [(n, t) for n, t in zip(self.cut, self.cut_ops) if n not in before.cut]
        said = [", ".join(types)] if types else []
        if cut:
            nodes = ", ".join(f"{n} ({t})" for n, t in cut)
            said.append(f"node{'s' if len(cut) > 1 else ''} {nodes} alone, cut out of the graph (other {', '.join(sorted({t for _, t in cut}))} "
                        "nodes stay on the EP)")
        return "; ".join(said) or "nothing"


def placement_of(model: Any, pins: CpuPins) -> Placement:
    """Per pinned op type: op_affinity when every node of it in `model` is pinned (or the pins name none of its
    nodes there: a node of the prepared graph only), else a cut around the pinned nodes of it."""
    by_type: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.op_type != EPCONTEXT:
            by_type.setdefault(node.op_type, []).append(node_label(node))
    pinned = set(pins.nodes)
    whole, cut = [], set()
    for op_type in pins.op_types:
        named = [n for n in by_type.get(op_type, []) if n in pinned]
        if not named or len(named) == len(by_type[op_type]):
            whole.append(op_type)
        else:
            cut.update(named)
    order = [(node_label(n), n.op_type) for n in model.graph.node if node_label(n) in cut]
    return Placement(tuple(sorted(whole)), tuple(n for n, _ in order), tuple(t for _, t in order))


def cut_points(model: Any, placement: Placement) -> tuple[list[int], list[bool]]:
    """Where to cut (node indices a part starts at) so that each run of cut nodes is a part of its own, and which
    nodes those parts hold. Nodes of the op types refused whole that sit next to such a run join it (one part less
    for the EP); the others stay in the EP's parts, refused there by op_affinity."""
    wanted = set(placement.cut)
    nodes = list(model.graph.node)
    on_cpu = [node_label(n) in wanted for n in nodes]
    whole = [n.op_type in placement.op_types for n in nodes]
    for order in (range(1, len(nodes)), range(len(nodes) - 2, -1, -1)):
        for i in order:
            neighbour = i - 1 if order.step == 1 else i + 1
            on_cpu[i] = on_cpu[i] or (whole[i] and on_cpu[neighbour])
    return [i for i in range(1, len(on_cpu)) if on_cpu[i] != on_cpu[i - 1]], on_cpu


class PlacedStitch(StitchJob):
    """The stitch of a placement: its manifest and result are the compile's (its options, `cpu_nodes`), not a split's."""

    compile_plan: CompilePlan
    state: Any  # fallback.py's FallbackState: what moved, and (read back here) what runs on the CPU EP

    def finish_plan(self, staging_dir: Path) -> FinishPlan:
        plan = super().finish_plan(staging_dir)
        self.state.placement = cpu_placement(staging_dir / self.names.model)  # staged by now: what really runs where
        record = dataclasses.replace(plan.manifest, options=self.compile_plan.recorded_options(), cpu_nodes=self.state.record(None))
        return dataclasses.replace(plan, manifest=record)

    def result(self, built: Built, finished: Finished) -> CompileResult:
        result = super().result(built, finished)
        result.fallback = self.state.to_result(finished.check.report)
        return result


def placed_stitch(plan: CompilePlan, placement: Placement, staging_dir: Path, job: Any, compile_one: CompileOne, state: Any) -> PlacedStitch:
    """Split `plan`'s source around `placement.cut` (and by --partition's budget) into `staging_dir`, compile the parts
    (the cut ones with the EP taking nothing) and the StitchJob that joins them there. `job`: the CompileJob (reporter, timings, created dirs);
    `state`: the fallback's (fallback.py), whose record goes into the manifest and the result."""
    options = plan.options
    model = state.model  # the source's graph, read once by the fallback's start (cpunodes resolved the pins in it)
    assert model is not None, "a cut needs pins, and pins are resolved in the graph"
    cuts, on_cpu = cut_points(model, placement)
    parts_dir, compiled_dir = staging_dir / PARTS_DIR, staging_dir / COMPILED_DIR
    parts_dir.mkdir()
    compiled_dir.mkdir()
    clock = time.perf_counter()
    if placement.cut:
        job.reporter.stage(f"cutting {plan.source.path.name} around {len(placement.cut)} node{'s' if len(placement.cut) > 1 else ''} for the CPU EP")
    else:
        job.reporter.stage(f"splitting {plan.source.path.name}")
    partition = options.partition or PartitionOptions(None)
    budget = plan.part_budget if options.partition else UNBOUNDED
    as_split = dataclasses.replace(options, cpu_nodes=(), fallback="off", partition=partition)
    try:  # (the parts plan records the options as a split's: the parts compile them; the manifest records the compile's)
        split = split_model(dataclasses.replace(plan, options=as_split), parts_dir, budget, link_sources=True,
                            given=given_inputs(options.freeze, options.inputs) if options.inputs else None, cuts=cuts)
    except CompilationFailed as exc:  # (not UsageError: a wrong --input is the user's to fix either way)
        if options.partition:
            raise  # --partition cannot be split either: no whole compile to fall back on
        raise CannotCut(exc.message, exc.detail) from exc
    job.timings["split"] = time.perf_counter() - clock
    by_name = {name: index for index, name in enumerate(split.parts)}
    cpu_parts = {k for k, spec in enumerate(split.plan.parts) if all(on_cpu[spec.start : spec.stop])}
    whole = set(placement.op_types)

    def compile_part(path: Path, out: Path, part: CompileOptions) -> CompileResult:
        index = by_name[path.name]
        part = dataclasses.replace(part, check="none")  # the stitched model is checked against the source, on the user's inputs
        if index in cpu_parts:  # nothing of it for the EP: plain nodes
            part = dataclasses.replace(part, cpu_nodes=(ALL_NODES,), prepare=False)
        else:
            spec = split.plan.parts[index]
            held = {n.op_type for n in model.graph.node[spec.start : spec.stop]}
            part = dataclasses.replace(part, cpu_nodes=tuple(f"op:{t}" for t in sorted(held & whole)))
        return compile_one(path, out, part)

    clock = time.perf_counter()
    with warnings.catch_warnings():  # the cut parts compile to nothing on purpose; the stitched graph's fragmentation is judged
        warnings.filterwarnings("ignore", r".*compiled no nodes \(--allow-partial\)", OrtCompileWarning)
        warnings.filterwarnings("ignore", r".*\.part\d+\.onnx: the \S+ graph is fragmented", OrtCompileWarning)
        try:
            results = compile_parts(split, compiled_dir, part_options(as_split), partition, compile_part, job.reporter)
        except CompilationFailed as exc:  # a part the EP cannot take as cut (e.g. a tensor between parts QNN finds dynamic)
            if options.partition:
                raise  # --partition cannot compile whole either
            raise CannotCut(exc.message, exc.detail) from exc
    job.timings["compile"] = time.perf_counter() - clock
    stitch = PlacedStitch(split.parts_plan, compiled_dir, plan.target, options, plan.ep,
                          plan.source.path, job.reporter, plan.inputs, created_dirs=job.created_dirs,
                          timings=job.timings, part_results=results, pinned=frozenset(whole | set(placement.cut_ops)))
    stitch.compile_plan, stitch.state = plan, state
    return stitch

