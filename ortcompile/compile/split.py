"""`ortcompile split` and the first step of `--partition`: a model written as parts that compile on their own.

Each part is a standalone ONNX model with its own aligned data file (`<stem>.partNN.onnx` + `.data`): on one
machine the parts compile one after another in child processes; in a build system each is one build step, on any
machine. Beside them: `<stem>.skeleton.onnx` (the graph's interface and the types of the tensors between parts,
no nodes, no weights) and `<stem>.parts.json` (the plan, the source's digest, the options), which `stitch` joins
the compiled parts with; and `<stem>.parts.mk`, a Make fragment that builds the whole thing.

A split is four stages, each a function from data to data that `split_model` calls once, in order: the source
decided (partsource.py), where to cut it (partition.py), the parts written (partfiles.py), their plan written
(partsplan.py). Only the graph proto is parsed (weights stay where they are, copied inside the kernel into each part's data file), so splitting a model
costs about its size in disk and little memory.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortcompile.compile.makefrag import fragment_name, make_fragment
from ortcompile.compile.partfiles import is_part_file, plan_file_name, write_parts
from ortcompile.compile.partition import PartitionPlan, plan_split
from ortcompile.compile.partsource import read_part_source
from ortcompile.compile.partsplan import PartsPlan, Recorded, write_plan
from ortcompile.durable import write_new
from ortcompile.errors import InvalidModel, UsageError, output_error
from ortcompile.naming import strip_onnx
from ortcompile.options import CompileOptions, GivenInputs
from ortcompile.optiontable import TABLE, Option, part_flagged
from ortcompile.output.digest import InputDigest, digest_inputs, hash_file
from ortcompile.output.publish import Staging, prepare_output_dir, remove_created_dirs
from ortcompile.plan.planner import SourcePlan, part_options, plan_source
from ortcompile.progress import Reporter, SilentReporter


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


def split_model(plan: SourcePlan, out_dir: Path, budget: int, *, plan_dir: Path | None = None, digest: InputDigest | None = None,
                link_sources: bool = False, given: GivenInputs | None = None, cuts: Sequence[int] | None = None) -> SplitResult:
    """Write the parts of `plan`'s source into `out_dir` (which must exist and hold nothing of this model's yet), with
    the plan file `ortcompile stitch` reads, in stages that hand data on: the source decided (partsource.py: frozen,
    pinned, `given` checked, typed), where to cut it (partition.py: by `budget`, and before the node indices in `cuts`
    too), the parts written (partfiles.py; `link_sources` for --partition's parts), their plan written (partsplan.py:
    `plan_record(plan, digest, plan_dir)` beside; `plan_dir` is where the plan is read from, None: `out_dir`)."""
    recorded = plan_record(plan, digest, plan_dir or out_dir)
    cut_from = read_part_source(plan.source, plan.pins, plan.options.freeze, given)
    cut = plan_split(cut_from.model, cut_from.weight_bytes, budget, cuts)
    try:
        written = write_parts(cut_from, cut, out_dir, plan.options.layout, link_sources)
        parts_plan = write_plan(written, cut, recorded)
    except OSError as exc:
        raise output_error(exc, f"the parts in {out_dir}") from exc
    return SplitResult(out_dir, parts_plan.stem, cut, written.parts, parts_plan)


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
    source = planned.source
    created = prepare_output_dir(out)
    try:
        digest = digest_inputs(source.path.absolute(), source.external_files)
        with Staging(out) as staging:
            reporter.stage(f"splitting {source.path.name}")
            staged = split_model(planned, staging.path, planned.part_budget, plan_dir=out, digest=digest)
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


def plan_record(plan: SourcePlan, digest: InputDigest | None, parts_dir: Path) -> Recorded:
    """What the plan file records for `stitch`: the options that shape the output, the source's digest, its op counts
    (the manifest's compiled ops), where it is (the check runs against it when it is still there) and its pins.
    --partition records no digest (None): its own, computed meanwhile, goes into the manifest; the split must not wait for it."""
    return Recorded(source_path=Path(os.path.relpath(plan.source.path.absolute(), parts_dir.absolute())).as_posix(),
                    digest=InputDigest(() if digest is None else digest.files), options=plan.recorded_options(), source_ops=plan.source.op_counts,
                    weight_bytes=plan.source.weight_bytes, dims=plan.pins.named, compile_args=part_cli_args(plan.part_options))
