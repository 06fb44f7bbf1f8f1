"""EP-aware graph fixes of the prepare step: fused ops an EP refuses, rewritten into standard ops it takes, and
ops it supports but filters off by default, turned on with a provider option.

Kept as data per EP (EP_FIXES), general rather than per model. Measured with onnxruntime-qnn 2.7.0 on an
onnxruntime-genai builder decoder: QNN refuses SkipSimplifiedLayerNormalization (and SkipLayerNormalization,
and every Einsum), so each left a CPU node between two NPU partitions: 25 EPContext nodes and 24 CPU nodes.
Split into Add + (Simplified)LayerNormalization, and with GroupQueryAttention turned on through QNN's
`op_affinity` provider option (a JSON file `{"op_type": {"GroupQueryAttention": "htp"}}`; QNN otherwise logs
"filtered off QNN by the op_affinity provider option"), the same model compiles to one EPContext node.

Every rewrite keeps the node's output names, so the graph's inputs, outputs and every consumer stay as they were.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile.jsonedge import JsonObject
from ortcompile.onnxfacts import attribute, iter_graphs

MS_DOMAIN = "com.microsoft"
AFFINITY_OPTION = "op_affinity"  # onnxruntime-qnn: the path of a JSON file {"op_type": {OP: BACKEND}}
AFFINITY_FILE = "op_affinity.json"
PINS_FILE = ".cpu_nodes.json"  # --cpu-nodes' own op_affinity file, in the staging directory (compile/cpunodes.py)

# A decomposition returns the nodes replacing `node`, or None when this node's form has none (left as it is).
Decomposition = Callable[[Any, set[str]], "list[Any] | None"]


@dataclass(frozen=True)
class EpFixes:
    """What one EP needs done to a graph: decompositions by op type, and ops to turn on by provider option."""

    decompose: dict[str, Decomposition] = field(default_factory=dict)
    affinity: dict[str, str] = field(default_factory=dict)  # op type -> backend, written to the op_affinity file
    affinity_backends: tuple[str, ...] = ()  # the option only applies when the session runs one of these backends
    # ORT optimizers the prepare step must not run for this EP: fusions that make its compile slower and that the
    # raw Compile API does not apply either (names as ORT's `disabled_optimizers` takes them)
    disabled_optimizers: tuple[str, ...] = ()


@dataclass
class FixReport:
    """What was done to the graph (for the manifest and -v) and the provider options to add."""

    decomposed: dict[str, int] = field(default_factory=dict)  # op type -> nodes rewritten
    kept: dict[str, int] = field(default_factory=dict)  # op type -> nodes of a form with no decomposition
    enabled: dict[str, str] = field(default_factory=dict)  # op type -> backend, turned on by provider option
    provider_options: dict[str, str] = field(default_factory=dict)

    def to_record(self) -> list[JsonObject]:
        records: list[JsonObject] = [{"fix": "decompose", "op_type": op, "nodes": n} for op, n in sorted(self.decomposed.items())]
        records += [{"fix": "provider_option", "option": AFFINITY_OPTION, "op_type": op, "backend": b} for op, b in sorted(self.enabled.items())]
        return records

    def describe(self) -> str:
        parts = [f"{op} x{n} -> standard ops" for op, n in sorted(self.decomposed.items())]
        parts += [f"{op} enabled ({AFFINITY_OPTION}: {b})" for op, b in sorted(self.enabled.items())]
        parts += [f"{op} x{n} kept (no decomposition of its form)" for op, n in sorted(self.kept.items())]
        return "EP fixes: " + ("; ".join(parts) if parts else "none needed")


def apply_ep_fixes(model: Any, ep_name: str, out_dir: Path, ep_options: dict[str, str]) -> FixReport:
    """Rewrite `model` in place for `ep_name`; write the affinity file into `out_dir` when one is needed."""
    fixes = EP_FIXES.get(ep_name)
    report = FixReport()
    if fixes is None:
        return report
    for site in iter_graphs(model):
        _decompose_graph(site.graph, fixes, report, _used_names(model))
    if report.decomposed:
        _ensure_opsets(model)
    present = {node.op_type for site in iter_graphs(model) for node in site.graph.node}
    pins = _own_pins(ep_options.get(AFFINITY_OPTION), out_dir)
    if pins is None or _backend(ep_options) not in fixes.affinity_backends:
        return report  # the user's own op_affinity file stands as given
    wanted = {op: backend for op, backend in fixes.affinity.items() if op in present and op not in pins}
    if wanted:
        path = out_dir / AFFINITY_FILE
        path.write_text(json.dumps({"op_type": {**pins, **wanted}}, sort_keys=True))
        report.enabled, report.provider_options = wanted, {AFFINITY_OPTION: str(path.absolute())}  # the worker chdirs
    return report


def _own_pins(given: str | None, out_dir: Path) -> dict[str, str] | None:
    """The op types already in the op_affinity file the EP is given: {} for none, the CPU pins when the file is
    --cpu-nodes' own (in this compile's staging directory, beside `out_dir`: merged, so GroupQueryAttention stays
    on the NPU while pinned ops leave it), None for a file the user gave (never rewritten)."""
    if given is None:
        return {}
    path = Path(given)
    if path.name != PINS_FILE or path.parent.absolute() != out_dir.parent.absolute():
        return None
    return dict(json.loads(path.read_text())["op_type"])


def _backend(ep_options: dict[str, str]) -> str:
    if "backend_type" in ep_options:
        return ep_options["backend_type"].lower()
    path = ep_options.get("backend_path", "")
    return "htp" if not path or "Htp" in Path(path).name else Path(path).name


def _decompose_graph(graph: Any, fixes: EpFixes, report: FixReport, used: set[str]) -> None:
    consumed = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    rewritten: list[Any] = []
    changed = False
    for node in graph.node:
        decompose = fixes.decompose.get(node.op_type) if node.domain in _DOMAINS.get(node.op_type, ("",)) else None
        replacement = decompose(node, consumed) if decompose else None
        if replacement is None:
            if decompose:
                report.kept[node.op_type] = report.kept.get(node.op_type, 0) + 1
            rewritten.append(node)
            continue
        _name_new_tensors(replacement, node, used)
        rewritten.extend(replacement)
        report.decomposed[node.op_type] = report.decomposed.get(node.op_type, 0) + 1
        changed = True
    if changed:
        del graph.node[:]
        graph.node.extend(rewritten)


def _used_names(model: Any) -> set[str]:
    names: set[str] = set()
    for site in iter_graphs(model):
        graph = site.graph
        names |= {n for node in graph.node for n in (*node.input, *node.output)}
        names |= {v.name for v in (*graph.input, *graph.output)} | {t.name for t in graph.initializer}
    return names


def _name_new_tensors(nodes: list[Any], origin: Any, used: set[str]) -> None:
    """Intermediate tensors are named `<node>/<suffix>`, made unique against every name in the model."""
    base = origin.name or origin.output[0]
    renames: dict[str, str] = {}
    for index, node in enumerate(nodes):
        node.name = f"{base}/{node.op_type}_{index}"
        for position, name in enumerate(node.output):
            if name.startswith("@"):
                unique = f"{base}/{name[1:]}"
                while unique in used:
                    unique += "_"
                used.add(unique)
                renames[name] = unique
                node.output[position] = unique
        for position, name in enumerate(node.input):
            if name in renames:
                node.input[position] = renames[name]


def _ensure_opsets(model: Any) -> None:
    """The decompositions use default-domain ops (LayerNormalization needs opset 17 there, else ORT's own)."""
    if not any((o.domain or "") in ("", "ai.onnx") for o in model.opset_import):
        model.opset_import.add(domain="", version=17)


def _float_attr(node: Any, name: str, default: float) -> float:
    found = attribute(node, name)
    return found.f if found is not None else default


def _unused(node: Any, consumed: set[str], positions: tuple[int, ...]) -> bool:
    return all(i >= len(node.output) or not node.output[i] or node.output[i] not in consumed for i in positions)


def _skip_sum(node: Any, bias_index: int) -> tuple[list[Any], str]:
    """Add(input, skip) [+ bias], written to the fused node's optional sum output when it has one."""
    from onnx import helper

    has_bias = len(node.input) > bias_index and node.input[bias_index]
    named_sum = node.output[3] if len(node.output) > 3 and node.output[3] else ""
    first = "@skip_sum" if has_bias or not named_sum else named_sum
    nodes = [helper.make_node("Add", [node.input[0], node.input[1]], [first])]
    if has_bias:
        nodes.append(helper.make_node("Add", [first, node.input[bias_index]], [named_sum or "@skip_bias_sum"]))
    return nodes, nodes[-1].output[0]


def decompose_skip_simplified_layer_norm(node: Any, consumed: set[str]) -> list[Any] | None:
    """SkipSimplifiedLayerNormalization(input, skip, gamma[, bias]) -> Add [+ Add] + SimplifiedLayerNormalization."""
    from onnx import helper

    if not _unused(node, consumed, (1, 2)):  # mean / inv_std_var read by someone: no standard op gives them
        return None
    nodes, total = _skip_sum(node, bias_index=3)
    nodes.append(helper.make_node("SimplifiedLayerNormalization", [total, node.input[2]], [node.output[0]], axis=-1,
                                  epsilon=_float_attr(node, "epsilon", 1e-5)))
    return nodes


def decompose_skip_layer_norm(node: Any, consumed: set[str]) -> list[Any] | None:
    """SkipLayerNormalization(input, skip, gamma[, beta][, bias]) -> Add [+ Add] + LayerNormalization."""
    from onnx import helper

    if not _unused(node, consumed, (1, 2)):
        return None
    nodes, total = _skip_sum(node, bias_index=4)
    scale_bias = [node.input[2]] + ([node.input[3]] if len(node.input) > 3 and node.input[3] else [])
    nodes.append(helper.make_node("LayerNormalization", [total, *scale_bias], [node.output[0]], axis=-1,
                                  epsilon=_float_attr(node, "epsilon", 1e-12)))
    return nodes


def decompose_einsum(node: Any, consumed: set[str]) -> list[Any] | None:
    """Two-operand Einsum with batch letters, one contracted letter and one free letter per operand (or any number
    of A's against a plain matrix B: "abc,cd->abd") -> MatMul, with Transposes where the letters are not in MatMul
    order; one-operand permutations -> Transpose."""
    found = attribute(node, "equation")
    if found is None:
        return None
    plan = einsum_plan(found.s.decode() if isinstance(found.s, bytes) else found.s)
    if plan is None or len(plan.operand_perms) != len(node.input):
        return None
    return plan.nodes(list(node.input), node.output[0])


@dataclass(frozen=True)
class EinsumPlan:
    operand_perms: tuple[tuple[int, ...] | None, ...]  # Transpose of each operand first (None: as it is)
    matmul: bool
    output_perm: tuple[int, ...] | None

    def nodes(self, inputs: list[str], output: str) -> list[Any]:
        from onnx import helper

        nodes, operands = [], []
        for index, (name, perm) in enumerate(zip(inputs, self.operand_perms)):
            if perm is None:
                operands.append(name)
                continue
            nodes.append(helper.make_node("Transpose", [name], [f"@operand{index}_t"], perm=list(perm)))
            operands.append(nodes[-1].output[0])
        if self.matmul:
            nodes.append(helper.make_node("MatMul", operands, ["@matmul" if self.output_perm else output]))
            operands = [nodes[-1].output[0]]
        if self.output_perm or not nodes:
            nodes.append(helper.make_node("Transpose", operands, [output], perm=list(self.output_perm or ())))
        else:
            nodes[-1].output[0] = output
        return nodes


def einsum_plan(equation: str) -> EinsumPlan | None:
    """How an Einsum equation is MatMul/Transpose, or None (ellipses, traces, sums, outer products...)."""
    text = equation.replace(" ", "")
    if "->" not in text or "." in text:
        return None
    lhs, out = text.split("->")
    operands = lhs.split(",")
    if any(len(set(o)) != len(o) for o in (*operands, out)) or not all(o.isalpha() for o in (*operands, out)):
        return None
    if len(operands) == 1:
        (a,) = operands
        if sorted(a) != sorted(out):
            return None
        perm = _perm(a, list(out))
        return EinsumPlan((None,), False, perm) if perm else None  # (an identity Einsum is left as it is)
    if len(operands) != 2:
        return None
    a, b = operands
    batch = [c for c in out if c in a and c in b]
    m = [c for c in a if c in out and c not in b]  # A's free letters (several only when B is a plain matrix)
    n = [c for c in b if c in out and c not in a]
    k = [c for c in a if c in b and c not in out]
    if len(k) != 1 or len(n) != 1 or not m or (len(m) > 1 and batch) or set(a) | set(b) != set(out) | set(k):
        return None
    a_order, b_order, product = [*batch, *m, k[0]], [*batch, k[0], n[0]], [*batch, *m, n[0]]
    return EinsumPlan((_perm(a, a_order), _perm(b, b_order)), True, _perm("".join(product), list(out)))


def _perm(have: str, want: list[str]) -> tuple[int, ...] | None:
    perm = tuple(have.index(c) for c in want)
    return None if perm == tuple(range(len(have))) else perm


_DOMAINS = {"SkipSimplifiedLayerNormalization": (MS_DOMAIN,), "SkipLayerNormalization": (MS_DOMAIN,), "Einsum": ("", "ai.onnx")}

# Per EP (its ONNX Runtime name): what it refuses and how to rewrite it; what it filters off and how to turn it on.
EP_FIXES: dict[str, EpFixes] = {
    "QNNExecutionProvider": EpFixes(
        decompose={
            "SkipSimplifiedLayerNormalization": decompose_skip_simplified_layer_norm,
            "SkipLayerNormalization": decompose_skip_layer_norm,
            "Einsum": decompose_einsum,
        },
        affinity={"GroupQueryAttention": "htp"},
        affinity_backends=("htp",),
        # MatMul+Add -> Gemm: measured on bench_whole_qnn.py's 1.6 GB chain, the raw Compile API took 19.3 s on the fused
        # graph against 15.0 s on the source's MatMul+Add pairs (QNN compiles each Gemm slower); the source's form
        # compiles to the same EPContext nodes and matches the CPU EP within fp16 noise
        disabled_optimizers=("MatMulAddFusion",),
    ),
}


def disabled_optimizers(ep_name: str) -> list[str]:
    """The ORT optimizers the prepare step leaves out for this EP (EpFixes.disabled_optimizers)."""
    fixes = EP_FIXES.get(ep_name)
    return list(fixes.disabled_optimizers) if fixes else []


def fixable_ops(ep_name: str) -> set[str]:
    """Op types this EP has a fix for (the fragmentation warning names the ones it has none for)."""
    fixes = EP_FIXES.get(ep_name)
    return set(fixes.decompose) | set(fixes.affinity) if fixes else set()
