"""compile_model: plan -> pass 1 (data, inside ORT's compile) -> pass 2 (graph) -> publish.

Usable from Python without click:

    from ortcompile import compile_model, CompileOptions
    result = compile_model("model.onnx", "build/", CompileOptions(ep="qnn"))
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile import __version__, eps
from ortcompile.datapass import DataPass, FileSink, WrittenFile
from ortcompile.errors import CompilationFailed, VerificationFailed
from ortcompile.graphpass import EmbedPolicy, GraphSummary, write_graph
from ortcompile.incremental import why_not_up_to_date, write_stamp
from ortcompile.manifest import InputDigest, build_manifest, digest_inputs_in_background, hash_and_sync, manifest_bytes
from ortcompile.native import vm_hwm_bytes
from ortcompile.options import CompileOptions, CompileResult
from ortcompile.ortstep import OrtOutput, compile_with_ort, ep_compiles_anything
from ortcompile.plan import DataLayout
from ortcompile.progress import Reporter, SilentReporter
from ortcompile.publish import (
    OutputNames,
    Staging,
    check_destination,
    directory_lock,
    output_error,
    prepare_output_dir,
    remove_created_dirs,
    remove_stale_stages,
)
from ortcompile.shapes import dimension_overrides, dynamic_inputs_hint
from ortcompile.source import SourceModel, read_source


def compile_model(
    source_path: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    options: CompileOptions | None = None,
    reporter: Reporter | None = None,
) -> CompileResult:
    """Compile one model into `output_dir` atomically; raise an OrtCompileError subclass on failure."""
    options, reporter = options or CompileOptions(), reporter or SilentReporter()
    if options.if_changed:
        current = _current_output(Path(source_path), Path(output_dir), options, reporter)
        if current is not None:
            return current
        options = dataclasses.replace(options, force=True)  # --if-changed may replace its own stale output
    job = _Job.plan(Path(source_path), Path(output_dir), options, reporter)
    digester = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortcompile-digest")
    try:
        input_digest = digester.submit(digest_inputs_in_background, job.source.path.absolute(), job.source.external_files)  # cwd moves during the compile
        with Staging(job.output_dir) as staging:
            return job.run(staging, input_digest)
    except BaseException:
        remove_created_dirs(job.created_dirs)  # a failed run leaves no empty output directory behind
        raise
    finally:
        digester.shutdown(wait=False, cancel_futures=True)  # on Ctrl-C, do not wait for a hash of gigabytes


def _current_output(source: Path, output_dir: Path, options: CompileOptions, reporter: Reporter) -> CompileResult | None:
    """The published result when it is up to date (checked without loading onnx or onnxruntime)."""
    clock = time.perf_counter()
    reason = why_not_up_to_date(source, output_dir, options)
    if reason:
        reporter.detail(f"{source.name}: rebuilding: {reason}")
        return None
    manifest = json.loads((output_dir / OutputNames.for_source(source).manifest).read_text())
    reporter.stage(f"{output_dir / manifest['model']} is up to date")
    return CompileResult.from_manifest(source, output_dir, manifest, time.perf_counter() - clock, peak_rss_bytes())


@dataclass
class _Job:
    """One model's compile: everything decided up front, then run into a staging directory."""

    source: SourceModel
    ep: eps.ResolvedEp
    output_dir: Path
    names: OutputNames
    options: CompileOptions
    overrides: dict[str, int]
    require_compiled: bool
    reporter: Reporter
    created_dirs: list[Path] = field(default_factory=list)  # by prepare_output_dir: removed again on failure
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def plan(cls, source_path: Path, output_dir: Path, options: CompileOptions, reporter: Reporter) -> _Job:
        """Every check that can fail before work starts: input, EP, shapes, destination."""
        clock = time.perf_counter()
        reporter.stage("reading model")
        source = read_source(source_path)
        ep = eps.resolve(options.ep, options.ep_options, target=options.target, library=options.ep_library, validate=True)
        overrides = dimension_overrides(source, options.fix_dims, options.fix_shapes)
        require = ep.info.compiles if options.require_compiled is None else options.require_compiled
        names = OutputNames.for_source(source.path)
        created = prepare_output_dir(output_dir)
        try:
            check_destination(output_dir, names, options.force, [source.path, *source.external_files])
        except BaseException:
            remove_created_dirs(created)
            raise
        with directory_lock(output_dir):  # never beside another process's publish (it recovers under the lock too)
            for stale in remove_stale_stages(output_dir):
                reporter.detail(f"cleaned up staging directory {stale.name} left by a killed run")
        reporter.detail(f"{source.path.name}: {len(source.initializers)} initializers, {source.weight_bytes} bytes of weights; "
                        f"EP {ep.name} {ep.version}")
        job = cls(source, ep, output_dir, names, options, overrides, require, reporter, created)
        job.timings["read"] = time.perf_counter() - clock
        return job

    def run(self, staging: Staging, input_digest: Future[InputDigest]) -> CompileResult:
        try:
            built = _build(self, staging.path)
        except OSError as exc:  # a staged write failed (the input was read and checked before): disk full, quota...
            raise output_error(exc, f"outputs in {self.output_dir}") from exc
        finally:
            self.reporter.close()
        clock = time.perf_counter()
        manifest = build_manifest(
            model_name=self.names.model,
            files=built.files,
            input_digest=input_digest.result(),
            versions=_versions(self.ep),
            options=self.options.recorded(self.ep.info.short_name, self.require_compiled),
            nodes=_node_counts(self.source, built.graph),
            initializers={"external": built.external_count, "inline": built.inline_count},
            target=self.ep.target_record(),
        )
        _write_staged(staging.path / self.names.manifest, manifest_bytes(manifest))
        if self.options.verify:
            _verify_staged(self, staging.path / self.names.model)
            clock = time.perf_counter()
        self.reporter.stage("publishing")
        staging.publish(_publish_order(built.files, self.names), self.names, self.options.force,
                        [self.source.path, *self.source.external_files])
        self.timings["publish"] = time.perf_counter() - clock
        write_stamp(self.output_dir, self.names, self.source.path, input_digest.result())
        self.reporter.stage(f"wrote {self.output_dir / self.names.model}")
        return CompileResult(
            source=self.source.path,
            output_dir=self.output_dir,
            model=self.names.model,
            ep=self.ep.name,
            ep_version=self.ep.version,
            files=manifest["files"],
            epcontext_nodes=built.graph.epcontext_nodes,
            remaining_ops=built.graph.remaining_ops,
            graph_bytes=built.graph.graph_bytes,
            external_initializers=built.external_count,
            inline_initializers=built.inline_count,
            timings=self.timings,
            peak_rss_bytes=peak_rss_bytes(),
            inputs=[self.source.path, *(self.source.path.parent / e.location for e in self.source.external_refs)],
        )


@dataclass
class _Built:
    files: list[tuple[WrittenFile, str]]  # (file, role)
    graph: GraphSummary
    external_count: int
    inline_count: int


def _build(job: _Job, staging_dir: Path) -> _Built:
    """Passes 1 and 2 into the staging directory."""
    clock = time.perf_counter()

    def new_data_pass() -> DataPass:
        progress = job.reporter.bytes_bar("data pass", job.source.weight_bytes)
        return DataPass(FileSink(staging_dir), job.names.model, DataLayout(job.options.layout), progress,
                        source_files=job.source.external_paths)

    ort_output, data_pass = compile_pass(job, staging_dir, new_data_pass)
    data_files = data_pass.finish()
    job.timings["compile"] = time.perf_counter() - clock
    job.timings["data_pass"] = data_pass.seconds  # inside "compile": writing the initializers
    clock = time.perf_counter()
    model_file, graph = graph_pass(job, staging_dir, ort_output.graph_proto, job.options.embed)
    known = {f.name for f in data_files} | {job.names.model}
    blob_files = [hash_and_sync(staging_dir / n) for n in sorted(os.listdir(staging_dir)) if n not in known]
    job.timings["graph_pass"] = time.perf_counter() - clock
    files = [(model_file, "model"), *((f, "data") for f in data_files), *((f, "ep_context") for f in blob_files)]
    return _Built(files, graph, data_pass.external_count, data_pass.inline_count)


def compile_pass(job: _Job, staging_dir: Path, new_data_pass: Callable[[], DataPass],
                 session_config: dict[str, str] | None = None) -> tuple[OrtOutput, DataPass]:
    """Pass 1: ORT compiles; the data pass receives every initializer left in the graph."""
    source, ep, overrides = job.source, job.ep, job.overrides
    job.reporter.stage(f"compiling {source.path.name} with {ep.name}" if ep.info.compiles else f"laying out weights of {source.path.name}")
    try:
        return compile_with_ort(source.path, ep, staging_dir / job.names.model, new_data_pass, overrides,
                                job.require_compiled, job.reporter.detail, session_config=session_config)
    except CompilationFailed as exc:
        if "compiled no nodes" in exc.message:
            raise _nothing_compiled(job, exc.detail) from exc
        raise


def _nothing_compiled(job: _Job, detail: str | None) -> CompilationFailed:
    """Say why nothing compiled: dynamic shapes, an EP that cannot start, or ops the EP does not take."""
    short = job.ep.info.short_name
    hint = dynamic_inputs_hint(job.source, job.overrides)
    if hint:
        return CompilationFailed(f"{short}: the EP compiled no nodes{hint}; or pass --allow-partial", detail)
    if not ep_compiles_anything(job.ep):
        return CompilationFailed(f"{short}: the EP compiled nothing, not even a one-node test model: it failed to start "
                                 "with these options (check --ep-option values; -v shows its log)", detail)
    return CompilationFailed(f"{short}: the EP took none of this model's nodes; pass --allow-partial to publish it for the CPU EP", detail)


def graph_pass(job: _Job, staging_dir: Path, graph_proto: bytes, embed: EmbedPolicy, blobs_pending: bool = False) -> tuple[WrittenFile, GraphSummary]:
    """Pass 2: the small graph proto, finished and written on its own."""
    job.reporter.stage("writing graph")
    with ThreadPoolExecutor(max_workers=1) as pool:
        model_file, graph = write_graph(graph_proto, staging_dir, job.names.model, embed, pool, blobs_pending)
    if job.ep.info.compiles and graph.epcontext_nodes == 0:
        if job.require_compiled or not ep_compiles_anything(job.ep):
            raise _nothing_compiled(job, None)
        job.reporter.detail(f"{job.ep.name} compiled no nodes; the output runs entirely on the CPU EP")
    return model_file, graph


def _verify_staged(job: _Job, model: Path) -> None:
    """Run `verify` on the staged output: a model that computes the wrong thing is never published."""
    from ortcompile.verify import verify_model  # numpy and sessions: only when asked

    job.reporter.stage("verifying against the source")
    clock = time.perf_counter()
    report = verify_model(model, job.source.path, ep=job.ep, tolerance=job.options.verify_tolerance, fix_dims=job.overrides, time_source=False)
    if not report.ok:
        raise VerificationFailed(f"not published: {report.failure()}")
    worst = max((c.max_abs or 0.0 for run in report.runs for c in run["outputs"]), default=0.0)
    job.reporter.detail(f"verified: outputs match the source on the CPU EP (max abs diff {worst:.3g})")
    job.timings["verify"] = time.perf_counter() - clock


def _node_counts(source: SourceModel, graph: GraphSummary) -> dict[str, Any]:
    """EPContext nodes hide which ops they replaced: record it as source ops minus remaining ops."""
    compiled = collections.Counter(source.op_counts)
    compiled.subtract(graph.remaining_ops)
    return {
        "epcontext": graph.epcontext_nodes,
        "compiled_ops": {op: n for op, n in sorted(compiled.items()) if n > 0},
        "remaining_ops": graph.remaining_ops,
    }


def _publish_order(files: list[tuple[WrittenFile, str]], names: OutputNames) -> list[str]:
    """Data and blobs first, the model after them, the manifest last."""
    rest = [f.name for f, role in files if role != "model"]
    return [*rest, names.model, names.manifest]


def _write_staged(path: Path, content: bytes) -> None:
    try:
        with open(path, "xb") as stream:
            stream.write(content)
            stream.flush()
            os.fsync(stream.fileno())
    except OSError as exc:
        raise output_error(exc, path.name) from exc


def _versions(ep: eps.ResolvedEp) -> dict[str, Any]:
    import onnxruntime as ort

    return {"ortcompile": __version__, "onnxruntime": ort.__version__, "ep": {"name": ep.name, "version": ep.version}}


def peak_rss_bytes() -> int:
    """This process's own peak resident set.

    Not ru_maxrss on Linux: exec() folds the parent's high-water mark into it, so ortcompile started by a
    big process (pytest, a build system) would report the parent's memory. VmHWM is per address space.
    """
    hwm = vm_hwm_bytes()
    if hwm is not None:
        return hwm
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is KiB on Linux, bytes on macOS
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
