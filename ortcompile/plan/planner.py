"""The planner: everything a compile decides before any byte moves, once, as frozen data.

`plan_source` reads and checks the source against the options (its EP, the pinned dims, whether the EP must
compile); `plan_compile` adds where the output goes and what the check and --verify will do. Drivers
(compile/job.py, compile/split.py, compile/parts.py) and the passes read these records; nothing writes them again.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path

from ortcompile import eps
from ortcompile.eps.request import EpRequest, ep_precision
from ortcompile.errors import OrtCompileWarning, UsageError
from ortcompile.jsonedge import JsonObject
from ortcompile.naming import OutputNames, OutputTarget
from ortcompile.options import ALL_REFUSAL_OFFERS, AUTO_RUN_LIMIT, CompileOptions, GivenInputs, effective_check
from ortcompile.optiontable import CriterionSettings
from ortcompile.plan.shapes import Pins, require_static, resolve_pins
from ortcompile.plan.source import SourceModel, read_source
from ortcompile.sizes import format_size

DEFAULT_CONTEXT_SIZE = 1 << 30  # HTP: one graph over ~2 GB fails to finalize; ~1 GB ones compile


class _Planned:
    """What both plans answer from their source, EP and options."""

    source: SourceModel
    ep: eps.ResolvedEp
    pins: Pins
    require_compiled: bool
    options: CompileOptions
    request: EpRequest

    @property
    def compiles(self) -> bool:
        return self.ep.info.compiles

    @property
    def precision(self) -> str:
        return ep_precision(self.ep, self.source.op_counts)

    @property
    def part_budget(self) -> int:
        """--partition: the bytes of weights per part, decided here once: SIZE, else --max-context-size, else the EP's
        graph limit (`auto`: PartitionOptions.budget None)."""
        assert self.options.partition is not None
        return self.options.partition.budget or self.options.max_context_size or DEFAULT_CONTEXT_SIZE

    @property
    def part_options(self) -> CompileOptions:
        """--partition: the options each part is compiled with."""
        return part_options(self.options)

    def recorded_options(self) -> JsonObject:
        """The options that shape the output, as the manifest and the parts plan record them."""
        return self.options.recorded(self.ep.info.short_name, self.require_compiled, self.compiles)


@dataclass(frozen=True)
class SourcePlan(_Planned):
    """The source and how it is compiled: the EP resolved and checked, the pins, whether the EP must compile."""

    source: SourceModel
    ep: eps.ResolvedEp
    pins: Pins
    require_compiled: bool
    options: CompileOptions
    request: EpRequest  # --ep, --ep-option, --target, --ep-library as every session, probe and check asks for the EP: made once here


@dataclass(frozen=True)
class CheckPlan:
    """What the pre-publish check does (`mode` none, load or run) and what it feeds."""

    mode: str
    source: Path  # what the outputs are compared with (a parts plan when the source is not at hand: load only)
    request: EpRequest
    ep_label: str
    precision: str
    dims: dict[str, int]
    freeze: dict[str, int | float]  # fed to the source at their frozen values
    inputs: GivenInputs  # --input
    verify_criterion: CriterionSettings | None  # --verify's settings: the check judges by its criterion
    note: str | None = None  # said (-v) when the check starts: why it does less than asked
    offers: tuple[str, ...] = ALL_REFUSAL_OFFERS  # the options of the command the user ran that a refusal may suggest


@dataclass(frozen=True)
class VerifyPlan:
    """--verify: the staged output against the source on the CPU EP, by `criterion`."""

    source: Path
    dims: dict[str, int]
    freeze: dict[str, int | float]
    inputs: GivenInputs
    criterion: CriterionSettings
    offers: tuple[str, ...] = ALL_REFUSAL_OFFERS  # the options of the command the user ran that a refusal may suggest


@dataclass(frozen=True)
class CompilePlan(_Planned):
    """One model's compile, decided: the source plan, where it is published, what check and --verify do."""

    source: SourceModel
    ep: eps.ResolvedEp
    pins: Pins
    require_compiled: bool
    options: CompileOptions
    request: EpRequest
    target: OutputTarget  # where it is published: -o, resolved once by the driver's entry (job.py)
    check: CheckPlan
    verify: VerifyPlan | None

    @property
    def output_dir(self) -> Path:
        return self.target.directory

    @property
    def names(self) -> OutputNames:
        return self.target.names

    @property
    def inputs(self) -> list[Path]:
        """Files the output must never overwrite."""
        return [self.source.path, *self.source.external_files]

    @property
    def worker_label(self) -> str:
        """Who a crash in the worker child is blamed on."""
        return f"the {self.ep.info.short_name} EP" if self.compiles else "ONNX Runtime"


def plan_compile(source_path: Path, target: OutputTarget, options: CompileOptions) -> CompilePlan:
    """Every decision of one model's compile that can be made (and refused) before work starts."""
    planned = plan_source(source_path, options)
    return CompilePlan(planned.source, planned.ep, planned.pins, planned.require_compiled, options, planned.request, target,
                       _check_plan(planned), _verify_plan(planned))


def _check_plan(planned: SourcePlan) -> CheckPlan:
    options, source = planned.options, planned.source
    mode = effective_check(options.check, source.weight_bytes)
    note = None
    if options.check == "auto" and mode == "load":  # only when auto actually downgraded the check
        note = (f"check: load only: {format_size(source.weight_bytes)} of weights (--check auto runs up to "
                f"{format_size(AUTO_RUN_LIMIT)}; --check run to run anyway)")
    return CheckPlan(mode, source.path, planned.request, planned.ep.info.short_name, planned.precision, planned.pins.named,
                     dict(options.freeze), dict(options.inputs), options.verify_criterion if options.verify else None, note,
                     options.refusal_offers())


def _verify_plan(planned: SourcePlan) -> VerifyPlan | None:
    options = planned.options
    if not options.verify:
        return None
    return VerifyPlan(planned.source.path, planned.pins.named, dict(options.freeze), dict(options.inputs), options.verify_criterion,
                      options.refusal_offers())


def plan_source(source_path: Path, options: CompileOptions) -> SourcePlan:
    """Read and check the source against the options: the model, its EP, the pinned dims, whether the EP must compile."""
    eps.check_names(options.ep, options.target, options.ep_library)  # typos first: no onnx or onnxruntime import yet
    source = read_source(source_path)
    ep = eps.resolve(options.ep, options.ep_options, target=options.target, library=options.ep_library, validate=True)
    prepares = ep.info.compiles and options.prepare
    # Pins go into the graph (the prepare step, or the pass-through's re-layout); only a compiling EP without
    # the prepare step falls back to ORT's free-dimension overrides, which reach named dims only.
    pins = resolve_pins(source, options.fix_dims, options.fix_shapes, allow_unnamed=prepares or not ep.info.compiles)
    if options.freeze and ep.info.compiles and not options.prepare:
        raise UsageError("--freeze specializes the model in the prepare step: drop --no-prepare")
    if ep.info.compiles and _needs_static_shapes(ep):
        require_static(source, pins, ep.info.short_name, frozen=set(options.freeze))
    require = ep.info.compiles if options.require_compiled is None else options.require_compiled
    _warn_oversized_for_shards(source, options.layout.shard_size)
    return SourcePlan(source, ep, pins, require, options, ep_request(options))


def _warn_oversized_for_shards(source: SourceModel, shard_size: int | None) -> None:
    """A tensor never straddles data files: one larger than --shard-size gets a file of its own, over the size."""
    oversized = [t for t in source.tensors if shard_size and t.nbytes > shard_size]
    if oversized:
        largest = max(oversized, key=lambda t: t.nbytes)
        warnings.warn(f"--shard-size {shard_size}: {len(oversized)} tensor{'s are' if len(oversized) > 1 else ' is'} larger "
                      f"(largest {largest.name!r}, {largest.nbytes} bytes) and get a data file of their own, over that size",
                      OrtCompileWarning, stacklevel=3)


def part_options(options: CompileOptions) -> CompileOptions:
    """Each part: the same EP, options, target and layout; no pins (a part's shapes are static), nothing frozen
    (the split applied it), no --verify (the stitched model is verified), replaced if a stage is retried. A part the
    EP takes nothing of stays on the CPU EP, as those nodes would in a whole compile ('nothing compiled' is judged
    on the stitched model)."""
    return dataclasses.replace(options, fix_dims={}, fix_shapes={}, freeze={}, partition=None, max_context_size=None,
                               force=True, if_changed=False, verify=False, inputs={}, require_compiled=False,
                               output_name=None, compatibility=False, lint=False, offers=options.refusal_offers())


def ep_request(options: CompileOptions) -> EpRequest:
    return EpRequest(options.ep, options.ep_options, options.target, options.ep_library)


def _needs_static_shapes(ep: eps.ResolvedEp) -> bool:
    return bool(ep.info.static_shapes)
