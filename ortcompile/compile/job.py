"""The compile's entry points: compile_model() / compile_models() (sharing.compile_shared too comes through here),
and the --if-changed fast path.

Usable from Python without click:

    from ortcompile import compile_model, CompileOptions
    result = compile_model("model.onnx", "build/", CompileOptions(ep="qnn", fix_dims={"batch": 1}))

An up-to-date output (`--if-changed`) is answered here from its manifest and a stat cache, before anything of
the compile pipeline is imported; every other compile enters the pipeline through one call, driver.compile_now
(each model planned, then pass 1 (EP step) -> pass 2 (graph) -> finish, alone or as a weight-sharing batch).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ortcompile.errors import OrtCompileError, UsageError
from ortcompile.naming import Destination, OutputTarget
from ortcompile.native import peak_rss_bytes
from ortcompile.options import CompileOptions, CompileResult, effective_check
from ortcompile.output.incremental import Expected, published_if_current
from ortcompile.output.manifest import Manifest, ManifestError
from ortcompile.progress import Reporter, SilentReporter


def compile_model(
    source_path: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    options: CompileOptions | None = None,
    reporter: Reporter | None = None,
) -> CompileResult:
    """Compile one model into `output_dir` atomically; raise an OrtCompileError subclass on failure."""
    options = options or CompileOptions()
    target = Destination.of(output_dir, [source_path], options.output_name).targets[0]
    return _compile([Path(source_path)], [target], [options], reporter)[0]


def _compile(sources: Sequence[Path], targets: Sequence[OutputTarget], options: Sequence[CompileOptions], reporter: Reporter | None,
             shared: bool = False, more_follow: bool = False) -> list[CompileResult]:
    """One unit compiled (a model; with `shared`, a --share-weights batch as one) through the compile driver, the one
    way into the pipeline; `more_follow`: a batch has models left, so the worker's retirement starts a warm spare."""
    reporter = reporter or SilentReporter()
    if not shared and options[0].if_changed:  # (a shared batch is compiled whole: the CLI refuses --if-changed with it)
        current = _current_output(sources[0], targets[0], options[0], reporter)
        if current is not None:
            return [current]
        options = [dataclasses.replace(options[0], force=True)]  # --if-changed may replace its own stale output
    from ortcompile.compile.driver import compile_now  # see LAZY_IMPORTS (--if-changed)

    return compile_now(sources, targets, options, reporter, compile_model, shared, more_follow)


def compile_models(models: list[str | os.PathLike[str]], output_dir: str | os.PathLike[str],
                   options: CompileOptions | Callable[[str | os.PathLike[str]], CompileOptions] | None = None,
                   reporter: Reporter | None = None) -> list[CompileResult]:
    """Compile each model into `output_dir`, one after another; stop at the first failure, naming the model.

    `options` is one CompileOptions for every model, or a function giving each model its own (a config file's
    per-model settings, see ortcompile/config.py). Each compile is self-contained: an EP that compiles runs in
    its own worker child, so a batch gives the bytes of single runs and peaks at its largest model, not at the sum.
    """
    options_for = options if callable(options) else (lambda model: options)
    per_model = [options_for(m) or CompileOptions() for m in models]
    named = next((o.output_name for o in per_model if o.output_name), None)
    return compile_models_to(models, Destination.of(output_dir, models, named), per_model, reporter)


def compile_models_to(models: Sequence[str | os.PathLike[str]], destination: Destination, per_model: Sequence[CompileOptions],
                      reporter: Reporter | None = None, share_weights: bool = False) -> list[CompileResult]:
    """compile_models, or with `share_weights` sharing.compile_shared, with `-o` already read for these models
    (`destination`, the CLI's) and each model's options. Compiled a unit at a time: each model on its own, or the
    weight-sharing batch as one (planned, built and published together: sharing.py)."""
    if not share_weights:
        _refuse_clashes(models, destination)
    units = [slice(0, len(models))] if share_weights else [slice(index, index + 1) for index in range(len(models))]
    results: list[CompileResult] = []
    for number, unit in enumerate(units):
        given = models[unit]
        try:
            results += _compile([Path(m) for m in given], destination.targets[unit], per_model[unit], reporter, share_weights,
                                more_follow=number < len(units) - 1)
        except OrtCompileError as exc:
            if len(given) == 1 < len(models) and str(given[0]) not in exc.message:
                exc.message = f"{given[0]}: {exc.message}"  # in a batch, say which model failed (a shared one fails as one)
            raise
        except KeyboardInterrupt as exc:  # (Interrupted too) the models before this one stay published: say which
            exc.published = [r.model_path for r in results]  # type: ignore[attr-defined]
            raise
    return results


def _refuse_clashes(models: Sequence[str | os.PathLike[str]], destination: Destination) -> None:
    """Models compiled one by one into one directory: one model name each (a shared batch says so once it is planned)."""
    if destination.model_name and len(models) > 1:
        raise UsageError(f"-o {destination.model_name} names one compiled model; give a directory (-o DIR/) for {len(models)} models")
    names = [t.names.model for t in destination.targets]
    clash = next((n for n in names if names.count(n) > 1), None)
    if clash is not None:
        raise UsageError(f"two models would both be compiled to {clash} in one directory; rename one or use two -o")


def _current_output(source: Path, target: OutputTarget, options: CompileOptions, reporter: Reporter) -> CompileResult | None:
    """The published result when it is up to date, told without loading onnx or onnxruntime: the manifest published
    at the target, held against what a compile here would record for these options and its inputs."""
    started = time.perf_counter()
    try:
        published = Manifest.load(target.manifest_path)
    except ManifestError:
        reporter.detail(f"{source.name}: rebuilding: no readable manifest")
        return None
    inputs = published.inputs_beside(source)
    check_run = effective_check(options.check, published.input_bytes)  # as the planner decides it, for these inputs
    expected = Expected.of(options, check_run, inputs)
    fresh = published_if_current(source, target, published, expected)
    if fresh.result is None:
        reporter.detail(f"{source.name}: rebuilding: {fresh.reason}")
        return None
    reporter.detail(f"{fresh.result.model_path} is up to date")  # (the summary line says so too)
    return dataclasses.replace(fresh.result, timings={"up_to_date": time.perf_counter() - started}, peak_rss_bytes=peak_rss_bytes())
