"""`ortcompile split` and the first step of `--partition`: a model written as parts that compile on their own.

Each part is a standalone ONNX model with its own aligned data file (`<stem>.partNN.onnx` + `.data`): on one
machine the parts compile one after another in child processes; in a build system each is one build step, on any
machine. Beside them: `<stem>.skeleton.onnx` (the graph's interface and the types of the tensors between parts,
no nodes, no weights) and `<stem>.parts.json` (the plan, the source's digest, the options), which `stitch` joins
the compiled parts with; and `<stem>.parts.mk`, a Make fragment that builds the whole thing.

Only the graph proto is parsed (weights stay where they are, copied inside the kernel into each part's data
file), so splitting a model costs about its size in disk and little memory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortcompile.compile.datapass import DataPass, FileSink
from ortcompile.compile.freeze import freeze_inputs
from ortcompile.compile.makefrag import fragment_name, make_fragment
from ortcompile.compile.partition import PartitionPlan, PartSpec, plan_cuts, plan_partition
from ortcompile.compile.partsplan import PartsPlan, is_part_file, part_name, plan_file_name, skeleton_name, write_plan
from ortcompile.compile.relayout import relayout_model
from ortcompile.durable import write_new
from ortcompile.errors import CompilationFailed, InvalidModel, UsageError, output_error
from ortcompile.jsonedge import JsonObject
from ortcompile.layout import DataLayout, LayoutPolicy
from ortcompile.naming import strip_onnx
from ortcompile.onnxfacts import iter_tensors, stored_nbytes
from ortcompile.options import CompileOptions, GivenInputs
from ortcompile.optiontable import TABLE, Option, part_flagged
from ortcompile.output.digest import InputDigest, digest_inputs, hash_file
from ortcompile.output.manifest import InputFile
from ortcompile.output.publish import Staging, prepare_output_dir, remove_created_dirs
from ortcompile.paths import model_dir
from ortcompile.plan.planner import SourcePlan, part_options, plan_source
from ortcompile.plan.shapes import Pins, apply_pins, require_static, value_dims
from ortcompile.plan.source import SourceModel
from ortcompile.progress import Reporter, SilentReporter

ValueTypes = dict[str, Any]  # tensor name -> its onnx ValueInfoProto (onnx is imported only when a model is split)


@dataclass(frozen=True)
class SplitResult:
    directory: Path
    stem: str
    plan: PartitionPlan
    parts: list[str]  # part model file names, in order
    parts_plan: PartsPlan  # the plan file as written (what stitch reads)

    @property
    def plan_file(self) -> Path:
        return self.directory / plan_file_name(self.stem)


def split_model(source: SourceModel, out_dir: Path, budget: int, pins: Pins, layout: LayoutPolicy, frozen: dict[str, int | float],
                recorded: JsonObject, link_sources: bool = False, given: GivenInputs | None = None,
                cuts: Sequence[int] | None = None) -> SplitResult:
    """Write the parts of `source` into `out_dir` (which must exist and hold nothing of this model's yet), with the
    plan file `ortcompile stitch` reads; `recorded` goes into it (the options, the input digest, ...).

    `link_sources` (--partition, whose parts never leave this machine): the parts read the source's own data files
    through hard links in `out_dir` instead of copies of their weights, when the filesystem allows it. The compiled
    parts are the same either way (a part's compile lays its weights out anew), so the stitched bytes are too. Such
    a plan records no part digests (nothing else compiles those parts).

    `given` (--input): checked against the source's inputs before anything is cut, as the check of the stitched model
    would check them after every part compiled.

    `cuts` (compile/nodecut.py): cut before these node indices too, besides where `budget` cuts."""
    import onnx

    require_static(source, pins, "--partition", frozen=set(frozen))  # the tensors between parts need static shapes
    model = onnx.load_model(str(source.path), load_external_data=False)
    if given:
        _check_given(model, pins, frozen, given)
    if frozen:
        freeze_inputs(model, frozen)
    apply_pins(model, pins)
    types = _value_types(model)
    sizes = {t.name: stored_nbytes(t) or 0 for t in model.graph.initializer}
    plan = plan_partition(model, sizes, budget)
    if cuts is not None:
        plan = plan_cuts(model, sizes, [*cuts, *(part.start for part in plan.parts)], budget)
    stem = strip_onnx(source.path.name)
    names = [part_name(stem, part.index) for part in plan.parts]
    try:
        links = _link_source_files(source, out_dir, stem) if link_sources else None
        part_files: list[list[InputFile]] | None = None if links is not None else []
        for part, name in zip(plan.parts, names):
            part_model = part_model_of(model, part, types)
            if links is not None:
                _point_at(part_model, links)
                write_new(out_dir / name, part_model.SerializeToString())
            else:
                assert part_files is not None
                part_files.append(_write_part(part_model, model_dir(source.path), out_dir, name, layout))
        write_new(out_dir / skeleton_name(stem), _skeleton(model, plan, types).SerializeToString())
        files = None if part_files is None else [[{"name": f.name, "size": f.size, "sha256": f.sha256} for f in written] for written in part_files]
        document = {**recorded, "source": source.path.name, "plan": plan.to_json(), "parts": names, "skeleton": skeleton_name(stem),
                    "dims": pins.named, "part_files": files}
        parts_plan = write_plan(out_dir / plan_file_name(stem), document, internal=link_sources)  # (--partition's: no digests)
    except OSError as exc:
        raise output_error(exc, f"the parts in {out_dir}") from exc
    return SplitResult(out_dir, stem, plan, names, parts_plan)


def _check_given(model: Any, pins: Pins, frozen: dict[str, int | float], given: GivenInputs) -> None:
    """Refuse --input that does not fit the source's inputs (with the pins in place) now, not after every part compiled."""
    from ortcompile.readback.feeds import make_feeds, specs_from_model

    before = specs_from_model(model)  # frozen inputs are still inputs of the source: the check feeds them too
    pinned = _interface_only(model)
    apply_pins(pinned, pins)
    after = {spec.name: spec for spec in specs_from_model(pinned)}
    make_feeds([after.get(spec.name, spec) for spec in before], dims=pins.named, given=given)


def _interface_only(model: Any) -> Any:
    """A model of `model`'s interface only (no nodes, no weights): cheap to copy whatever the model's size."""
    import onnx

    interface = onnx.ModelProto()
    interface.graph.input.extend(model.graph.input)
    interface.graph.output.extend(model.graph.output)
    return interface


def _link_source_files(source: SourceModel, out_dir: Path, stem: str) -> dict[str, str] | None:
    """Hard links to the source's data files in `out_dir` (location as the model writes it -> link name), or None
    when one cannot be made (another filesystem, no permission): the parts then get copies of their weights."""
    links: dict[str, str] = {}
    by_file: dict[Path, str] = {}
    for location in source.external_locations:
        path = source.external_paths[location]
        if path not in by_file:
            by_file[path] = f"{stem}.source{len(by_file)}.data"
            try:
                os.link(path, out_dir / by_file[path])
            except OSError:
                for made in by_file.values():
                    (out_dir / made).unlink(missing_ok=True)
                return None
        links[location] = by_file[path]
    return links


def _point_at(model: Any, links: dict[str, str]) -> None:
    """Every external reference of `model` re-pointed at the linked copy of its file (offsets unchanged)."""
    for site in iter_tensors(model):
        for entry in site.tensor.external_data:
            if entry.key == "location" and entry.value in links:
                entry.value = links[entry.value]


def _value_types(model: Any) -> ValueTypes:
    """Every tensor's type after shape inference (with the pins in place): the parts' interfaces need them."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise CompilationFailed(f"cannot partition: ONNX shape inference fails on the model ({exc})") from exc
    graph = inferred.graph
    return {v.name: v for v in (*graph.value_info, *graph.input, *graph.output)}


def _interface(names: tuple[str, ...], types: ValueTypes, part: PartSpec) -> list[Any]:
    """Value infos for a part's inputs or outputs: known and static, or the split cannot work."""
    infos = []
    for name in names:
        info = types.get(name)
        dims = value_dims(info) if info is not None else []
        if info is None or not info.type.tensor_type.HasField("shape") or any(not d.HasField("dim_value") for d in dims):
            raise CompilationFailed(f"cannot partition at part {part.index}: tensor {name!r} between parts has no static shape after shape "
                                    "inference; pin the model's dynamic dims (--fix-dim/--fix-shape)")
        infos.append(info)
    return infos


def part_model_of(model: Any, part: PartSpec, types: ValueTypes) -> Any:
    """One part as a standalone model: its nodes, the weights they read, its inputs and outputs typed from `types`."""
    import onnx
    from onnx import helper

    wanted = set(part.initializers)
    initializers = [t for t in model.graph.initializer if t.name in wanted]
    graph = helper.make_graph(list(model.graph.node[part.start : part.stop]), f"{model.graph.name}_part{part.index:02d}",
                              _interface(part.inputs, types, part), _interface(part.outputs, types, part), initializers)
    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    proto.graph.CopyFrom(graph)
    return proto


def _skeleton(model: Any, plan: PartitionPlan, types: ValueTypes) -> Any:
    """The model's interface and metadata, and the types of every tensor crossing a cut; no nodes, no weights."""
    import onnx

    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)
    del skeleton.graph.node[:]
    del skeleton.graph.initializer[:]
    del skeleton.graph.value_info[:]
    crossing = sorted({name for part in plan.parts for name in part.outputs} - {o.name for o in model.graph.output})
    skeleton.graph.value_info.extend(types[name] for name in crossing if name in types)
    return skeleton


def _write_part(model: Any, base: Path, out_dir: Path, name: str, layout: LayoutPolicy) -> list[InputFile]:
    """The part and its data files, with their sizes and sha256 (hashed as they are written): the part's identity."""
    data_pass = DataPass(FileSink(out_dir), name, DataLayout(layout))
    try:
        graph = relayout_model(model, base, data_pass)
    except BaseException:
        data_pass.abandon()
        raise
    data = data_pass.finish()
    write_new(out_dir / name, graph)
    return [InputFile(name, len(graph), hashlib.sha256(graph).hexdigest()), *(InputFile(f.name, f.size, f.sha256) for f in data)]


def split_to(source_path: str | os.PathLike[str], out_dir: str | os.PathLike[str], options: CompileOptions, stitch_output: str | None = None,
             reporter: Reporter | None = None) -> SplitResult:
    """`ortcompile split`: the parts of a model, its plan and a Make fragment, published into `out_dir` atomically.

    `options` are the compile options (what shapes the output, and `partition` for the budget); the fragment compiles
    each part with them and stitches into `stitch_output` (None: `stitched/` in `out_dir`)."""
    reporter = reporter or SilentReporter()
    if options.cpu_nodes or options.fallback == "auto":  # the parts plan cannot carry them (compile places nodes itself)
        raise UsageError("--cpu-nodes/--fallback auto do not work with split: compile the model with --partition --cpu-nodes NODE, "
                         "or add --cpu-nodes NODE to the compile of the part that holds the node")
    out = Path(out_dir)
    args = part_cli_args(part_options(options))
    make_fragment(out, strip_onnx(Path(source_path).name), 0, args, stitch_output)  # names Make cannot carry: refused before any work
    reporter.stage("reading model")
    planned = plan_source(Path(source_path), options)
    source, pins = planned.source, planned.pins
    created = prepare_output_dir(out)
    try:
        digest = digest_inputs(source.path.absolute(), source.external_files)
        with Staging(out) as staging:
            reporter.stage(f"splitting {source.path.name}")
            staged = split_model(source, staging.path, planned.part_budget, pins, options.layout, options.freeze, plan_record(planned, digest, out))
            result = SplitResult(out, staged.stem, staged.plan, staged.parts, dataclasses.replace(staged.parts_plan, path=out / plan_file_name(staged.stem)))
            fragment = make_fragment(out, result.stem, len(result.parts), args, stitch_output)
            write_new(staging.path / fragment_name(result.stem), fragment.encode())
            files = sorted(p.name for p in staging.path.iterdir() if p.name != "replaced" and not p.name.startswith("."))
            inputs = [source.path, *source.external_files]
            stale = _previous_split(out, result.stem, files, inputs) if options.force else []
            staging.publish(files, [], options.force, inputs)
        for name in stale:
            (out / name).unlink(missing_ok=True)
    except BaseException:
        remove_created_dirs(created)
        raise
    reporter.stage(f"wrote {len(result.parts)} parts to {out}")
    return result


def _previous_split(out: Path, stem: str, files: list[str], inputs: list[Path]) -> list[str]:
    """Files of an earlier split of this model that this one does not write again (removed after --force): only
    what that split's plan proves it wrote. A name counts when the plan records it with its size and sha256, it
    follows the parts' naming scheme, it is no input of this split (not even a hard link to one), and its bytes are
    still the ones recorded; whatever else a hand-edited plan names stays."""
    plan = out / plan_file_name(stem)
    if not plan.is_file():
        return []
    try:
        old = PartsPlan.load(plan)
    except InvalidModel:
        return []
    if old.stem != stem or old.part_files is None:
        return []
    protected = {(st.st_dev, st.st_ino) for st in (p.stat() for p in inputs if p.exists())}
    stale = []
    for entry in (f for part in old.part_files for f in part):
        path = out / entry.name
        if entry.name in files or not is_part_file(stem, entry.name) or path.is_symlink() or not path.is_file():
            continue
        status = path.stat()
        if (status.st_dev, status.st_ino) in protected or status.st_size != entry.size:
            continue
        if hash_file(path).sha256 == entry.sha256:
            stale.append(entry.name)
    return stale


def part_cli_args(options: CompileOptions, table: Sequence[Option] = TABLE) -> list[str]:
    """The `ortcompile compile` arguments that compile a part as `--partition` does: the options the option table
    passes to parts (what shapes the output), each as its flag."""
    # --no-config: split applied the config already; read again, a section matching `<stem>*` would reach the parts
    args = ["--no-config"]
    for entry in part_flagged(table):
        args += _part_flag(entry, options.value_at(entry.field or entry.name))
    return args


def _part_flag(entry: Option, value: Any) -> list[str]:
    """One option as compile's command line gives it: nothing for an unset value (or a switch at its default)."""
    if entry.kind == "repeat":
        return [a for k, v in sorted(value.items()) for a in (entry.long_name, f"{k}={v}")]
    if entry.kind == "switch":
        on, off = entry.flags[0].split("/")
        return [] if value == entry.default else [on if value else off]
    if value is None or value == "":
        return []
    return [entry.long_name, str(Path(value).absolute()) if entry.type == "file" else str(value)]


def plan_record(plan: SourcePlan, digest: InputDigest | None, parts_dir: Path) -> JsonObject:
    """What the plan file records for `stitch`: the options that shape the output, the source's digest, its op counts
    (the manifest's compiled ops) and where it is (the check runs against it when it is still there). --partition
    records no digest (None): its own, computed meanwhile, goes into the manifest; the split must not wait for it."""
    return {"options": plan.recorded_options(),
            "input": None if digest is None else {"sha256": digest.combined,
                                                  "files": [{"name": n, "size": s, "sha256": h} for n, s, h in digest.files]},
            "source_ops": plan.source.op_counts,
            "source_weight_bytes": plan.source.weight_bytes,
            "source_path": Path(os.path.relpath(plan.source.path.absolute(), parts_dir.absolute())).as_posix(),
            "compile_args": part_cli_args(plan.part_options)}

