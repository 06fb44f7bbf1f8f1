"""The last stage of a split: the parts as files, from the decided source (partsource.py) and its partition plan.

Each part is a standalone ONNX model with its own aligned data file (`<stem>.partNN.onnx` + `.data`), its weights
copied inside the kernel (datapass.py, relayout.py); or, for --partition's parts, which never leave this machine,
reading the source's own data files through hard links. Beside them: `<stem>.skeleton.onnx` (the graph's interface
and the types of the tensors between parts, no nodes, no weights), and then `<stem>.parts.json` (partsplan.py: the
plan, what the caller records, each part's files, from what is written here), which `stitch` joins the parts with.
The names of a split's files are given here.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortcompile.compile.datapass import DataPass, FileSink
from ortcompile.compile.partition import PartitionPlan, PartSpec
from ortcompile.compile.partsource import PartSource, ValueTypes
from ortcompile.compile.relayout import relayout_model
from ortcompile.durable import write_new
from ortcompile.errors import CompilationFailed
from ortcompile.layout import DataLayout, LayoutPolicy
from ortcompile.naming import strip_onnx
from ortcompile.onnxfacts import iter_tensors
from ortcompile.output.manifest import InputFile
from ortcompile.paths import model_dir
from ortcompile.plan.source import SourceModel


def part_name(stem: str, index: int) -> str:
    return f"{stem}.part{index:02d}.onnx"


def plan_file_name(stem: str) -> str:
    return f"{stem}.parts.json"


def skeleton_name(stem: str) -> str:
    return f"{stem}.skeleton.onnx"


def is_part_file(stem: str, name: str) -> bool:
    """A name split gives a part of `stem` or one of its data files (`<stem>.partNN.onnx[.data[.N]]`)."""
    return re.fullmatch(re.escape(stem) + r"\.part\d{2,}\.onnx(\.data(\.[1-9]\d*)?)?", name) is not None


@dataclass(frozen=True)
class WrittenParts:
    """What `write_parts` wrote, for the parts plan (partsplan.write_plan) beside it."""

    directory: Path
    source: str  # the source model's file name
    parts: list[str]  # part model file names, in order
    skeleton: str
    part_files: list[tuple[InputFile, ...]] | None  # per part: its model and data files (None: they read the source's, linked)
    plan_file: Path  # where the parts plan goes


def write_parts(cut_from: PartSource, plan: PartitionPlan, out_dir: Path, layout: LayoutPolicy, link_sources: bool = False) -> WrittenParts:
    """The parts of `cut_from` as `plan` places them and their skeleton, written into `out_dir` (which must exist and
    hold nothing of this model's yet).

    `link_sources` (--partition): the parts read the source's data files through hard links in `out_dir` instead of
    copies of their weights, when the filesystem allows it. The compiled parts are the same either way (a part's
    compile lays its weights out anew), so the stitched bytes are too. Such a plan records no part digests (nothing
    else compiles those parts)."""
    source, model = cut_from.source, cut_from.model
    stem = strip_onnx(source.path.name)
    skeleton = _skeleton(model, plan, cut_from.types).SerializeToString()
    names = [part_name(stem, part.index) for part in plan.parts]
    links = _link_source_files(source, out_dir, stem) if link_sources else None
    written = []
    for part, name in zip(plan.parts, names):
        part_model = part_model_of(model, part, cut_from.types)
        written.append(_write_part(part_model, links, source.path, out_dir, name, layout))
    write_new(out_dir / skeleton_name(stem), skeleton)
    return WrittenParts(out_dir, source.path.name, names, skeleton_name(stem), None if links is not None else written,
                        out_dir / plan_file_name(stem))


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


def _interface(names: tuple[str, ...], types: ValueTypes, part: PartSpec) -> list[Any]:
    """Value infos for a part's inputs or outputs: known and static, or the split cannot work."""
    infos = []
    for name in names:
        info = types.get(name)
        if info is None or not _static(info):
            raise CompilationFailed(f"cannot partition at part {part.index}: tensor {name!r} between parts has no static shape after shape "
                                    "inference; pin the model's dynamic dims (--fix-dim/--fix-shape)")
        infos.append(info)
    return infos


def _static(info: Any) -> bool:
    """A tensor whose shape is known and has a value in every dim."""
    tensor_type = info.type.tensor_type  # (an empty one, without a shape, when the value is no tensor)
    return tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in tensor_type.shape.dim)


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


def _write_part(model: Any, links: dict[str, str] | None, source_path: Path, out_dir: Path, name: str, layout: LayoutPolicy) -> tuple[InputFile, ...]:
    """The part and its data files, with their sizes and sha256 (hashed as they are written): the part's identity.
    With `links`, the part reads the linked source files instead (no data files of its own)."""
    if links is not None:
        _point_at(model, links)
        graph, data = model.SerializeToString(), []
    else:
        graph, data = _relaid_out(model, source_path, out_dir, name, layout)
    write_new(out_dir / name, graph)
    return (InputFile(name, len(graph), hashlib.sha256(graph).hexdigest()), *data)


def _relaid_out(model: Any, source_path: Path, out_dir: Path, name: str, layout: LayoutPolicy) -> tuple[bytes, list[InputFile]]:
    """The part's graph with its weights copied (from the source's files) into its own aligned data files."""
    data_pass = DataPass(FileSink(out_dir), name, DataLayout(layout))
    try:
        graph = relayout_model(model, model_dir(source_path), data_pass)
    except BaseException:
        data_pass.abandon()
        raise
    return graph, [InputFile(f.name, f.size, f.sha256) for f in data_pass.finish()]
