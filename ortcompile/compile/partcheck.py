"""A compiled part, proved before `stitch` uses its bytes: the planned part, compiled as planned, unchanged since.

- Identity: a compiled part's manifest records the digest of the files it was compiled from (its `input`); they
  must be the files the plan records for that part. A part compiled from an earlier split of a changed source is
  refused, or its bytes would be stitched under the new source's digest and `--if-changed` trust them forever.
- Build: the EP, EP options and target the plan records, and the versions of the first part.
- Integrity: every file the compiled graph names (its data files, its EP blobs) is listed in its manifest, and
  each has the size and sha256 recorded there. The model file is hashed as it is read; its data files on a helper
  thread while the stitch copies from them; a blob that stays a file is compared with the sha256 the stitched
  output's manifest computes of it anyway (no extra pass), a blob that may be embedded (small) when it is linked.

Every refusal names the part and gives the exact command that compiles it again.

`--partition` compiles its parts in its own stage moments before stitching them: its plan records no part digests
and its parts are not hashed again.
"""

from __future__ import annotations

import hashlib
import shlex
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile.compile.graphpass import AUTO_EMBED_LIMIT
from ortcompile.compile.partsplan import PartsPlan
from ortcompile.errors import InvalidModel, UsageError
from ortcompile.naming import OutputNames
from ortcompile.onnxfacts import blob_location, epcontext_nodes, external_locations
from ortcompile.output.digest import WrittenFile, hash_file
from ortcompile.output.manifest import FileEntry, Manifest, ManifestError
from ortcompile.paths import is_plain_name


def compile_command(plan: PartsPlan, part: str, compiled_dir: Path) -> str:
    """The command that compiles `part` as planned into `compiled_dir`, as it can be pasted into a shell (--force: a
    refused part's earlier output is there to be replaced, as the Make fragment's rule does)."""
    return shlex.join(["ortcompile", "compile", str(plan.directory / part), "-o", f"{compiled_dir}/", "--force", *plan.compile_args])


@dataclass
class CompiledPart:
    name: str  # the planned part's file name (`<stem>.partNN.onnx`)
    model: Any  # its compiled graph, external data not loaded
    manifest: Manifest
    again: str  # the command that compiles it again

    def entry(self, name: str) -> FileEntry:
        return next(f for f in self.manifest.files if f.name == name)

    def refuse(self, why: str) -> InvalidModel:
        return InvalidModel(f"part {self.name}: {why}; compile it again with: {self.again}")


@dataclass
class PartVerifier:
    """Checks of the parts' files that run beside the stitch (`verify=False`: --partition's own parts, trusted)."""

    verify: bool = True
    embed: str = "auto"  # the stitched output's --embed: which blobs may end up inside the graph
    _pool: ThreadPoolExecutor | None = None
    _pending: list[tuple[CompiledPart, FileEntry, Future[WrittenFile]]] = field(default_factory=list)
    _blobs: dict[str, tuple[CompiledPart, FileEntry]] = field(default_factory=dict)  # staged name -> what it must be

    def read(self, plan: PartsPlan, index: int, compiled_dir: Path, first: Manifest | None) -> CompiledPart:
        """The compiled part `plan.parts[index]`: its graph, checked as the module docstring says (data files: started)."""
        import onnx

        name = plan.parts[index]
        names = OutputNames.for_source(name)
        again = compile_command(plan, name, compiled_dir)
        path = compiled_dir / names.model
        if not path.is_file():
            raise UsageError(f"part {name} is not compiled: {path} is missing; compile it with: {again}")
        try:
            manifest = Manifest.load(compiled_dir / names.manifest)
        except ManifestError as exc:
            raise InvalidModel(f"part {name}: {exc}; compile it again with: {again}") from None
        part = CompiledPart(name, None, manifest, again)
        _same_build(part, plan, first)
        if self.verify:
            _same_source(part, plan, index)
        content = self._model_bytes(part, path, names.model)
        try:
            part.model = onnx.load_model_from_string(content)
        except Exception as exc:  # DecodeError and friends: bytes its manifest vouched for, yet not a model
            raise part.refuse(f"{names.model} is not an ONNX model ({type(exc).__name__})") from None
        self._start_data(part, compiled_dir)
        return part

    def blob_linked(self, part: CompiledPart, location: str, staged: Path) -> None:
        """A blob of `part` now at `staged`: checked at once when small enough to be embedded, else when the stitched
        output's manifest hashes it (`check_blobs`)."""
        entry = part.entry(location)
        if staged.stat().st_size != entry.size:
            raise part.refuse(f"{location} is not the size its manifest records")
        if not self.verify:
            return
        if entry.size <= AUTO_EMBED_LIMIT or self.embed == "always":  # may be embedded: its file is gone when the output is hashed
            _compare(part, entry, hash_file(staged))
        else:
            self._blobs[staged.name] = (part, entry)

    def finish_data(self) -> None:
        """Wait for the data files' hashes; refuse a part whose file is not what its manifest records."""
        try:
            for part, entry, future in self._pending:
                _compare(part, entry, future.result())
        finally:
            self.close()

    def check_blobs(self, written: list[WrittenFile]) -> None:
        """The staged blobs as the stitched output's manifest hashed them, against what each part's manifest records."""
        hashed = {f.name: f for f in written}
        for staged, (part, entry) in self._blobs.items():
            if staged not in hashed:  # never: a blob this large is embedded only by --embed always, checked when linked
                raise part.refuse(f"{entry.name} was not staged as a file")
            _compare(part, entry, hashed[staged])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _model_bytes(self, part: CompiledPart, path: Path, model_name: str) -> bytes:
        content = path.read_bytes()
        listed = [f for f in part.manifest.files if f.name == model_name and f.role == "model"]
        if not listed:
            raise part.refuse(f"its manifest does not list {model_name}")
        if self.verify:
            _compare(part, listed[0], WrittenFile(model_name, len(content), hashlib.sha256(content).hexdigest()))
        return content

    def _start_data(self, part: CompiledPart, compiled_dir: Path) -> None:
        """Every file the graph names must be listed in the manifest (with its role); data files are hashed meanwhile."""
        listed = {f.name: f for f in part.manifest.files}
        blobs = {location for node in epcontext_nodes(part.model) if (location := blob_location(node)) is not None}
        for location, role in [*((n, "data") for n in external_locations(part.model)), *((n, "ep_context") for n in sorted(blobs))]:
            if not is_plain_name(location):
                raise part.refuse(f"its graph names the file {location[:100]!r}, which is not a plain file name beside it")
            entry = listed.get(location)
            if entry is None or entry.role != role:
                raise part.refuse(f"its graph names {location}, which its manifest does not list as {role.replace('_', ' ')}")
            target = compiled_dir / location
            if not target.is_file() or target.stat().st_size != entry.size:
                raise part.refuse(f"{location} is missing or not the size its manifest records")
            if role == "data" and self.verify:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortcompile-part-hash")
                self._pending.append((part, entry, self._pool.submit(hash_file, target)))


def _compare(part: CompiledPart, entry: FileEntry, got: WrittenFile) -> None:
    if got.size != entry.size or got.sha256 != entry.sha256:
        raise part.refuse(f"{entry.name} is not the file its manifest records (sha256 differs): it changed after the part was compiled")


def _same_build(part: CompiledPart, plan: PartsPlan, first: Manifest | None) -> None:
    """Compiled as planned (EP, options, target) and with the versions of the first part: a stitched model of mixed
    builds would not be one model."""
    planned, manifest = plan.options, part.manifest
    if manifest.ep != planned["ep"] or manifest.options.get("ep_options") != planned["ep_options"] or \
            manifest.options.get("target") != planned.get("target"):
        raise UsageError(f"part {part.name} was not compiled as planned (--ep {planned['ep']}, its --ep-option and --target): "
                         f"compile it again with: {part.again}")
    if first is not None and manifest.versions != first.versions:
        raise UsageError(f"part {part.name} was compiled with other ortcompile/onnxruntime/EP versions than {plan.parts[0]}: "
                         f"compile it again with: {part.again}")


def _same_source(part: CompiledPart, plan: PartsPlan, index: int) -> None:
    """The compiled part's input is the planned part: the same files, sizes and sha256."""
    assert plan.part_files is not None
    planned = {(f.name, f.size, f.sha256) for f in plan.part_files[index]}
    compiled = {(f.name, f.size, f.sha256) for f in part.manifest.input_files}
    if compiled != planned:
        raise UsageError(f"part {part.name} was compiled from another {part.name} than the one this plan split (an earlier split, "
                         f"or another model's): compile it again with: {part.again}")
