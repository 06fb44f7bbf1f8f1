"""The prepare step: the graph a compiling EP sees, made static and folded (runs in the worker child).

Real models arrive with dynamic dims and shape-computation glue (Shape -> Gather -> Concat -> Reshape).
NPU EPs take only the glue of such a graph, and the output does not load. Measured on real models
(PyPI wheels): pinning the dims in the graph itself, then ONNX Runtime's BASIC offline optimization
(constant folding, redundant-node elimination) turned each into one EPContext node that loads and
matches the CPU within fp16 noise, where free-dimension overrides alone did not.

Streaming: only the graph proto is parsed here (weights stay where they are); ORT reads the weights
through its own mapping of the source's data files and writes the optimized model with every
initializer over the inline threshold in one external data file. Peak memory is about the model's
size (measured 1.1x for a 2.15 GB model), below what the EP's compile needs afterwards.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile.compile.defaults import initializers_as_constants
from ortcompile.compile.epfixes import FixReport, apply_ep_fixes, disabled_optimizers
from ortcompile.compile.freeze import freeze_inputs
from ortcompile.compile.inplace import SetAside, restore, set_aside
from ortcompile.eps.sessionopts import session_options
from ortcompile.errors import CompilationFailed, InvalidModel, OutputError, ort_reason, output_error
from ortcompile.jsonedge import JsonObject
from ortcompile.native import native_stdout_to_stderr
from ortcompile.onnxfacts import iter_graphs
from ortcompile.paths import model_dir
from ortcompile.plan.shapes import Pins, apply_pins, value_dims
from ortcompile.run.sessions import LEAN_CONFIG

OPTIMIZATION = "ort-basic"


@dataclass(frozen=True)
class PrepareSummary:
    pins: JsonObject  # Pins.to_json: as the manifest's prepare record holds them
    nodes_before: int
    nodes_after: int
    removed_ops: dict[str, int]  # op type -> nodes the optimization removed (folded or eliminated)
    added_ops: dict[str, int]  # op type -> nodes it added (fusions)
    seconds: float
    frozen: dict[str, int | float] = field(default_factory=dict)  # --freeze: inputs the model was specialized on
    inlined: list[str] = field(default_factory=list)  # the Ifs those decided, and the branch each took
    ep_fixes: FixReport = field(default_factory=FixReport)  # EP-aware rewrites (epfixes.py) and the options they add
    disabled_optimizers: list[str] = field(default_factory=list)  # ORT optimizers left out for this EP (epfixes.py)
    constants: list[str] = field(default_factory=list)  # overridable initializers (graph inputs too) compiled as constants

    def describe(self) -> str:
        removed = ", ".join(f"{op} -{n}" for op, n in sorted(self.removed_ops.items(), key=lambda kv: -kv[1])[:8])
        frozen = f"frozen {', '.join(f'{k}={v}' for k, v in self.frozen.items())} ({len(self.inlined)} If taken); " if self.frozen else ""
        removed = f" ({removed})" if removed else ""
        fixes = f"; {self.ep_fixes.describe()}" if self.ep_fixes.to_record() or self.ep_fixes.kept else ""
        constants = f"; {len(self.constants)} overridable initializers compiled as constants" if self.constants else ""
        return f"prepare: {frozen}{self.nodes_before} -> {self.nodes_after} nodes after pinning and ORT basic optimization{removed}{fixes}{constants}"

    def to_record(self) -> JsonObject:
        """For the manifest: what was done to the graph (deterministic: no times)."""
        record = {"pins": self.pins, "optimization": OPTIMIZATION, "nodes_before": self.nodes_before, "nodes_after": self.nodes_after}
        if self.disabled_optimizers:
            record["disabled_optimizers"] = self.disabled_optimizers
        if self.frozen:
            record["frozen"] = self.frozen  # the compiled model computes what the source does for these values only
        if self.constants:
            record["constants"] = self.constants  # inputs of the source (with defaults) the compiled model does not take
        if self.ep_fixes.to_record():
            record["ep_fixes"] = self.ep_fixes.to_record()
        return record


def prepare_model(source: Path, pins: Pins, out_dir: Path, inline_threshold: int, weight_bytes: int = 0,
                  frozen: dict[str, int | float] | None = None, ep_name: str = "", ep_options: dict[str, str] | None = None,
                  source_paths: dict[str, Path] | None = None) -> tuple[Path, PrepareSummary, dict[str, Path]]:
    """Write `out_dir/<source name>` (+ `.data`): the source specialized on `frozen` inputs, with `ep_name`'s graph
    fixes (epfixes.py; its provider options come back in the summary), pins applied and ORT BASIC optimization.
    Returns also the data files the prepared model reads (location -> path): the weights the optimizer cannot
    change stay in the source's files (`source_paths`, hard-linked)."""
    import onnx

    clock = time.perf_counter()
    model = onnx.load_model(str(source), load_external_data=False)
    before = _op_counts(model)
    constants = initializers_as_constants(model)  # (and IR 4 at least: see defaults.py)
    inlined = freeze_inputs(model, frozen) if frozen else []
    out_dir.mkdir(parents=True, exist_ok=True)
    fixes = apply_ep_fixes(model, ep_name, out_dir, ep_options or {})
    disabled = disabled_optimizers(ep_name)
    apply_pins(model, pins)
    _infer_shapes(model)
    prepared = out_dir / source.name
    model_bytes = model.SerializeToString()
    aside = set_aside(model, source_paths or {}, out_dir, source.name, inline_threshold)
    optimized = None
    if aside is not None:
        optimized = _optimize_in_place(model.SerializeToString(), aside, source, prepared, inline_threshold, pins, weight_bytes, disabled)
    if optimized is None:
        aside = None
        _optimize(model_bytes, source, prepared, f"{prepared.name}.data", inline_threshold, pins, weight_bytes, disabled)
        optimized = onnx.load_model(str(prepared), load_external_data=False)
    if _prune_opsets(optimized) or aside is not None:
        onnx.save_model(optimized, str(prepared))  # the graph proto only: the weights stay in the .data files
    after = _op_counts(optimized)
    removed, added = Counter(before), Counter(after)
    removed.subtract(after)
    added.subtract(before)
    summary = PrepareSummary(pins.to_json(), sum(before.values()), sum(after.values()),
                             {op: n for op, n in removed.items() if n > 0}, {op: n for op, n in added.items() if n > 0},
                             time.perf_counter() - clock, dict(frozen or {}), inlined, fixes, disabled, constants)
    data_files = {f"{prepared.name}.data": prepared.with_name(f"{prepared.name}.data"), **(aside.source_files if aside else {})}
    return prepared, summary, data_files


def _infer_shapes(model: Any) -> None:
    """ONNX shape inference fills in output and intermediate shapes from the pins (best effort: ORT infers again)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception:
        return
    for declared, found in zip(model.graph.output, inferred.graph.output):
        if not (declared.type.HasField("tensor_type") and found.type.HasField("tensor_type")):
            continue  # a sequence or map output: writing a tensor shape into it would turn it into a tensor of no type
        if all(d.HasField("dim_value") for d in value_dims(found)) and len(value_dims(found)) == len(value_dims(declared)):
            declared.type.tensor_type.shape.CopyFrom(found.type.tensor_type.shape)
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)


def _optimize_in_place(aside_bytes: bytes, aside: SetAside, source: Path, prepared: Path, inline_threshold: int, pins: Pins,
                       weight_bytes: int, disabled: list[str]) -> Any | None:
    """The optimized graph with the set-aside weights never re-written (inplace.py): one ORT run, on the graph with
    them as inputs; None: fall back to one ordinary run (that run failed, or its graph cannot take them back)."""
    import onnx

    try:
        _optimize(aside_bytes, source, prepared, f"{prepared.name}.data", inline_threshold, pins, weight_bytes, disabled)
        optimized = onnx.load_model(str(prepared), load_external_data=False)
        restored = restore(optimized, aside)
    except Exception:
        restored = False
    if not restored:
        for path in aside.source_files.values():
            path.unlink(missing_ok=True)
        return None
    return optimized


def _optimize(model_bytes: bytes, source: Path, prepared: Path, data_name: str, inline_threshold: int, pins: Pins, weight_bytes: int,
              disabled: list[str]) -> None:
    options = _cpu_options(source, optimize=True)
    options.optimized_model_filepath = str(prepared)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", data_name)
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", str(max(1, inline_threshold)))
    try:
        _load(model_bytes, options, disabled)
    except Exception as exc:
        raise _prepare_failed(exc, model_bytes, source, pins, prepared.parent, weight_bytes, disabled) from exc


def _cpu_options(source: Path, optimize: bool) -> Any:
    import onnxruntime as ort

    level = ort.GraphOptimizationLevel
    # The pinned graph is passed as bytes: its external data is found in the source's own directory.
    return session_options(None, config={"session.model_external_initializers_file_folder_path": str(model_dir(source)), LEAN_CONFIG: "1"},
                           graph_optimization_level=level.ORT_ENABLE_BASIC if optimize else level.ORT_DISABLE_ALL)


def _load(model: bytes | str, options: Any, disabled: list[str] | None = None) -> None:
    import onnxruntime as ort

    with native_stdout_to_stderr(quiet_stderr=True):
        ort.InferenceSession(model, options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled or None)


def _prepare_failed(exc: Exception, model_bytes: bytes, source: Path, pins: Pins, prepared_dir: Path, weight_bytes: int,
                    disabled: list[str]) -> Exception:
    """Which of three things went wrong: the model itself (exit 3), the pins (exit 1), or writing the result (exit 4)."""
    try:
        _load(str(source), _cpu_options(source, optimize=False))
    except Exception as load_error:
        return InvalidModel(f"{source}: ONNX Runtime cannot load this model: {ort_reason(load_error)}", detail=str(load_error))
    try:
        _load(model_bytes, _cpu_options(source, optimize=True), disabled)  # the same optimization, nothing written
    except Exception:
        import onnx

        from ortcompile.readback.hints import freeze_suggestion

        shown = ", ".join(f"{k}={v}" for k, v in pins.named.items()) or "the given shapes"
        suggestion = freeze_suggestion(onnx.load_model(str(source), load_external_data=False)) or " (try other --fix-dim/--fix-shape values)"
        return CompilationFailed(f"{source.name}: with {shown} pinned, ONNX Runtime rejects the graph: {ort_reason(exc)}; "
                                 f"the model cannot be made static this way{suggestion}", detail=str(exc))
    return _write_error(prepared_dir, weight_bytes) or OutputError(f"cannot write the prepared model: {ort_reason(exc)}", detail=str(exc))


def _write_error(directory: Path, nbytes: int) -> OutputError | None:
    """ORT says only that writing failed; reserving the same space ourselves gets the OS's reason (ENOSPC, EFBIG...)."""
    probe = directory / ".space-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, max(1, nbytes))
        finally:
            os.close(fd)
    except OSError as exc:
        return output_error(exc, "the prepared model")
    finally:
        probe.unlink(missing_ok=True)
    return None


def _prune_opsets(model: Any) -> bool:
    """ORT's writer imports every domain it knows; keep the ones the graph uses (the output reads as its source)."""
    used = {node.domain or "" for site in iter_graphs(model) for node in site.graph.node} | {""}
    used |= {node.domain or "" for function in model.functions for node in function.node} | {f.domain for f in model.functions}
    keep = [o for o in model.opset_import if (o.domain or "") in used or o.domain == "ai.onnx"]
    if len(keep) == len(model.opset_import):
        return False
    del model.opset_import[:]
    model.opset_import.extend(keep)
    return True


def _op_counts(model: Any) -> Counter[str]:
    return Counter(node.op_type for site in iter_graphs(model) for node in site.graph.node)
