"""`ortcompile llm`: an onnxruntime-genai model folder to a prefill/decode package for the NPU (ortcompile/llm)."""

from __future__ import annotations

import click

from ortcompile.cli.output import current, output_options
from ortcompile.cli.params import PartitionSize, pairs
from ortcompile.cli.tableopts import table_option
from ortcompile.jsonedge import JsonObject


@click.command("llm", short_help="Compile an onnxruntime-genai decoder folder into a prefill/decode package genai runs on the NPU.")
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=str))
@click.option("-o", "--output", "output_dir", required=True, type=click.Path(path_type=str), help="The package directory to write.")
@click.option("--context-length", type=click.IntRange(min=1), default=1024, show_default=True,
              help="KV-cache slots: prompt plus generated tokens.")
@click.option("--prefill-length", type=click.IntRange(min=1), default=128, show_default=True,
              help="Tokens the prefill graph takes at once (genai feeds the prompt in windows of this size).")
@click.option("--share-weights/--no-share-weights", default=True, show_default=True,
              help="Store the weights once and share one EP context between the two graphs.")
@click.option("--partition", type=PartitionSize(), default="auto", show_default=True,
              help="Cut both graphs into pipeline stages of at most SIZE of weights (auto: only when one context would exceed the EP's limit).")
@table_option("ep_options", help="Provider option for the compile (repeatable).", example="soc_model=60")
@table_option("target", help="Device generation to compile for (see 'ortcompile eps --targets').")
@click.option("--force", is_flag=True, help="Replace an earlier package in the output directory.")
@click.option("--if-changed", is_flag=True, help="Do nothing if the package is current (same inputs, settings, versions); else rebuild it.")
@output_options
def command(folder: str, output_dir: str, context_length: int, prefill_length: int, share_weights: bool, partition: int,
            ep_options: tuple[str, ...], target: str | None, force: bool, if_changed: bool) -> None:
    """Compile the decoder of FOLDER (genai_config.json + model.onnx) into a package in OUTPUT_DIR."""
    from ortcompile.llm import LlmOptions, compile_llm
    from ortcompile.native import set_ort_log_level

    out = current()
    set_ort_log_level(out.verbose)
    options = LlmOptions(context_length=context_length, prefill_length=prefill_length, share_weights=share_weights,
                         partition=partition, ep_options=pairs(ep_options), target=target, force=force,
                         if_changed=if_changed)
    package = compile_llm(folder, output_dir, options, out.reporter())
    out.result(package.to_json(), _summary(package.to_json()))


def _summary(document: JsonObject) -> list[str]:
    if document["up_to_date"]:
        return [f"{document['output_dir']}: up to date"]
    size = sum(f["size"] for f in document["files"])
    graphs = ", ".join(f"{stage} {g['model']} ({g['epcontext_nodes']} EPContext, {sum(g['remaining_ops'].values())} CPU nodes)"
                       for stage, g in document["graphs"].items())
    return [f"{document['output_dir']}: genai decoder-pipeline package, {len(document['files'])} files, {size / 2**20:.1f} MiB: {graphs}"]
