"""Incremental builds: `--if-changed` (is the published output current?) and `--depfile` (Make rules).

What "current" means: the manifest beside the destination records the same input digest (sha256 of the
model file and of every external data file it references), the same options, the same ortcompile /
onnxruntime / EP versions, and every output file it lists still has its recorded size.

The driver (compile/job.py) reads the published manifest and makes the `Expected` record: what a compile here
would record for these options and inputs. `published_if_current` holds one against the other as data, the
cheap comparisons first; the inputs' sha256 last (digest.inputs_changed: remembered for the file as it is
(hashcache.py), else hashed). This module imports neither onnx nor onnxruntime, so an up-to-date check returns in
milliseconds.
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path

from ortcompile.durable import replace_file
from ortcompile.eps.catalog import EpInfo
from ortcompile.eps.discovery import choose_ep
from ortcompile.errors import OutputError
from ortcompile.jsonedge import JsonObject
from ortcompile.naming import OutputTarget
from ortcompile.options import CHECK_MODES, CompileOptions, CompileResult
from ortcompile.output.digest import inputs_changed
from ortcompile.output.manifest import Manifest, Versions
from ortcompile.version import __version__


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


def published_if_current(source: Path, target: OutputTarget, published: Manifest, expected: Expected) -> Freshness:
    """The published output's result when its manifest says what `expected` does, its files are there and its inputs
    are unchanged, else the reason it is not. The result is what the manifest says; the driver adds what the check
    took (its time and peak)."""
    reason = _record_differs(published, expected) or _outputs_changed(target, published)
    if reason:
        return Freshness(None, reason)
    answer = _up_to_date_result(source, target, published)  # (given only once the inputs prove unchanged)
    reason = inputs_changed(source, published.input_files, expected.inputs)  # the one step that may read their bytes
    return Freshness(None if reason else answer, reason)


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


def _up_to_date_result(source: Path, target: OutputTarget, manifest: Manifest) -> CompileResult:
    """The result of a compile that found its output current and did nothing (timings and peak: the driver's)."""
    return CompileResult(
        source=source, output_dir=target.directory, model=manifest.model, ep=manifest.versions.ep_name,
        ep_version=manifest.versions.ep_version, files=[f.to_json() for f in manifest.files],
        epcontext_nodes=manifest.nodes.epcontext, remaining_ops=manifest.nodes.remaining_ops,
        graph_bytes=(target.directory / manifest.model).stat().st_size, external_initializers=manifest.initializers.external,
        inline_initializers=manifest.initializers.inline, timings={}, peak_rss_bytes=0,
        inputs=[source.parent / f.name for f in manifest.input_files], up_to_date=True,
        compiled_ops=manifest.nodes.compiled_ops or {}, target=manifest.target,
    )
