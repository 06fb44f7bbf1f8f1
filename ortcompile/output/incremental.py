"""Incremental builds: `--if-changed` (is the published output current?) and `--depfile` (Make rules).

What "current" means: the manifest beside the destination records the same input digest (sha256 of the
model file and of every external data file it references), the same options, the same ortcompile /
onnxruntime / EP versions, and every output file it lists still has its recorded size.

Hashing a multi-GB input costs seconds, so the digest is cached in a stamp file under
`$XDG_CACHE_HOME/ortcompile/stamps/` (keyed by the manifest's absolute path; not an output: it holds inode
numbers and timestamps, which must stay out of the deterministic manifest and the output directory).
Without the cache (a fresh CI machine) the inputs are simply hashed again. A file's cached sha256 is trusted only when its size, inode, device, mtime
and ctime are all unchanged. The kernel sets ctime on every write, rename or chmod, and no API sets it
back, so any change to the bytes changes the fingerprint. One gap remains, as in git's index: a write in
the same clock tick as the stat taken before hashing. Entries whose ctime is within RACY_WINDOW_NS of
that moment are therefore never trusted and are hashed again.

This module imports neither onnx nor onnxruntime, so an up-to-date check returns in milliseconds.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ortcompile.durable import replace_file
from ortcompile.eps.catalog import EpInfo
from ortcompile.eps.discovery import choose_ep
from ortcompile.errors import OutputError
from ortcompile.jsonedge import JsonObject
from ortcompile.naming import OutputTarget
from ortcompile.native import peak_rss_bytes
from ortcompile.options import CHECK_MODES, CompileOptions, CompileResult
from ortcompile.output.digest import InputDigest, hash_file
from ortcompile.output.manifest import InputFile, Manifest, Versions
from ortcompile.paths import model_dir
from ortcompile.version import __version__

RACY_WINDOW_NS = 2_000_000_000
STAMP_FORMAT = "ortcompile-stamp/1"


@dataclass(frozen=True)
class Fingerprint:
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int

    @classmethod
    def of(cls, path: Path) -> Fingerprint:
        st = path.stat()
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def stamp_path(target: OutputTarget) -> Path:
    """Outside the output directory, so outputs stay exactly the files the manifest lists."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ortcompile" / "stamps"
    key = hashlib.sha256(str(target.manifest_path.resolve()).encode()).hexdigest()[:32]
    return cache / f"{key}.json"


def write_stamp(target: OutputTarget, source: Path, digest: InputDigest) -> None:
    """Remember each input's fingerprint next to the sha256 it hashed to (a cache: failure is harmless)."""
    entries = [{"name": name, "sha256": sha, **fp} for (name, _, sha), fp in zip(digest.files, digest.fingerprints)]
    stamp = {"format": STAMP_FORMAT, "source_dir": str(model_dir(source)), "hashed_at_ns": digest.hashed_at_ns, "files": entries}
    path = stamp_path(target)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Atomic, not synced: a stamp lost to a power cut costs one re-hash, an fsync would cost every compile.
        replace_file(path, json.dumps(stamp, sort_keys=True), pending=path.with_name(path.name + f".{os.getpid()}.tmp"), sync=False)
    except OSError:
        pass


def _cached_sha256(stamp: JsonObject, name: str, path: Path) -> str | None:
    for entry in stamp.get("files", []):
        if entry.get("name") != name:
            continue
        recorded = Fingerprint(entry["size"], entry["mtime_ns"], entry["ctime_ns"], entry["ino"], entry["dev"])
        racy = recorded.ctime_ns >= stamp.get("hashed_at_ns", 0) - RACY_WINDOW_NS
        return entry["sha256"] if recorded == Fingerprint.of(path) and not racy else None
    return None


def _load_json(path: Path) -> JsonObject:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


@dataclass(frozen=True)
class Expected:
    """What a manifest written here and now would record for these options and the published inputs: the driver's
    side of --if-changed (compile/job.py), told without loading onnxruntime, held against the published manifest."""

    ep: EpInfo | None  # the EP a compile would use (None: none can be told cheaply)
    options: JsonObject | None  # as the manifest records them (None with no EP)
    check: str  # --check as asked
    check_run: str  # the check a compile would run on these inputs (`auto` decided by their weight)
    versions: Versions | None
    inputs: tuple[Path | str, ...]  # the published inputs as paths beside the source, or why a recorded name cannot be one

    @classmethod
    def of(cls, options: CompileOptions, check_run: str, inputs: tuple[Path | str, ...]) -> Expected:
        info = choose_ep(options.ep, options.ep_library).expected()
        if info is None:
            return cls(None, None, options.check, check_run, None, inputs)
        require = info.compiles if options.require_compiled is None else options.require_compiled
        versions = Versions(__version__, _installed_version("onnxruntime"), info.ep_name, _installed_version(info.distribution))
        return cls(info, options.recorded(info.short_name, require, info.compiles), options.check, check_run, versions, inputs)


@dataclass(frozen=True)
class Freshness:
    """--if-changed's answer: the published output's result when it is current, else why it is rebuilt."""

    result: CompileResult | None
    reason: str = ""


def published_if_current(source: Path, target: OutputTarget, published: Manifest, expected: Expected, started: float) -> Freshness:
    """The published output's result when its manifest says what `expected` does, its files are there and its inputs
    unchanged (`started`: the perf_counter the check began at), else the reason it is not."""
    reason = _record_differs(published, expected) or _outputs_changed(target, published)
    if reason:
        return Freshness(None, reason)
    hashed, reason = _inputs_hashed(source, target, published.input_files, expected.inputs)
    if reason:
        return Freshness(None, reason)
    result = _up_to_date_result(source, target, published, time.perf_counter() - started, peak_rss_bytes())
    if hashed is not None:  # same bytes, new fingerprint (e.g. touched): cache it so the next check is fast again
        write_stamp(target, source, hashed)
    return Freshness(result)


def _record_differs(published: Manifest, expected: Expected) -> str:
    if expected.ep is None or published.ep != expected.ep.short_name:
        return "the execution provider differs"
    if published.options != expected.options:
        return "options differ"
    if (published.check.strength if published.check else 0) < CHECK_MODES.index(expected.check_run):  # (none recorded: proved nothing)
        return f"the output was published with a weaker check than --check {expected.check}"
    if published.versions != expected.versions:
        return "ortcompile, onnxruntime or EP version differs"
    return ""


def _outputs_changed(target: OutputTarget, published: Manifest) -> str:
    for entry in published.files:
        path = target.directory / entry.name
        if not path.is_file() or path.stat().st_size != entry.size:
            return f"output {entry.name} is missing or changed size"
    return ""


def _inputs_hashed(source: Path, target: OutputTarget, recorded: tuple[InputFile, ...], paths: tuple[Path | str, ...]) -> tuple[InputDigest | None, str]:
    """'' when every recorded input (at `paths`) has its recorded sha256, from the stamp where its fingerprint is
    trusted, else hashed: then with the digest to cache when some were hashed; else why not."""
    if not recorded or recorded[0].name != source.name:
        return None, "the manifest was made from another input"
    stamp = _load_json(stamp_path(target))
    if stamp.get("source_dir") != str(model_dir(source)):
        stamp = {}
    started_ns, rehashed = time.time_ns(), False
    files, fingerprints = [], []
    for entry, path in zip(recorded, paths):
        if isinstance(path, str):
            return None, path
        if not path.is_file():
            return None, f"input {entry.name} is missing"
        fingerprint = Fingerprint.of(path)  # before hashing, as digest_inputs does
        if fingerprint.size != entry.size:
            return None, f"input {entry.name} changed"
        sha = _cached_sha256(stamp, entry.name, path)
        if sha is None:
            sha, rehashed = hash_file(path).sha256, True
        if sha != entry.sha256:
            return None, f"input {entry.name} changed"
        files.append((entry.name, entry.size, sha))
        fingerprints.append(fingerprint.__dict__)
    return (InputDigest(tuple(files), tuple(fingerprints), started_ns) if rehashed else None), ""


def make_escape(path: str) -> str:
    """Escape a path for a Make rule as gcc -MD does: spaces, '#', '$' and ':'."""
    if "\n" in path:
        raise OutputError(f"cannot write a depfile for a path with a newline: {path!r}")
    return path.replace("$", "$$").replace("#", "\\#").replace(" ", "\\ ").replace(":", "\\:")


def depfile_rule(target: Path, dependencies: list[Path]) -> str:
    """The rule, then an empty rule per dependency (gcc -MP): a data file that a re-exported model no
    longer references must not stop Make with 'No rule to make target'."""
    escaped = [make_escape(str(d)) for d in dependencies]
    deps = " \\\n  ".join(escaped)
    phony = "".join(f"\n{d}:\n" for d in escaped)
    return f"{make_escape(str(target))}: \\\n  {deps}\n{phony}"


def write_depfile(path: Path, rules: list[str]) -> None:
    """Written whole and renamed into place, like every other output."""
    try:
        # Atomic, not synced (as before): Make reads it again on the next run, which a lost depfile only makes rebuild.
        replace_file(path, "".join(rules), pending=path.with_name(f".{path.name}.{os.getpid()}.tmp"), sync=False)
    except OSError as exc:
        raise OutputError(f"cannot write depfile {path}: {exc.strerror}") from exc


def _up_to_date_result(source: Path, target: OutputTarget, manifest: Manifest, seconds: float, peak_rss: int) -> CompileResult:
    """The result of a compile that found its output current and did nothing."""
    return CompileResult(
        source=source, output_dir=target.directory, model=manifest.model, ep=manifest.versions.ep_name,
        ep_version=manifest.versions.ep_version, files=[f.to_json() for f in manifest.files],
        epcontext_nodes=manifest.nodes.epcontext, remaining_ops=manifest.nodes.remaining_ops,
        graph_bytes=(target.directory / manifest.model).stat().st_size, external_initializers=manifest.initializers.external,
        inline_initializers=manifest.initializers.inline, timings={"up_to_date": seconds}, peak_rss_bytes=peak_rss,
        inputs=[source.parent / f.name for f in manifest.input_files], up_to_date=True,
        compiled_ops=manifest.nodes.compiled_ops or {}, target=manifest.target,
    )
