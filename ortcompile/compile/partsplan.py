"""The parts plan `<stem>.parts.json`: what `split` wrote and `stitch` needs, written from split's own record
(`write_plan`: nothing is read back), and its one reader (`PartsPlan.load`).

A plan is read from disk, so `stitch` treats it as untrusted input: every field is checked for its type and range
as it is loaded, and a plan that breaks a rule is refused in one line naming the field (InvalidModel, exit 3).
The files stitch opens are never taken from the plan as written: the parts' and the skeleton's names must be the
ones split derives from the source's name, so a plan cannot point stitch at another file.

Each part's files are recorded with their sizes and sha256 (`part_files`): they are the part's identity (a compiled
part's manifest records the digest of the files it was compiled from, and stitch refuses one that is not the
planned part), and the list of what split wrote (`split --force` removes only those, and only while unchanged).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortcompile import eps
from ortcompile.compile.partfiles import WrittenParts, part_name, skeleton_name
from ortcompile.compile.partition import PartitionPlan, PartSpec
from ortcompile.durable import write_new
from ortcompile.errors import InvalidModel, UsageError
from ortcompile.jsonedge import JsonObject
from ortcompile.naming import strip_onnx
from ortcompile.options import CompileOptions, PartitionOptions
from ortcompile.output.digest import InputDigest
from ortcompile.output.manifest import InputFile
from ortcompile.paths import is_plain_name

PARTS_FORMAT = "ortcompile-parts/2"  # 2: each part's files (its identity), the graph's node count, the compile arguments
FIELDS = ("format", "source", "source_path", "input", "options", "source_ops", "source_weight_bytes", "plan", "parts", "part_files",
          "skeleton", "dims", "compile_args")
SPEC_FIELDS = ("index", "nodes", "inputs", "outputs", "initializers", "weight_bytes")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Recorded:
    """What a split records about its source and the options (split.plan_record), beside the cut and the parts."""

    source_path: str  # the source, relative to the plan's directory
    digest: InputDigest  # the source's (no files: --partition's, whose digest is computed meanwhile)
    options: JsonObject  # the output-shaping options, as the manifest records them
    source_ops: dict[str, int]
    weight_bytes: int
    dims: dict[str, int]  # the named pins
    compile_args: list[str]


@dataclass(frozen=True)
class PartsPlan:
    """The `<stem>.parts.json` split wrote: what stitch needs about the source and its parts."""

    path: Path
    source: str  # the source model's file name
    source_path: str  # where it was, relative to the plan's directory (the check and --verify use it when it is still there)
    parts: list[str]  # part model file names, in graph order
    specs: list[JsonObject]  # per part: nodes, inputs, outputs, weight bytes (partition.PartSpec.to_json)
    skeleton: str
    digest: InputDigest  # the source's (no files: --partition, whose digest is computed meanwhile)
    options: JsonObject  # the output-shaping options, as the manifest records them
    source_ops: dict[str, int]
    dims: dict[str, int]  # the source's dims as pinned: the check feeds the source inputs of these shapes
    budget_bytes: int  # the weights a part may hold, as split applied it (auto resolved)
    weight_bytes: int  # the source's weights, each once (parts reading one weight list it each)
    part_files: list[tuple[InputFile, ...]] | None  # per part: its model and data files as split wrote them (None: --partition's own)
    compile_args: list[str]  # `ortcompile compile` arguments that compile a part as planned
    nodes: int  # the source graph's nodes, which the parts cover

    @property
    def directory(self) -> Path:
        return self.path.parent

    @property
    def stem(self) -> str:
        return strip_onnx(self.source)

    @classmethod
    def load(cls, path: Path, internal: bool = False) -> PartsPlan:
        """The plan at `path`, every field checked. `internal`: written by --partition in its own stage, which
        records no digests (the parts are compiled right there; the source's digest is computed meanwhile)."""
        try:
            document = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InvalidModel(f"{path}: not a parts plan written by ortcompile split ({exc})") from None
        found = document.get("format") if isinstance(document, dict) else None
        if isinstance(found, str) and found.startswith("ortcompile-parts/") and found != PARTS_FORMAT:
            raise InvalidModel(f"{path}: a parts plan of another ortcompile version (format {found[:40]!r}, expected {PARTS_FORMAT!r}); "
                               "split the model again")
        if found != PARTS_FORMAT:
            raise InvalidModel(f"{path}: not a parts plan written by ortcompile split (format {str(found)[:40]!r}, expected {PARTS_FORMAT!r})")
        try:
            return _read(path, document, internal)
        except _Invalid as exc:
            raise InvalidModel(f"{path}: invalid parts plan: {exc.field!r} {exc.problem}; write it again with ortcompile split") from None

    def compile_options(self, **overrides: Any) -> CompileOptions:
        """The options the parts were planned with (what shapes the output), plus the caller's for finishing."""
        ep_options = eps.recorded_options(self.options["ep_options"], str(self.path))  # no library
        return dataclasses.replace(CompileOptions.from_record(self.options, **overrides), ep_options=ep_options)


    def to_json(self) -> JsonObject:
        """The plan file's document, as `load` reads it."""
        digest = None if not self.digest.files else {"sha256": self.digest.combined,
                                                     "files": [{"name": n, "size": s, "sha256": h} for n, s, h in self.digest.files]}
        files = None if self.part_files is None else [[_file_json(f) for f in part] for part in self.part_files]
        return {"format": PARTS_FORMAT, "source": self.source, "source_path": self.source_path, "input": digest, "options": self.options,
                "source_ops": self.source_ops, "source_weight_bytes": self.weight_bytes,
                "plan": {"budget_bytes": self.budget_bytes, "nodes": self.nodes, "parts": self.specs}, "parts": self.parts,
                "part_files": files, "skeleton": self.skeleton, "dims": self.dims, "compile_args": self.compile_args}


def write_plan(written: WrittenParts, cut: PartitionPlan, recorded: Recorded) -> PartsPlan:
    """The plan of what split wrote (`written`, as `cut` placed it; `recorded` beside), written for stitch in another
    process: the writer keeps the record it made (stitch reads the file with `PartsPlan.load`, every field checked)."""
    specs = [_spec_json(part) for part in cut.parts]
    plan = PartsPlan(written.plan_file, written.source, recorded.source_path, written.parts, specs, written.skeleton, recorded.digest,
                     recorded.options, recorded.source_ops, recorded.dims, cut.budget, recorded.weight_bytes, written.part_files,
                     recorded.compile_args, cut.nodes)
    write_new(plan.path, json.dumps(plan.to_json(), indent=2, sort_keys=True) + "\n")
    return plan


def _spec_json(part: PartSpec) -> JsonObject:
    return {"index": part.index, "nodes": [part.start, part.stop], "inputs": list(part.inputs), "outputs": list(part.outputs),
            "initializers": len(part.initializers), "weight_bytes": part.weight_bytes}


def _file_json(file: InputFile) -> JsonObject:
    return {"name": file.name, "size": file.size, "sha256": file.sha256}


# ---------------------------------------------------------------- validation


class _Invalid(Exception):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(field, problem)
        self.field, self.problem = field, problem


def _read(path: Path, document: JsonObject, internal: bool) -> PartsPlan:
    for key in document:
        _need(key in FIELDS, str(key)[:40], "is not a field of a parts plan")
    for key in FIELDS:
        _need(key in document, key, "is missing")
    source = document["source"]
    _need(isinstance(source, str) and is_plain_name(source), "source", "must be the source model's file name")
    stem = strip_onnx(source)
    _need(_is_str(document["source_path"]) and document["source_path"], "source_path", "must be a path relative to the plan")
    parts = _list(document["parts"], "parts")
    _need(len(parts) > 0, "parts", "must list at least one part")
    for index, name in enumerate(parts):
        _need(name == part_name(stem, index), f"parts[{index}]", f"must be {part_name(stem, index)!r}: the name split gives that part of {source}")
    specs, budget, nodes = _plan(document["plan"], len(parts))
    _need(document["skeleton"] == skeleton_name(stem), "skeleton", f"must be {skeleton_name(stem)!r}")
    digest = _input(document["input"], source, internal)
    options = _options(document["options"])
    return PartsPlan(path, source, document["source_path"], parts, specs, document["skeleton"], digest, options,
                     _counts(document["source_ops"], "source_ops", 0), _counts(document["dims"], "dims", 0), budget,
                     _int(document["source_weight_bytes"], "source_weight_bytes"), _part_files(document["part_files"], parts, internal),
                     _strings(document["compile_args"], "compile_args"), nodes)


def _plan(value: Any, count: int) -> tuple[list[JsonObject], int, int]:
    """The cut: `count` parts of contiguous node ranges covering the graph, in order."""
    plan = _dict(value, "plan")
    _need(sorted(plan) == ["budget_bytes", "nodes", "parts"], "plan", "must hold budget_bytes, nodes and parts")
    budget = _int(plan["budget_bytes"], "plan.budget_bytes", 1)
    nodes = _int(plan["nodes"], "plan.nodes")
    specs = _list(plan["parts"], "plan.parts")
    _need(len(specs) == count, "plan.parts", f"must describe the {count} parts 'parts' lists")
    start = 0
    for index, spec in enumerate(specs):
        where = f"plan.parts[{index}]"
        _need(isinstance(spec, dict) and sorted(spec) == sorted(SPEC_FIELDS), where, f"must hold {', '.join(SPEC_FIELDS)}")
        _need(spec["index"] == index and _is_int(spec["index"]), f"{where}.index", f"must be {index}")
        bounds = spec["nodes"]
        _need(isinstance(bounds, list) and len(bounds) == 2 and all(_is_int(b) for b in bounds) and bounds[0] == start and bounds[1] >= start,
              f"{where}.nodes", f"must be [{start}, STOP]: the nodes from where the previous part ends")
        start = bounds[1]
        _strings(spec["inputs"], f"{where}.inputs")
        _strings(spec["outputs"], f"{where}.outputs")
        _int(spec["initializers"], f"{where}.initializers")
        _int(spec["weight_bytes"], f"{where}.weight_bytes")
    _need(start == nodes, "plan.parts", f"must cover the graph's {nodes} nodes (they end at node {start})")
    return specs, budget, nodes


def _input(value: Any, source: str, internal: bool) -> InputDigest:
    """The source's digest as split computed it: files (the model first) whose combined sha256 is recorded."""
    if value is None and internal:
        return InputDigest(())
    record = _dict(value, "input")
    _need(sorted(record) == ["files", "sha256"], "input", "must hold sha256 and files")
    files = _files(record["files"], "input.files")
    _need(len(files) > 0 and files[0].name == source, "input.files", f"must list {source} first")
    digest = InputDigest(tuple((f.name, f.size, f.sha256) for f in files))
    _need(record["sha256"] == digest.combined, "input.sha256", "must be the digest of input.files")
    return digest


def _part_files(value: Any, parts: list[str], internal: bool) -> list[tuple[InputFile, ...]] | None:
    if value is None and internal:
        return None
    listed = _list(value, "part_files")
    _need(len(listed) == len(parts), "part_files", f"must list the files of each of the {len(parts)} parts")
    result = []
    for index, (entries, name) in enumerate(zip(listed, parts)):
        where = f"part_files[{index}]"
        files = _files(entries, where)
        _need(len(files) > 0 and files[0].name == name, where, f"must list {name} first")
        _need(all(f.name == name or _is_data_of(name, f.name) for f in files) and len({f.name for f in files}) == len(files), where,
              f"must name {name} and its data files only")
        result.append(files)
    return result


def _is_data_of(model: str, name: str) -> bool:
    return re.fullmatch(re.escape(model) + r"\.data(\.[1-9]\d*)?", name) is not None


def _files(value: Any, where: str) -> tuple[InputFile, ...]:
    files = []
    for index, entry in enumerate(_list(value, where)):
        field = f"{where}[{index}]"
        _need(isinstance(entry, dict) and sorted(entry) == ["name", "sha256", "size"], field, "must hold name, size and sha256")
        _need(_is_str(entry["name"]) and entry["name"], f"{field}.name", "must be a file name")
        _need(_is_str(entry["sha256"]) and _SHA256.fullmatch(entry["sha256"]) is not None, f"{field}.sha256", "must be a sha256 in hex")
        files.append(InputFile(entry["name"], _int(entry["size"], f"{field}.size"), entry["sha256"]))
    return tuple(files)


def _options(value: Any) -> JsonObject:
    """The recorded options: each key of the type ortcompile records, and nothing it would not record."""
    options = _dict(value, "options")
    _need(_is_str(options.get("ep")) and options.get("ep"), "options.ep", "must be an EP name")
    ep_options = _dict(options.get("ep_options"), "options.ep_options")
    _need(all(_is_str(k) and _is_str(v) for k, v in ep_options.items()), "options.ep_options", "must map option names to text")
    layout = _dict(options.get("layout"), "options.layout")
    _need(sorted(layout) == ["align", "align_threshold", "inline_threshold", "shard_size"], "options.layout",
          "must hold align, align_threshold, inline_threshold and shard_size")
    for key in ("align", "align_threshold", "inline_threshold"):
        _int(layout[key], f"options.layout.{key}")
    _need(layout["shard_size"] is None or _is_int(layout["shard_size"]), "options.layout.shard_size", "must be a size or null")
    _need(options.get("embed") in ("auto", "always", "never"), "options.embed", "must be auto, always or never")
    for key in ("require_compiled", "share_weights", "prepare"):
        _need(isinstance(options.get(key), bool), f"options.{key}", "must be true or false")
    _need(options["share_weights"] is False, "options.share_weights", "must be false: split does not share weights")
    _counts(options.get("fix_dims"), "options.fix_dims", 0)
    shapes = _dict(options.get("fix_shapes"), "options.fix_shapes")
    _need(all(_is_str(k) and isinstance(v, list) and all(_is_int(d) and d >= 0 for d in v) for k, v in shapes.items()),
          "options.fix_shapes", "must map input names to lists of dims")
    freeze = _dict(options.get("freeze", {}), "options.freeze")
    _need(all(_is_str(k) and (_is_int(v) or isinstance(v, float)) for k, v in freeze.items()), "options.freeze", "must map input names to numbers")
    partition = _dict(options.get("partition"), "options.partition")
    _need(sorted(partition) == ["budget", "max_context_size"] and all(v is None or _is_int(v) and v > 0 for v in partition.values()),
          "options.partition", "must hold budget and max_context_size (sizes or null)")
    _need("target" not in options or (_is_str(options["target"]) and options["target"]), "options.target", "must be a target name")
    try:
        # (split records no --cpu-nodes/--fallback: a plan that does is refused below as recording what split does not)
        rebuilt = CompileOptions.from_record(options, partition=PartitionOptions(partition["budget"]), max_context_size=partition["max_context_size"],
                                             cpu_nodes=(), fallback="off")
    except UsageError as exc:
        raise _Invalid("options.layout", f"is not a layout ortcompile writes ({exc.message})") from None
    recorded = rebuilt.recorded(options["ep"], options["require_compiled"], compiles=True)
    for key in options:
        _need(key in recorded and recorded[key] == options[key], f"options.{str(key)[:40]}", "is not an option split records")
    _need(sorted(recorded) == sorted(options), "options", "must record every option split records")
    return options


def _need(condition: Any, field: str, problem: str) -> None:
    if not condition:
        raise _Invalid(field, problem)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_str(value: Any) -> bool:
    return isinstance(value, str) and "\0" not in value


def _int(value: Any, field: str, minimum: int = 0) -> int:
    _need(_is_int(value) and value >= minimum, field, f"must be an integer of at least {minimum}")
    return int(value)


def _list(value: Any, field: str) -> list[Any]:
    _need(isinstance(value, list), field, "must be a list")
    return list(value)


def _dict(value: Any, field: str) -> JsonObject:
    _need(isinstance(value, dict), field, "must be an object")
    return dict(value)


def _strings(value: Any, field: str) -> list[str]:
    items = _list(value, field)
    _need(all(_is_str(v) for v in items), field, "must be a list of text")
    return items


def _counts(value: Any, field: str, minimum: int) -> dict[str, int]:
    counts = _dict(value, field)
    _need(all(_is_str(k) and _is_int(v) and v >= minimum for k, v in counts.items()), field, f"must map names to integers of at least {minimum}")
    return counts
