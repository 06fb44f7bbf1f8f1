"""Pass 1: the EP step — prepare, then ONNX Runtime's compile with the data pass inside it (worker child);
or, when the EP compiles nothing, the re-layout of the source's weights (this process).

Both produce the same `EpStepOutput`: the small graph proto still to be finished by pass 2, and the data
files already written into the staging directory, hashed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ortcompile.compile.datapass import DataPass, FileSink
from ortcompile.compile.ortstep import NothingCompiled, OrtCompile, compile_with_ort, ep_compiles_anything
from ortcompile.compile.prepare import PrepareSummary, prepare_model
from ortcompile.compile.relayout import relayout
from ortcompile.eps.request import EpRequest
from ortcompile.layout import DataLayout, LayoutPolicy
from ortcompile.output.digest import WrittenFile
from ortcompile.plan.shapes import Pins
from ortcompile.plan.source import SourceModel
from ortcompile.progress import Reporter

PREPARE_DIR = ".prepare"  # inside the staging directory: never published, removed with it


@dataclass(frozen=True)
class EpStep:
    """Everything pass 1 needs, decided by the plan before any byte moves."""

    source: SourceModel
    ep: EpRequest
    staging_dir: Path
    model_name: str  # the output model's file name: data files and EP blobs are named after it
    layout: LayoutPolicy
    pins: Pins
    prepare: bool  # pin the dims in the graph and fold constants before the EP sees it
    require_compiled: bool
    session_config: dict[str, str] = field(default_factory=dict)
    frozen: dict[str, int | float] = field(default_factory=dict)  # --freeze: inputs to specialize the model on


@dataclass
class EpStepOutput:
    graph_proto: bytes
    data_files: list[WrittenFile]
    external_count: int
    inline_count: int
    seconds: dict[str, float]  # prepare, compile (ORT's whole call), data_pass (inside compile)
    prepare: PrepareSummary | None = None


def run_ep_step(step: EpStep, reporter: Reporter, data_pass: DataPass | None = None) -> EpStepOutput:
    """In the worker child: optionally prepare, then compile with ORT; the data pass writes as ORT asks.

    A weight-sharing batch passes its one `data_pass` for every model (it is finished by the batch).
    """
    ep = step.ep.resolve()
    seconds: dict[str, float] = {}
    model, source_files, overrides, summary = step.source.path.absolute(), step.source.external_paths, step.pins.named, None
    if step.prepare:
        reporter.stage(f"preparing {step.source.path.name}: pinning shapes, folding constants")
        model, summary, source_files = prepare_model(model, step.pins, step.staging_dir / PREPARE_DIR, step.layout.inline_threshold,
                                                     step.source.weight_bytes, step.frozen, ep.name, ep.options, step.source.external_paths)
        ep.options = {**ep.options, **summary.ep_fixes.provider_options}  # e.g. QNN's op_affinity file
        seconds["prepare"] = summary.seconds
        reporter.detail(summary.describe())
        overrides = {}
    reporter.stage(f"compiling {step.source.path.name} with {ep.name}")
    clock = time.perf_counter()
    request = OrtCompile(model, ep, step.staging_dir / step.model_name, overrides, step.require_compiled, step.session_config)

    shared = data_pass

    def new_data_pass() -> DataPass:
        if shared is not None:
            shared.use_sources(source_files)
            return shared
        progress = reporter.bytes_bar("data pass", step.source.weight_bytes)
        return DataPass(FileSink(step.staging_dir), step.model_name, DataLayout(step.layout), progress, source_files=source_files)

    try:
        output, data_pass = compile_with_ort(request, new_data_pass, reporter.detail)
    except NothingCompiled as exc:
        exc.ep_starts = ep_compiles_anything(ep)  # tell "the EP takes none of these ops" from "the EP cannot start"
        exc.model = step.source.path.name
        raise
    data_files = data_pass.finish() if shared is None else []
    seconds["compile"] = time.perf_counter() - clock
    seconds["data_pass"] = data_pass.seconds
    return EpStepOutput(output.graph_proto, data_files, data_pass.external_count, data_pass.inline_count, seconds, summary)


def run_relayout(step: EpStep, reporter: Reporter, data_pass: DataPass | None = None) -> EpStepOutput:
    """In this process, for EPs that compile nothing: the source graph as it is, weights re-laid out."""
    reporter.stage(f"laying out weights of {step.source.path.name}")
    clock = time.perf_counter()
    own = data_pass is None
    if data_pass is None:
        progress = reporter.bytes_bar("data pass", step.source.weight_bytes)
        data_pass = DataPass(FileSink(step.staging_dir), step.model_name, DataLayout(step.layout), progress)
    try:
        graph = relayout(step.source, data_pass, pins=step.pins, frozen=step.frozen)
    except BaseException:
        if own:
            data_pass.abandon()
        raise
    data_files = data_pass.finish() if own else []
    seconds = {"compile": time.perf_counter() - clock, "data_pass": data_pass.seconds}
    return EpStepOutput(graph, data_files, data_pass.external_count, data_pass.inline_count, seconds)


def ep_starts(request: EpRequest, reporter: Reporter) -> bool:
    """In the worker child: does the EP compile a one-node model with these options (False: it cannot start)?"""
    return ep_compiles_anything(request.resolve())
