"""`ortcompile compile`: MODELS into EPContext models in one output directory, each atomically."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ortcompile.cli.output import current, output_options
from ortcompile.cli.params import criterion_settings, given_inputs
from ortcompile.cli.sections import SectionedCommand
from ortcompile.cli.shaping import check_scheduling, configured, take_shaping
from ortcompile.cli.tableopts import compile_table_options
from ortcompile.errors import UsageError
from ortcompile.jsonedge import JsonObject
from ortcompile.naming import Destination
from ortcompile.native import set_ort_log_level
from ortcompile.optiontable import CriterionSettings, option

if TYPE_CHECKING:
    from ortcompile.options import CompileResult
    from ortcompile.progress import Reporter


_EXAMPLES = """\b
Examples:
  ortcompile compile model.onnx -o build/                        # EP chosen automatically
  ortcompile compile dyn.onnx -o build/ --ep qnn --fix-dim batch=1
  ortcompile compile model.onnx -o build/ --verify               # compare with the source first
  ortcompile compile a.onnx b.onnx -o build/ --if-changed --depfile build/deps.d
  ortcompile compile prefill.onnx decode.onnx -o build/ --share-weights
  ortcompile compile big.onnx -o build/ --ep qnn --partition auto

Every option: docs/cli.md. Exit codes: docs/exit-codes.md."""


@click.command("compile", cls=SectionedCommand, short_help="Compile models into EPContext models, atomically (any size; as parts with --partition).",
               epilog=_EXAMPLES)
@click.argument("models", nargs=-1, required=True, type=click.Path(dir_okay=True, path_type=str))
@compile_table_options
@output_options
def command(models: tuple[str, ...], output_dir: str, jobs: int | None, memory_budget: int | None, force: bool, share_weights: bool,
            if_changed: bool, depfile: str | None, require_full: bool, verify: bool, input_args: tuple[str, ...], inputs_file: str | None,
            precision: str | None, **rest: Any) -> None:
    """Compile MODELS into EPContext models in OUTPUT_DIR (one at a time, atomically)."""
    from ortcompile.config import compile_options

    out = current()
    set_ort_log_level(out.verbose)
    destination = Destination.parse(output_dir, models)  # -o, read once: the drivers receive each model's target, never -o again
    if destination.model_name and (share_weights or len(models) > 1):
        raise UsageError(f"-o {output_dir} names one compiled model; give a directory (-o DIR/) for a batch")
    settings, config = configured(list(models), take_shaping(rest))
    check_scheduling(settings.values(), jobs, memory_budget)
    common = dict(force=force, verify=verify, verify_criterion=_verify_criterion(verify, precision, criterion_settings(rest)),
                  inputs=given_inputs(input_args, inputs_file), if_changed=if_changed, compatibility=out.as_json,
                  require_full=require_full)
    options = {model: compile_options(values, jobs=jobs, memory_budget=memory_budget, **common) for model, values in settings.items()}
    if share_weights and if_changed:
        raise UsageError("--if-changed does not work with --share-weights yet; rebuild the batch with --force")
    from ortcompile.compile.job import compile_models_to

    results = compile_models_to(models, destination, [options[m] for m in models], out.reporter(), share_weights=share_weights)
    if depfile:
        from ortcompile.output.incremental import depfile_rule, write_depfile

        settings_file = [Path(config.shown)] if config.path is not None else []  # a config edit makes make ask again
        write_depfile(Path(depfile), [depfile_rule(r.model_path, [*r.inputs, *settings_file]) for r in results])
    documents = [r.to_json() for r in results]
    _placement_detail(documents, out.reporter())
    out.result({"outputs": documents}, [summary_line(r) for r in results])


def _placement_detail(documents: list[JsonObject], reporter: Reporter) -> None:
    """-v: per model, which EP runs which nodes (the pre-publish check's session) and what the EP refused."""
    from ortcompile.cli.render import compile_placement

    for document in documents:
        for line in compile_placement(document):
            reporter.detail(line)


def _verify_criterion(verify: bool, precision: str | None, settings: CriterionSettings) -> CriterionSettings:
    """The criterion options apply to --verify only: without it they would do nothing, so say so."""
    if not verify and (settings or precision):
        raise UsageError(f"{', '.join(option(k).long_name for k in settings) or '--precision'}: "
                         "only used by --verify (without it the pre-publish check judges by the default criterion); add --verify or drop it")
    return {**settings, **({"precision": precision} if precision else {})}


def summary_line(result: CompileResult) -> str:
    from ortcompile.cli.render import human_size, plural

    if result.up_to_date:
        return f"{result.model_path}: up to date"
    total = sum(f["size"] for f in result.files)
    verified = "; verified against the source" if "verify" in result.timings else ""
    on_cpu = f", {plural(result.cpu_nodes, 'node')} on CPU" if result.cpu_nodes else ""
    fallback = f"; {result.fallback['summary']}" if result.fallback else ""
    return (f"{result.model_path}: {plural(result.epcontext_nodes, 'EPContext node')}, {plural(len(result.files), 'file')}, "
            f"{human_size(total)}, {result.timings.get('compile', 0):.1f}s compile{on_cpu} ({result.ep}){verified}{fallback}")
