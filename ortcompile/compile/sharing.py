"""`--share-weights`: compile several models that share weights (e.g. an LLM's prefill and decode graphs).

Two kinds of sharing, both deterministic:
- CPU-side initializers are content-addressed: a tensor whose bytes (sha256) were already written for an
  earlier model in the batch is referenced where it is, so identical weights are stored once, in
  `<first stem>_shared.data` (shards `.data.1`, ...).
- EP contexts are shared through ONNX Runtime's `ep.share_ep_contexts` (the last model also sets
  `ep.stop_share_ep_contexts`): an EP that supports it (QNN does) writes one blob, named after the first
  model, that every model's EPContext nodes reference. Blobs are never embedded in this mode.

The batch is one unit: compiled into one staging directory and published together, or not at all.
Each model gets its own manifest listing every file it needs, shared ones marked `"shared": true`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ortcompile.compile.datapass import DataPass, FileSink, WrittenFile
from ortcompile.compile.graphpass import GraphSummary
from ortcompile.compile.job import _Job, _node_counts, _verify_staged, _versions, compile_pass, graph_pass, peak_rss_bytes
from ortcompile.compile.layout import DataLayout, Placement
from ortcompile.errors import CompilationFailed, UsageError, output_error
from ortcompile.naming import strip_onnx
from ortcompile.options import CompileOptions, CompileResult
from ortcompile.output.digest import digest_inputs_in_background, hash_and_sync
from ortcompile.output.incremental import write_stamp
from ortcompile.output.manifest import Manifest, file_entries
from ortcompile.output.publish import Staging, remove_created_dirs
from ortcompile.progress import Reporter, SilentReporter

SHARE_CONTEXTS = "ep.share_ep_contexts"
STOP_SHARING = "ep.stop_share_ep_contexts"


class SharedDataPass(DataPass):
    """One data pass for the whole batch: writes each distinct tensor content once."""

    def __init__(self, sink: FileSink, shared_name: str, layout: DataLayout) -> None:
        super().__init__(sink, shared_name, layout)
        self.by_content: dict[str, Placement] = {}
        self.reused_bytes = 0

    def store(self, name: str, data: memoryview, element_size: int, origin: tuple[int, int] | None = None) -> Placement:
        key = hashlib.sha256(data).hexdigest()
        earlier = self.by_content.get(key)
        needed = self.layout.policy.alignment_for(len(data), element_size)
        if earlier is not None and earlier.nbytes == len(data) and earlier.offset % needed == 0:
            self.reused_bytes += len(data)
            return earlier
        placement = super().store(name, data, element_size, origin)
        self.by_content[key] = placement
        return placement

    def abandon(self) -> None:
        """Per-model failures abort the whole batch; the staging directory is removed by its owner."""

    def close(self) -> list[WrittenFile]:
        return DataPass.finish(self)


def compile_shared(sources: Sequence[str | os.PathLike[str]], output_dir: str | os.PathLike[str], options: CompileOptions,
                   reporter: Reporter | None = None) -> list[CompileResult]:
    """Compile `sources` as one weight-sharing batch into `output_dir`, atomically."""
    reporter = reporter or SilentReporter()
    output_dir = Path(output_dir)
    if len(sources) < 2:
        raise UsageError("--share-weights needs at least two models")
    options = dataclasses.replace(options, embed="never", share_weights=True)  # a shared blob belongs to several models
    jobs: list[_Job] = []
    try:
        for source in sources:
            jobs.append(_Job.plan(Path(source), output_dir, options, reporter))
        return _compile_planned(jobs, output_dir, options, reporter)
    except BaseException:
        if jobs:
            remove_created_dirs(jobs[0].created_dirs)  # the first plan created the output directory, if anyone did
        raise


def _compile_planned(jobs: list[_Job], output_dir: Path, options: CompileOptions, reporter: Reporter) -> list[CompileResult]:
    models = [job.names.model for job in jobs]
    if len(set(models)) != len(models):
        raise UsageError(f"--share-weights: two models would both be named {next(m for m in models if models.count(m) > 1)}")
    stems = [strip_onnx(job.source.path.name) for job in jobs]
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortcompile-digest") as digester, Staging(output_dir) as staging:
        digests = [digester.submit(digest_inputs_in_background, j.source.path.absolute(), j.source.external_files) for j in jobs]
        shared = SharedDataPass(FileSink(staging.path), f"{stems[0]}_shared", DataLayout(options.layout))
        graphs = [_compile_member(job, staging.path, shared, last=(i == len(jobs) - 1)) for i, job in enumerate(jobs)]
        data_files = {f.name: f for f in shared.close()}
        reporter.detail(f"shared weights: {shared.reused_bytes} bytes stored once instead of again")
        results, ordered = _write_manifests(jobs, graphs, data_files, staging.path, [d.result() for d in digests])
        if options.verify:  # every model of the batch, before anything is published
            for job in jobs:
                _verify_staged(job, staging.path / job.names.model)
        staging.publish(ordered, [job.names for job in jobs], options.force,
                        [p for job in jobs for p in (job.source.path, *job.source.external_files)])
        for job, digest in zip(jobs, digests):
            write_stamp(output_dir, job.names, job.source.path, digest.result())
    return results


def _compile_member(job: _Job, staging_dir: Path, shared: SharedDataPass, last: bool) -> tuple[WrittenFile, GraphSummary]:
    clock = time.perf_counter()
    config = {SHARE_CONTEXTS: "1", **({STOP_SHARING: "1"} if last else {})} if job.ep.info.compiles else {}
    ort_output, _ = compile_pass(job, staging_dir, lambda: shared, config)
    job.timings["compile"] = time.perf_counter() - clock
    clock = time.perf_counter()
    written = graph_pass(job, staging_dir, ort_output.graph_proto, "never", blobs_pending=True)
    job.timings["graph_pass"] = time.perf_counter() - clock
    return written


def _write_manifests(jobs: list[_Job], graphs: list[tuple[WrittenFile, GraphSummary]], data_files: dict[str, WrittenFile],
                     staging_dir: Path, digests: list[Any]) -> tuple[list[CompileResult], list[str]]:
    """One manifest per model, listing the files its graph references; returns results and publish order."""
    users: dict[str, int] = {}
    for _, graph in graphs:
        for name in [*graph.data_locations, *graph.blob_names]:
            users[name] = users.get(name, 0) + 1
    missing = sorted({n for _, g in graphs for n in g.blob_names if not (staging_dir / n).is_file()})
    if missing:
        raise CompilationFailed(f"the EP did not write the shared context file {missing[0]!r} its nodes reference")
    blobs = {name: hash_and_sync(staging_dir / name) for _, g in graphs for name in g.blob_names}
    results, models = [], []
    for job, (model_file, graph), digest in zip(jobs, graphs, digests):
        files = [(model_file, "model"), *((data_files[n], "data") for n in graph.data_locations), *((blobs[n], "ep_context") for n in graph.blob_names)]
        manifest = Manifest(
            model=job.names.model, files=file_entries(files, shared={name for name, count in users.items() if count > 1}),
            input_sha256=digest.combined, input_files=digest.input_files, versions=_versions(job.ep),
            options=job.options.recorded(job.ep.info.short_name, job.require_compiled),
            nodes={**_node_counts(job.source, graph)},
            initializers={"external": graph.external_initializers, "inline": graph.inline_initializers},
        )
        try:
            (staging_dir / job.names.manifest).write_bytes(manifest.to_bytes())
        except OSError as exc:
            raise output_error(exc, job.names.manifest) from exc
        models.append(job.names.model)
        results.append(_result(job, manifest, graph))
    ordered = [*sorted(data_files), *sorted(blobs), *models, *(job.names.manifest for job in jobs)]
    return results, ordered


def _result(job: _Job, manifest: Manifest, graph: GraphSummary) -> CompileResult:
    return CompileResult(
        source=job.source.path, output_dir=job.output_dir, model=job.names.model, ep=job.ep.name, ep_version=job.ep.version,
        files=[f.to_json() for f in manifest.files], epcontext_nodes=graph.epcontext_nodes, remaining_ops=graph.remaining_ops,
        graph_bytes=graph.graph_bytes, external_initializers=graph.external_initializers, inline_initializers=graph.inline_initializers, timings=job.timings,
        peak_rss_bytes=peak_rss_bytes(),
        inputs=[job.source.path, *(job.source.path.parent / e.location for e in job.source.external_refs)],
    )
