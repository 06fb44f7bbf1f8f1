"""compile_model: plan -> pass 1 (data, inside ORT's compile) -> pass 2 (graph) -> publish.

Usable from Python without click:

    from ortcompile import compile_model, CompileOptions
    result = compile_model("model.onnx", "build/", CompileOptions(ep="qnn"))
"""

from __future__ import annotations

import collections
import os
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ortcompile import __version__, eps
from ortcompile.datapass import DataPass, WrittenFile
from ortcompile.errors import CompilationFailed, OutputError, VerificationFailed
from ortcompile.graphpass import EmbedPolicy, GraphSummary, write_graph
from ortcompile.manifest import InputDigest, build_manifest, digest_inputs, hash_file, manifest_bytes
from ortcompile.ortstep import compile_with_ort
from ortcompile.plan import DataLayout, LayoutPolicy
from ortcompile.progress import Reporter, SilentReporter
from ortcompile.publish import OutputNames, Staging, check_destination, output_error, prepare_output_dir, previous_outputs, remove_stale_stages
from ortcompile.shapes import dimension_overrides, dynamic_inputs_hint
from ortcompile.source import SourceModel, read_source
from ortcompile.verify import Tolerance, verify_model


@dataclass(frozen=True)
class CompileOptions:
    ep: str = "auto"
    ep_options: dict[str, str] = field(default_factory=dict)
    layout: LayoutPolicy = field(default_factory=LayoutPolicy)
    embed: EmbedPolicy = "auto"
    fix_dims: dict[str, int] = field(default_factory=dict)
    fix_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    require_compiled: bool | None = None  # None: required for EPs that compile, not for pass-through
    force: bool = False
    verify: bool = False  # compare against the source before publishing; a mismatch publishes nothing
    verify_tolerance: Tolerance = field(default_factory=Tolerance)

    def recorded(self, ep_name: str, require_compiled: bool) -> dict[str, Any]:
        """The options that shape the output, as the manifest records them (no paths, no --force)."""
        return {
            "ep": ep_name,
            "ep_options": dict(sorted(self.ep_options.items())),
            "layout": asdict(self.layout),
            "embed": self.embed,
            "fix_dims": dict(sorted(self.fix_dims.items())),
            "fix_shapes": {k: list(v) for k, v in sorted(self.fix_shapes.items())},
            "require_compiled": require_compiled,
        }  # verify settings are left out: they do not change a byte of the output


@dataclass
class CompileResult:
    source: Path
    output_dir: Path
    model: str
    ep: str
    ep_version: str
    files: list[dict[str, Any]]
    epcontext_nodes: int
    remaining_ops: dict[str, int]
    graph_bytes: int
    external_initializers: int
    inline_initializers: int
    timings: dict[str, float]
    peak_rss_bytes: int

    @property
    def model_path(self) -> Path:
        return self.output_dir / self.model

    def to_json(self) -> dict[str, Any]:
        return {
            "source": str(self.source),
            "output_dir": str(self.output_dir),
            "model": str(self.model_path),
            "ep": self.ep,
            "ep_version": self.ep_version,
            "files": self.files,
            "total_bytes": sum(f["size"] for f in self.files),
            "epcontext_nodes": self.epcontext_nodes,
            "remaining_ops": self.remaining_ops,
            "graph_bytes": self.graph_bytes,
            "initializers": {"external": self.external_initializers, "inline": self.inline_initializers},
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "peak_rss_bytes": self.peak_rss_bytes,
        }


def compile_model(
    source_path: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    options: CompileOptions | None = None,
    reporter: Reporter | None = None,
) -> CompileResult:
    """Compile one model into `output_dir` atomically; raise an OrtCompileError subclass on failure."""
    options = options or CompileOptions()
    reporter = reporter or SilentReporter()
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    reporter.stage("reading model")
    source = read_source(Path(source_path))
    ep = eps.resolve(options.ep, options.ep_options)
    overrides = dimension_overrides(source, options.fix_dims, options.fix_shapes)
    require = ep.info.compiles if options.require_compiled is None else options.require_compiled
    names = OutputNames.for_source(source.path)
    out = Path(output_dir)
    prepare_output_dir(out)
    check_destination(out, names, options.force, [source.path, *source.external_files])
    for stale in remove_stale_stages(out):
        reporter.detail(f"removed stale staging directory {stale.name} left by a killed run")
    reporter.detail(f"{source.path.name}: {len(source.initializers)} initializers, {source.weight_bytes} bytes of weights; EP {ep.name} {ep.version}")
    timings["read"] = time.perf_counter() - clock

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortcompile-digest") as digester, Staging(out) as staging:
        input_digest = digester.submit(digest_inputs, source.path, source.external_files)
        try:
            built = _build(source, ep, staging.path, names, options, overrides, require, reporter, timings)
        finally:
            reporter.close()
        clock = time.perf_counter()
        manifest = build_manifest(
            model_name=names.model,
            files=built.files,
            input_digest=input_digest.result(),
            versions=_versions(ep),
            options=options.recorded(ep.info.short_name, require),
            nodes=_node_counts(source, built.graph),
        )
        _write_staged(staging.path / names.manifest, manifest_bytes(manifest))
        if options.verify:
            timings["verify"] = _verify_staged(staging.path / names.model, source, ep, overrides, options, reporter)
            clock = time.perf_counter()
        reporter.stage("publishing")
        replaced = previous_outputs(out, names)
        staging.publish(_publish_order(built.files, names), replaced)
        timings["publish"] = time.perf_counter() - clock
    reporter.stage(f"wrote {out / names.model}")
    return CompileResult(
        source=source.path,
        output_dir=out,
        model=names.model,
        ep=ep.name,
        ep_version=ep.version,
        files=manifest["files"],
        epcontext_nodes=built.graph.epcontext_nodes,
        remaining_ops=built.graph.remaining_ops,
        graph_bytes=built.graph.graph_bytes,
        external_initializers=built.external_count,
        inline_initializers=built.inline_count,
        timings=timings,
        peak_rss_bytes=peak_rss_bytes(),
    )


@dataclass
class _Built:
    files: list[tuple[WrittenFile, str]]  # (file, role)
    graph: GraphSummary
    external_count: int
    inline_count: int


def _build(
    source: SourceModel,
    ep: eps.ResolvedEp,
    staging_dir: Path,
    names: OutputNames,
    options: CompileOptions,
    overrides: dict[str, int],
    require: bool,
    reporter: Reporter,
    timings: dict[str, float],
) -> _Built:
    """Passes 1 and 2 into the staging directory."""
    clock = time.perf_counter()
    reporter.stage(f"compiling with {ep.name}" if ep.info.compiles else "laying out weights (no EP compilation)")

    def new_data_pass() -> DataPass:
        progress = reporter.bytes_bar("data pass", source.weight_bytes)
        return DataPass(staging_dir, names.model, DataLayout(options.layout), progress)

    try:
        ort_output, data_pass = compile_with_ort(source.path, ep, staging_dir / names.model, new_data_pass, overrides, require, reporter.detail)
    except CompilationFailed as exc:
        if "compiled no nodes" in exc.message:
            raise CompilationFailed(exc.message + dynamic_inputs_hint(source, overrides) + "; or pass --allow-partial", exc.detail) from exc
        raise
    data_files = data_pass.finish()
    timings["compile"] = time.perf_counter() - clock

    clock = time.perf_counter()
    reporter.stage("writing graph")
    with ThreadPoolExecutor(max_workers=1) as pool:
        model_file, graph = write_graph(ort_output.graph_proto, staging_dir, names.model, options.embed, pool)
    if require and graph.epcontext_nodes == 0:
        raise CompilationFailed(f"{ep.info.short_name}: the EP compiled no nodes{dynamic_inputs_hint(source, overrides)}")
    if graph.epcontext_nodes == 0 and ep.info.compiles:
        reporter.detail(f"{ep.name} compiled no nodes; the output runs entirely on the CPU EP")
    known = {f.name for f in data_files} | {names.model}
    blob_files = [hash_file(staging_dir / n) for n in sorted(os.listdir(staging_dir)) if n not in known]
    timings["graph_pass"] = time.perf_counter() - clock
    files = [(model_file, "model"), *((f, "data") for f in data_files), *((f, "ep_context") for f in blob_files)]
    return _Built(files, graph, data_pass.external_count, data_pass.inline_count)


def _verify_staged(model: Path, source: SourceModel, ep: eps.ResolvedEp, dims: dict[str, int], options: CompileOptions, reporter: Reporter) -> float:
    reporter.stage("verifying against the source")
    clock = time.perf_counter()
    report = verify_model(model, source.path, ep=ep, tolerance=options.verify_tolerance, fix_dims=dims, time_source=False)
    if not report.ok:
        raise VerificationFailed(f"not published: {report.failure()}")
    worst = max((c.max_abs for run in report.runs for c in run["outputs"]), default=0.0)
    reporter.detail(f"verified: outputs match the source on the CPU EP (max abs diff {worst:.3g})")
    return time.perf_counter() - clock


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
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is KiB on Linux, bytes on macOS
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


__all__ = ["CompileOptions", "CompileResult", "compile_model", "OutputError"]
