"""`ortcompile bench`: run models as a pipeline through a SessionPool and check every output every cycle.

Each model gets one seeded input (seed + its position), so every cycle must reproduce the same outputs:
a later session replaying an earlier one's captured commands, or a reload that comes back wrong, shows up
as a mismatch. References are the model's own first run, or, with sources given, the source model on the
CPU EP (computed before the pool starts, one session at a time, then freed).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ortcompile.bench.residency import PoolEvent, SessionPool, peak_rss_since_reset, rss_bytes
from ortcompile.errors import VerificationFailed
from ortcompile.jsonedge import JsonObject
from ortcompile.native import peak_rss_bytes, reset_peak_rss, return_freed_memory
from ortcompile.readback.compare import OutputComparison, compare_output
from ortcompile.readback.criteria import Criterion, criterion_for
from ortcompile.readback.feeds import Arrays, make_feeds, specs_from_session
from ortcompile.readback.given import Given
from ortcompile.readback.hints import read_hints
from ortcompile.run.sessions import EXACT_INT8_CONFIG, open_session, run_session

BENCH_FORMAT = "ortcompile-bench/1"


@dataclass(frozen=True)
class Mismatch:
    """An output that differed from its reference in one run (`comparison` None: the model lost the output)."""

    run: int  # 1-based, counted per model
    name: str
    reason: str
    comparison: OutputComparison | None = None

    def to_json(self) -> JsonObject:
        if self.comparison is None:
            return {"run": self.run, "name": self.name, "ok": False, "reason": self.reason}
        return {"run": self.run, **self.comparison.to_json()}


@dataclass
class ModelStats:
    name: str
    path: str
    reference: str
    load_seconds: list[float] = field(default_factory=list)
    run_seconds: list[float] = field(default_factory=list)
    hits: int = 0
    evictions: int = 0
    captures: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    source_load_seconds: float | None = None
    footprint_bytes: int = 0

    def to_json(self) -> JsonObject:
        reloads = self.load_seconds[1:]
        saved = None
        if self.source_load_seconds is not None and reloads:
            saved = round(sum(self.source_load_seconds - s for s in reloads), 3)
        return {
            "name": self.name,
            "model": self.path,
            "reference": self.reference,
            "loads": len(self.load_seconds),
            "reloads": len(reloads),
            "hits": self.hits,
            "evictions": self.evictions,
            "captures": self.captures,
            "load_seconds": [round(s, 4) for s in self.load_seconds],
            "mean_run_seconds": round(float(np.mean(self.run_seconds)), 5) if self.run_seconds else None,
            "footprint_bytes": self.footprint_bytes,
            "source_load_seconds": None if self.source_load_seconds is None else round(self.source_load_seconds, 4),
            "reload_seconds_saved_vs_source": saved,
            "mismatches": [m.to_json() for m in self.mismatches],
        }


@dataclass
class BenchReport:
    ep: str
    budget: int | None  # None: unlimited
    cycles: int
    graph_capture: bool
    models: list[ModelStats]
    baseline_rss: int = 0
    ep_startup_rss: int = 0
    pool_peak_rss: int = 0
    process_peak_rss: int = 0
    events: list[PoolEvent] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(not m.mismatches for m in self.models)

    def to_json(self) -> JsonObject:
        return {
            "format": BENCH_FORMAT,
            "ok": self.ok,
            "ep": self.ep,
            "memory_budget_bytes": self.budget,
            "cycles": self.cycles,
            "graph_capture": self.graph_capture,
            "baseline_rss_bytes": self.baseline_rss,
            "ep_startup_rss_bytes": self.ep_startup_rss,
            "pool_peak_rss_bytes": self.pool_peak_rss,
            "process_peak_rss_bytes": self.process_peak_rss,
            "models": [m.to_json() for m in self.models],
            "events": [e.to_json() for e in self.events],
        }


def run_pipeline(models: list[Path], memory_budget: int | None, cycles: int = 3, ep: str = "auto", ep_options: dict[str, str] | None = None,
                 graph_capture: bool = False, references: list[Path] | None = None, dims: dict[str, int] | None = None,
                 seed: int = 0, criterion: dict[str, float | str | None] | None = None, inputs: dict[str, Given] | None = None) -> BenchReport:
    """`criterion`: settings over the default (the verify criterion for the EP's precision against source references;
    the fp32 tolerance against a model's own first run, which the same EP must reproduce); `inputs`: the user's."""
    dims = dict(dims or {})
    names = _unique_names(models)
    stats = [ModelStats(n, str(m), str(r) if references else "first run") for n, m, r in zip(names, models, references or models)]
    expected: dict[str, Arrays] = {}
    feeds: dict[str, Arrays] = {}
    pool = SessionPool(memory_budget or 2**62, ep, ep_options, graph_capture, dims)
    settings = dict(criterion or {})
    precision = settings.pop("precision", None) or (pool.ep.info.precision if references else "fp32")
    judge = criterion_for(str(precision), "verify", **settings)
    ep_startup = pool.warm_up()  # the EP's one-time start-up memory is not any model's footprint
    if references:
        for index, (stat, source) in enumerate(zip(stats, references)):
            feeds[stat.name], expected[stat.name], stat.source_load_seconds = _reference(source, pool, seed + index, dims, inputs or {})
    for stat, model in zip(stats, models):
        pool.add(stat.name, model)
    gc.collect()
    return_freed_memory()  # what the references and model parsing freed must not inflate the baseline
    peak_before_pool = peak_rss_bytes()
    tracking_peak = reset_peak_rss()  # the kernel's high-water mark then catches load transients too
    report = BenchReport(pool.ep.name, memory_budget, cycles, graph_capture, stats, baseline_rss=rss_bytes(), ep_startup_rss=ep_startup)
    report.pool_peak_rss = report.baseline_rss
    for _ in range(cycles):
        for index, stat in enumerate(stats):
            _one_step(pool, stat, feeds, expected, seed + index, dims, judge, inputs or {}, report)
    if tracking_peak:
        report.pool_peak_rss = max(report.pool_peak_rss, peak_rss_since_reset() or 0)
    _fold_events(pool, stats)
    report.events = list(pool.events)
    pool.close()
    report.process_peak_rss = max(peak_before_pool, peak_rss_bytes())
    return report


def _one_step(pool: SessionPool, stat: ModelStats, feeds: dict[str, Arrays], expected: dict[str, Arrays], seed: int,
              dims: dict[str, int], judge: Criterion, given: dict[str, Given], report: BenchReport) -> None:
    def inputs_for(session: Any) -> Arrays:
        if stat.name not in feeds:
            feeds[stat.name] = make_feeds(specs_from_session(session), seed=seed, dims=dims, given=given, hints=read_hints(Path(stat.path))).arrays
        wanted = sorted(i.name for i in session.get_inputs())
        if wanted != sorted(feeds[stat.name]):
            raise VerificationFailed(f"{stat.name}: its inputs {wanted} differ from the reference's {sorted(feeds[stat.name])}")
        return feeds[stat.name]

    start = time.perf_counter()
    outputs = pool.run(stat.name, inputs_for)
    stat.run_seconds.append(time.perf_counter() - start)
    report.pool_peak_rss = max(report.pool_peak_rss, rss_bytes())
    stat.footprint_bytes = pool.footprints[stat.name]
    if stat.name not in expected:
        expected[stat.name] = {k: v.copy() for k, v in outputs.items()}
        return
    reference = expected[stat.name]
    for output_name in sorted(set(outputs) | set(reference)):
        if output_name not in outputs:  # the model lost an output its reference has
            stat.mismatches.append(Mismatch(len(stat.run_seconds), output_name, "missing from the model's outputs"))
            continue
        comparison = compare_output(output_name, outputs[output_name], reference.get(output_name), judge)
        if not comparison.ok:
            stat.mismatches.append(Mismatch(len(stat.run_seconds), output_name, comparison.reason, comparison))


def _reference(source: Path, pool: SessionPool, seed: int, dims: dict[str, int],
               given: dict[str, Given]) -> tuple[Arrays, Arrays, float]:
    """Seeded inputs, the source's outputs on the CPU EP, and how long the source takes to load on the pool's EP."""
    on_ep = open_session(source, pool.ep, dims)
    load_seconds = on_ep.seconds
    del on_ep
    gc.collect()
    cpu = open_session(source, None, dims, config=EXACT_INT8_CONFIG).session  # the same reference as verify's
    inputs = make_feeds(specs_from_session(cpu), seed=seed, dims=dims, given=given, hints=read_hints(source)).arrays
    outputs = run_session(cpu, inputs, f"the source {source.name}")
    del cpu
    gc.collect()
    return inputs, outputs, load_seconds


def _fold_events(pool: SessionPool, stats: list[ModelStats]) -> None:
    by_name = {s.name: s for s in stats}
    for event in pool.events:
        stat = by_name[event.model]
        if event.kind in ("load", "reload"):
            stat.load_seconds.append(event.seconds)
        elif event.kind == "hit":
            stat.hits += 1
        elif event.kind == "evict":
            stat.evictions += 1
        elif event.kind == "capture":
            stat.captures += 1


def _unique_names(models: list[Path]) -> list[str]:
    names: list[str] = []
    for model in models:
        name = model.name[: -len(".onnx")] if model.name.endswith(".onnx") else model.name
        candidate, n = name, 2
        while candidate in names:
            candidate, n = f"{name}#{n}", n + 1
        names.append(candidate)
    return names
