"""`ortcompile stitch` and the last step of `--partition`: compiled parts joined into one EPContext model.

The skeleton (split.py) gives the graph's interface and the types of the tensors between parts (ONNX Runtime
needs them: "EPContext output arg ... type inference failed" without); the compiled parts give their nodes in
order (EPContext nodes and whatever stayed on the CPU EP) and their remaining weights. The weights go through the
same data pass as every compile, deduplicated by content (a weight two parts read is stored once); each part's EP
blob is linked (or copied) into the output under a name derived from the output model. Parts were compiled from
distinct file names, so their EPContext nodes (named after a hash of that name) never collide. Before any of
its bytes are used, each compiled part is proved to be the planned one, compiled as planned and unchanged
(partcheck.py); the plan itself is validated as it is read (partsplan.py).

`StitchJob` drives a stitch and hands `finish` its plan as data: the manifest comes from the parts plan (the options
and input digest recorded at the split), so `split` + `compile` per part + `stitch` gives the bytes `--partition` does.
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile import eps
from ortcompile.compile.datapass import DataPass, FileSink
from ortcompile.compile.epstep import EpStepOutput
from ortcompile.compile.finish import Built, Finished, FinishPlan, ManifestPlan, finish, open_destination, stage_graph
from ortcompile.compile.fragmentation import judge_fragmentation
from ortcompile.compile.partcheck import CompiledPart, PartVerifier
from ortcompile.compile.partfiles import is_part_file
from ortcompile.compile.partsplan import PartsPlan
from ortcompile.compile.relayout import relayout_model
from ortcompile.compile.shareddata import SharedDataPass
from ortcompile.eps.request import ep_precision
from ortcompile.errors import CompilationFailed, InvalidModel, OutputError, UsageError, output_error
from ortcompile.layout import DataLayout, LayoutPolicy
from ortcompile.naming import OutputNames, OutputTarget
from ortcompile.native import available_memory, native_output_shown, peak_rss_bytes
from ortcompile.onnxfacts import attribute, blob_location, epcontext_nodes
from ortcompile.options import CompileOptions, CompileResult, effective_check
from ortcompile.output.digest import InputDigest, hash_file
from ortcompile.output.manifest import Manifest, ManifestError
from ortcompile.output.publish import Staging, previous_outputs, remove_created_dirs
from ortcompile.paths import UnsafePath, resolve_inside
from ortcompile.plan.planner import CheckPlan, VerifyPlan, ep_request
from ortcompile.progress import Reporter, SilentReporter
from ortcompile.worker import Workers

# A worker child with onnxruntime and the EP loaded, before it opens a model (measured ~300 MiB with QNN).
CHECK_PROCESS_BYTES = 512 << 20


@dataclass
class StitchJob:
    """Compiled parts to one output: what `ortcompile stitch` and `--partition` drive to finish."""

    plan: PartsPlan
    compiled_dir: Path
    target: OutputTarget  # where the stitched model is published
    options: CompileOptions
    ep: eps.ResolvedEp
    source: Path | None  # the source model when it is at hand: the check runs against it, --verify needs it
    reporter: Reporter
    protected: list[Path]  # files the output must never overwrite: the source's, the plan, the compiled parts
    created_dirs: list[Path] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    peaks: dict[str, int] = field(default_factory=dict)
    part_results: list[CompileResult] = field(default_factory=list)  # --partition: each part's compile
    part_manifests: list[Manifest] = field(default_factory=list)
    source_missing: str = ""  # why `source` is None: the check loads only
    pinned: frozenset[str] = frozenset()  # op types kept off the EP on purpose (compile/nodecut.py): not the EP's refusal
    offers: tuple[str, ...] = ("check",)  # what a refused check may suggest (`stitch` takes --check, no --inputs or placement)

    @classmethod
    def plan_stitch(cls, plan_path: Path, compiled_dir: Path, output_dir: Path, check: str, force: bool, verify: bool,
                    ep_library: str | None, reporter: Reporter, replace_stitched: bool = False) -> StitchJob:
        """`ortcompile stitch`: every check that can fail before work starts."""
        plan = PartsPlan.load(plan_path)
        target = OutputTarget(output_dir, OutputNames.for_source(plan.source))
        if replace_stitched and not force:
            force = _earlier_stitch(target, plan)
        options = plan.compile_options(check=check, force=force, verify=verify, ep_library=ep_library)
        ep = eps.resolve(options.ep, options.ep_options, target=options.target, library=ep_library, validate=True)
        source, missing = _source_at_hand(plan)
        if verify and source is None:
            raise UsageError(f"--verify compares with the source: {missing}")
        protected = [plan_path, *(compiled_dir / OutputNames.for_source(p).model for p in plan.parts), *([source] if source else [])]
        created = open_destination(target, force, protected, reporter)
        return cls(plan, compiled_dir, target, options, ep, source, reporter, protected, created_dirs=created, source_missing=missing)

    @property
    def names(self) -> OutputNames:
        return self.target.names

    def build(self, staging_dir: Path) -> Built:
        """The stitched graph and its data in the stage (pass 2 included)."""
        clock = time.perf_counter()
        self.reporter.stage(f"stitching {len(self.plan.parts)} parts")
        verifier = PartVerifier(verify=self.plan.part_files is not None, embed=self.options.embed)
        try:
            step, self.part_manifests = stitch_parts(self.plan, self.compiled_dir, staging_dir, self.names, self.options.layout, verifier)
            self.timings["stitch"] = time.perf_counter() - clock
            clock = time.perf_counter()
            self.reporter.stage("writing graph")
            files, graph = stage_graph(step, staging_dir, self.names.model, self.options.embed)
            verifier.check_blobs([f for f, role in files if role == "ep_context"])
        except OSError as exc:
            raise output_error(exc, f"outputs in {self.target.directory}") from exc
        finally:
            verifier.close()
        self.timings["graph_pass"] = time.perf_counter() - clock
        if self.ep.info.compiles and graph.epcontext_nodes == 0 and self.plan.options["require_compiled"]:
            raise CompilationFailed(f"{self.plan.source}: {self.ep.info.short_name} took no node of any part; "
                                    "pass --allow-partial to publish it for the CPU EP")
        if self.ep.info.compiles:  # the parts may each be whole while CPU nodes sit between them
            judge_fragmentation(step.graph_proto, Path(self.plan.source).name, self.ep.info.short_name, self.ep.name,
                                bool(self.plan.options.get("prepare", True)), self.options.require_full, self.pinned)
        return Built(self.finish_plan(staging_dir), files, graph, step)

    def finish_plan(self, staging_dir: Path) -> FinishPlan:
        """What finish needs of the stitched model, as data (the parts are read: their manifests say the versions)."""
        first = self.part_manifests[0]
        parts = tuple({"model": name, "nodes": spec["nodes"], "weight_bytes": spec["weight_bytes"],
                       "epcontext": manifest.nodes.epcontext, "remaining_ops": manifest.nodes.remaining_ops}
                      for name, spec, manifest in zip(self.plan.parts, self.plan.specs, self.part_manifests))
        record = ManifestPlan(first.versions, self.plan.options, self.plan.source_ops, first.target, parts)
        verify = None
        if self.options.verify:
            assert self.source is not None  # plan_stitch refuses --verify without the source
            verify = VerifyPlan(self.source, self.plan.dims, dict(self.options.freeze), dict(self.options.inputs), self.options.verify_criterion,
                                self.offers)
        return FinishPlan(self.target, self.protected, self.options.force, self.check_plan(staging_dir),
                          verify, record, self.reporter)

    def check_plan(self, staging_dir: Path) -> CheckPlan:
        """The stitched model opened on its EP (and run against the source when it is at hand), like any output: never
        published unopened unless --check none says so. Every part was also checked on its own when it compiled."""
        mode = effective_check(self.options.check, self.plan.weight_bytes)
        if mode == "run" and self.source is None:
            self.reporter.detail(f"check: {self.source_missing}: loading the output only")
            mode = "load"
        if mode != "none":
            mode = self._mode_within_memory(mode, self._output_bytes(staging_dir))
        # --input included: the parts never see it, the stitched model does; with --verify the check judges by its
        # criterion, so that it is verify's one comparison (finish.py: a second session pair would prove nothing more)
        return CheckPlan(mode, self.source or self.plan.path, ep_request(self.options), self.ep.info.short_name,
                         ep_precision(self.ep, self.plan.source_ops), self.plan.dims, dict(self.options.freeze), dict(self.options.inputs),
                         self.options.verify_criterion if self.options.verify else None, offers=self.offers)

    def _output_bytes(self, staging_dir: Path) -> int:
        """What opening the output costs: its staged files (the EP's contexts are read whole; data is mapped)."""
        return sum(p.stat().st_size for p in staging_dir.iterdir() if p.is_file() and p.name.startswith(self.names.base))

    def _mode_within_memory(self, mode: str, output_bytes: int) -> str:
        """`run` becomes `load` when the output and the source do not fit in memory together; when the output alone
        does not, nothing is published (--check none publishes it unopened). The limit is --memory-budget when
        given (the whole compile stays within it), else the memory available now."""
        budget = self.options.partition.memory_budget if self.options.partition else None
        limit = budget or available_memory()
        where = "--memory-budget" if budget else "available"
        load = CHECK_PROCESS_BYTES + output_bytes
        source = self.plan.weight_bytes
        if mode == "run" and load + source > limit:
            self.reporter.detail(f"check: load only: running next to the source needs ~{(load + source) / (1 << 30):.1f} GiB, "
                                 f"{limit / (1 << 30):.1f} GiB {where}")
            mode = "load"
        if load > limit:
            raise CompilationFailed(f"{self.names.model}: not published: opening it for the pre-publish check needs ~{load / (1 << 30):.1f} GiB, "
                                    f"{limit / (1 << 30):.1f} GiB {where}; raise --memory-budget, or pass --check none to publish it "
                                    "unopened (each part was checked when it compiled)")
        return mode

    def result(self, built: Built, finished: Finished) -> CompileResult:
        manifest, check = finished.manifest, finished.check
        if check.report is not None:
            self.timings["check"], self.peaks["check"] = check.seconds, check.peak_rss_bytes
        self.timings.update(finished.timings)
        if self.part_results:
            parts = {"budget_bytes": self.plan.budget_bytes, "parts": [
                {"model": r.model, "weight_bytes": spec["weight_bytes"], "epcontext_nodes": r.epcontext_nodes, "peak_rss_bytes": r.peak_rss_bytes,
                 "seconds": round(sum(r.timings.values()), 3), "check": (r.check or {}).get("ok")}
                for spec, r in zip(self.plan.specs, self.part_results)]}
        else:
            parts = {"parts": [dict(p) for p in manifest.parts or ()]}
        compile_peak = max((r.peak_rss_bytes for r in self.part_results), default=0)
        return CompileResult(
            source=self.source or self.plan.path, output_dir=self.target.directory, model=self.names.model,
            ep=self.ep.name, ep_version=self.ep.version, files=[f.to_json() for f in manifest.files], epcontext_nodes=built.graph.epcontext_nodes,
            remaining_ops=built.graph.remaining_ops, graph_bytes=built.graph.graph_bytes, external_initializers=built.step.external_count,
            inline_initializers=built.step.inline_count, timings=self.timings, peak_rss_bytes=max(peak_rss_bytes(), compile_peak),
            inputs=list(self.protected), peak_rss_by_stage={**({"compile": compile_peak} if compile_peak else {}), **self.peaks},
            check=check.report, parts=parts)


def stitch_model(plan_path: str | os.PathLike[str], compiled_dir: str | os.PathLike[str], output_dir: str | os.PathLike[str],
                 check: str = "auto", force: bool = False, verify: bool = False, ep_library: str | None = None,
                 reporter: Reporter | None = None, replace_stitched: bool = False) -> CompileResult:
    """`ortcompile stitch`: join the parts `split` planned, compiled into `compiled_dir`, into one model in `output_dir`.

    `replace_stitched` (the Make fragment's stitch): replace an earlier stitched output of this model, as `force`
    would, but refuse any other output there."""
    reporter = reporter or SilentReporter()
    job = StitchJob.plan_stitch(Path(plan_path), Path(compiled_dir), Path(output_dir), check, force, verify, ep_library, reporter,
                                replace_stitched)
    digest: Future[InputDigest] = Future()
    digest.set_result(job.plan.digest)
    try:
        with Workers(native_output_shown(), reporter, f"the {job.ep.info.short_name} EP") as workers, Staging(job.target.directory) as staging:
            built = job.build(staging.path)
            return job.result(built, finish([built], staging, workers, [digest])[0])
    except BaseException:
        remove_created_dirs(job.created_dirs)
        raise


def stitch_parts(plan: PartsPlan, compiled_dir: Path, staging_dir: Path, names: OutputNames, layout: LayoutPolicy,
                 verifier: PartVerifier) -> tuple[EpStepOutput, list[Manifest]]:
    """The stitched graph proto (pass 2 still to run) with its data files written and blobs linked into `staging_dir`;
    each compiled part checked by `verifier` (partcheck.py) before any of it is used."""
    skeleton = _skeleton(plan)
    parts: list[CompiledPart] = []
    for index in range(len(plan.parts)):
        part = verifier.read(plan, index, compiled_dir, parts[0].manifest if parts else None)
        parts.append(part)
        _link_blobs(part, compiled_dir, staging_dir, names, index, verifier)
        skeleton.graph.node.extend(part.model.graph.node)
        known = {t.name for t in skeleton.graph.initializer}
        skeleton.graph.initializer.extend(t for t in part.model.graph.initializer if t.name not in known)
        _add_types(skeleton.graph, part.model.graph)
    data_pass = SharedDataPass(FileSink(staging_dir), names.model, DataLayout(layout))
    try:
        graph = relayout_model(skeleton, compiled_dir, data_pass)
        verifier.finish_data()  # the parts' data files, hashed while the data pass copied from them
    except UnsafePath as exc:  # a data file that resolves outside --parts (a symlink)
        DataPass.abandon(data_pass)
        raise InvalidModel(f"compiled parts in {compiled_dir}: {exc}") from None
    except BaseException:
        DataPass.abandon(data_pass)  # the owner's abandon: SharedDataPass.abandon leaves cleanup to its owner
        raise
    files = data_pass.close()
    return EpStepOutput(graph, files, data_pass.external_count, data_pass.inline_count, {"data_pass": data_pass.seconds}), [p.manifest for p in parts]


def _skeleton(plan: PartsPlan) -> Any:
    import onnx

    try:
        path = resolve_inside(plan.directory, plan.skeleton, plain=True)
        return onnx.load_model(str(path), load_external_data=False)
    except UnsafePath as exc:
        raise InvalidModel(f"{plan.path}: the skeleton {exc}") from None
    except OSError as exc:
        raise InvalidModel(f"{plan.path}: cannot read the skeleton {plan.skeleton} ({exc.strerror or exc}); split the model again") from None
    except Exception as exc:  # DecodeError: not a model
        raise InvalidModel(f"{plan.directory / plan.skeleton}: not an ONNX model ({type(exc).__name__}); split the model again") from None


def _source_at_hand(plan: PartsPlan) -> tuple[Path | None, str]:
    """The source model where the plan says it is, if it is still the model split read (its model file's size and
    sha256; the check and --verify feed it), else None and why not."""
    path = plan.directory / plan.source_path
    if not path.is_file():
        return None, f"the source is not at {path} any more"
    if plan.digest.files:
        _, size, sha256 = plan.digest.files[0]
        if path.stat().st_size != size or hash_file(path).sha256 != sha256:
            return None, f"{path} is not the model split read (it changed since)"
    return path, ""


def _earlier_stitch(target: OutputTarget, plan: PartsPlan) -> bool:
    """--replace-stitched: whether what `output_dir` holds of this model is an earlier stitch of it (a model of
    this source's parts), which it replaces; any other output there is refused, as without --force."""
    if not previous_outputs(target):
        return False
    names = target.names
    try:
        manifest = Manifest.load(target.manifest_path)
    except ManifestError:
        manifest = None
    parts = manifest.parts if manifest is not None else None
    if manifest is None or manifest.model != names.model or not parts or \
            not all(isinstance(p, dict) and isinstance(p.get("model"), str) and is_part_file(plan.stem, p["model"]) for p in parts):
        raise OutputError(f"{target.model_path} already exists and is not a stitched {plan.source}: --replace-stitched replaces "
                          "only an earlier stitch; choose another -o, or replace it with --force")
    return True


def _add_types(stitched: Any, part: Any) -> None:
    """The types of the tensors a part hands between its EPContext and CPU nodes, and of its own interface: ONNX
    Runtime cannot infer an EPContext node's outputs."""
    interface = {v.name for v in (*stitched.input, *stitched.output)}
    known = {v.name for v in stitched.value_info} | interface
    for value in (*part.value_info, *part.input, *part.output):
        if value.name not in known:
            stitched.value_info.append(value)
            known.add(value.name)


def _link_blobs(part: CompiledPart, compiled_dir: Path, staging_dir: Path, names: OutputNames, index: int, verifier: PartVerifier) -> None:
    """Each blob file a part's EPContext nodes name, under the output's name: `<model>_partNN<suffix>`."""
    renamed: dict[str, str] = {}
    for node in epcontext_nodes(part.model):
        location = blob_location(node)
        if location is None:
            continue
        if location not in renamed:
            suffix = location.split("_ctx", 1)[1] if "_ctx" in location else f"_{location}"
            renamed[location] = f"{names.base}_part{index:02d}{suffix}"
            try:
                source = resolve_inside(compiled_dir, location, plain=True)
            except UnsafePath as exc:
                raise part.refuse(f"its EPContext node names a blob that {exc}") from None
            _link_or_copy(source, staging_dir / renamed[location])
            verifier.blob_linked(part, location, staging_dir / renamed[location])
        attribute(node, "ep_cache_context").s = renamed[location].encode()


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)  # another filesystem: copy_file_range/sendfile inside the kernel
