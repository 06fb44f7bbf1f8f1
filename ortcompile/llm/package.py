"""`ortcompile llm`: an onnxruntime-genai model folder to a runnable NPU package, in one call.

    from ortcompile.llm import compile_llm, LlmOptions
    package = compile_llm("phi-genai/", "phi-qnn/", LlmOptions(context_length=1024, prefill_length=128))

From the one source: the GQA inputs rewired for genai's static mode (surgery.py), then two static graphs from
the same rewritten proto, prefill (S = prefill length) and decode (S = 1), both with a KV cache of context-length
slots, compiled with the ordinary compile (the prepare step's EP fixes make each one EPContext node), as a
--share-weights batch by default (weights stored once, one shared EP context). The package directory gets the
compiled graphs, a genai_config.json of type decoder-pipeline for them (genai.py), the source folder's tokenizer
files, and `llm.manifest.json` with every file's size and sha256. It is built in a staging directory beside the
destination and renamed into place only when everything succeeded.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile.compile.job import compile_models
from ortcompile.compile.sharing import compile_shared
from ortcompile.errors import OutputError, UsageError, output_error
from ortcompile.jsonedge import JsonObject
from ortcompile.llm.genai import CONFIG, DECODE, PREFILL, GenaiModel, PipelineStage, carried_files, package_config, read_genai_folder
from ortcompile.llm.incremental import build_record, why_not_current
from ortcompile.llm.inputs import check_inputs
from ortcompile.llm.parts import AUTO, part_budget, part_check_inputs, split_stages, weight_bytes
from ortcompile.llm.surgery import rewrite_decoder
from ortcompile.onnxfacts import external_locations
from ortcompile.options import CompileOptions, CompileResult
from ortcompile.output.digest import hash_and_sync
from ortcompile.progress import Reporter, SilentReporter

MANIFEST = "llm.manifest.json"
FORMAT = "ortcompile-llm/1"
STAGE_PREFIX = ".ortcompile-llm-"
SOURCES = ".sources"  # inside the stage: the rewritten graphs the compiles read (never published)
GRAPH_FILES = {PREFILL: "prefill.onnx", DECODE: "decode.onnx"}
EP = "qnn"  # the EP the package's genai_config.json names (genai's provider "qnn")


CheckSettings = dict[str, Any]  # CompileOptions' keyword arguments for a graph's check: `check`, and `inputs` (GivenInputs) when it runs


@dataclass(frozen=True)
class LlmOptions:
    context_length: int = 1024  # KV-cache slots (prompt + generated tokens): a phone/laptop NPU's usual size
    prefill_length: int = 128  # tokens the prefill graph takes at once (genai feeds the prompt in windows of this)
    share_weights: bool = True  # one weight file and one shared EP context for both graphs
    ep_options: dict[str, str] = field(default_factory=dict)
    target: str | None = None
    force: bool = False
    if_changed: bool = False  # leave a current package as it is (and replace a stale one without --force)
    check: str = "run"  # before publishing: run each graph on decoder inputs (inputs.py) and compare with the source
    partition: int | None = AUTO  # bytes of weights per part (parts.py); AUTO: parts only over the EP's limit; None: never

    def __post_init__(self) -> None:
        for name in ("context_length", "prefill_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UsageError(f"{name.replace('_', '-')} must be a positive whole number, not {value!r}")
        if self.partition is not None and (isinstance(self.partition, bool) or not isinstance(self.partition, int) or self.partition < 0):
            raise UsageError(f"partition must be a size in bytes (0: auto) or None, not {self.partition!r}")
        if self.prefill_length > self.context_length:
            raise UsageError(f"--prefill-length {self.prefill_length} is longer than --context-length {self.context_length}")


    def settings(self) -> JsonObject:
        """What shapes the package (the manifest records it; --if-changed compares it)."""
        return {"context_length": self.context_length, "prefill_length": self.prefill_length, "share_weights": self.share_weights,
                "ep": EP, "ep_options": dict(sorted(self.ep_options.items())), "target": self.target, "check": self.check,
                "partition": self.partition}


@dataclass
class LlmPackage:
    output_dir: Path
    files: list[JsonObject]  # as the package manifest and --json list them
    graphs: dict[str, JsonObject]  # (as the manifest holds them) context / iterator (context_N / iterator_N) -> model, pins, epcontext_nodes, remaining_ops
    up_to_date: bool = False

    def to_json(self) -> JsonObject:
        return {"output_dir": str(self.output_dir), "up_to_date": self.up_to_date, "files": self.files, "graphs": self.graphs}


def compile_llm(folder: str | os.PathLike[str], output_dir: str | os.PathLike[str], options: LlmOptions | None = None,
                reporter: Reporter | None = None) -> LlmPackage:
    options, reporter = options or LlmOptions(), reporter or SilentReporter()
    model = read_genai_folder(Path(folder))
    out = Path(output_dir)
    record = build_record(model, options.settings())
    if options.if_changed:
        reason = why_not_current(out, MANIFEST, record)
        if not reason:
            reporter.stage(f"{out} is up to date")
            manifest = json.loads((out / MANIFEST).read_text())
            return LlmPackage(out, manifest["files"], manifest["graphs"], up_to_date=True)
        reporter.detail(f"{out}: rebuilding: {reason}")
    _check_destination(out, options.force or options.if_changed)
    stage = out.absolute().parent / f"{STAGE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        stage.mkdir(parents=True)
        compiled = _compile_graphs(model, stage, options, _InPackage(reporter, stage, out))
        shutil.rmtree(stage / SOURCES)
        _write_package(model, stage, compiled, options)
        manifest = _write_manifest(stage, model, compiled, record)
        _publish(stage, out)
    except OSError as exc:
        raise output_error(exc, f"the package {out}") from exc
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return LlmPackage(out, manifest["files"], manifest["graphs"])


class _InPackage:
    """The compiles write into the stage, which is gone when the user reads their lines: name the package instead."""

    def __init__(self, inner: Reporter, stage: Path, package: Path) -> None:
        self.inner, self.stage_dir, self.package = inner, str(stage), str(package)

    def stage(self, name: str) -> None:
        self.inner.stage(name.replace(self.stage_dir, self.package))

    def detail(self, message: str) -> None:
        self.inner.detail(message.replace(self.stage_dir, self.package))

    def bytes_bar(self, description: str, total: int) -> Callable[[int], None]:
        return self.inner.bytes_bar(description, total)

    def tick(self) -> None:
        self.inner.tick()

    def close(self) -> None:
        self.inner.close()


def _check_destination(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} is a file, not a directory")
    if out.exists() and any(out.iterdir()) and not force:
        raise OutputError(f"{out} exists and is not empty; pass --force to replace it")
    if force and out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise OutputError(f"{out} is not an ortcompile llm package (no {MANIFEST}); --force replaces only those")


def stage_pins(dims: dict[str, str], model: GenaiModel, options: LlmOptions, stage: str) -> dict[str, int]:
    """The symbolic dims of one graph: batch 1, S = prefill length or 1, past = total = context, the head size."""
    values = {"batch": 1, "sequence": options.prefill_length if stage == PREFILL else 1, "past": options.context_length,
              "total": options.context_length, "head": model.head_size}
    return {dims[role]: value for role, value in values.items() if role in dims}


Compiled = dict[str, tuple[CompileResult, dict[str, int]]]  # pipeline stage name -> its compile and its graph's pins


def _compile_graphs(model: GenaiModel, stage: Path, options: LlmOptions, reporter: Reporter) -> Compiled:
    """The prefill and decode graphs compiled into `stage`: whole, or as parts (parts.py) when a context would be over
    the limit; keyed by pipeline stage, in pipeline order."""
    import onnx


    sources = stage / SOURCES
    sources.mkdir()
    graphs = {s: sources / GRAPH_FILES[s] for s in (PREFILL, DECODE)}
    dims = {s: rewrite_decoder(model, graphs[s], options.prefill_length if s == PREFILL else 1) for s in graphs}
    for location in external_locations(onnx.load_model(str(graphs[PREFILL]), load_external_data=False)):
        _link_or_copy(model.folder / location, sources / location)
    pins = {s: stage_pins(dims[s], model, options, s) for s in graphs}
    budget = part_budget(options.partition, weight_bytes(graphs[PREFILL]))
    if budget is None:
        per_model = {str(graphs[s]): _compile_options(options, pins[s], _check_settings(model, graphs[s], options, s)) for s in graphs}
        results = _compile(list(per_model), stage, per_model, options, reporter)
        return {s: (r, pins[s]) for s, r in zip(graphs, results)}
    reporter.stage(f"cutting the prefill and decode graphs into parts of at most {budget} bytes of weights as QNN holds them")
    parts = split_stages(graphs, pins, budget)
    checks = {s: _part_checks(model, graphs[s], parts[s], options, s) for s in graphs}
    compiled: Compiled = {}
    for index, pair in enumerate(zip(parts[PREFILL], parts[DECODE])):
        per_model = {str(p): _compile_options(options, {}, checks[s][index]) for s, p in zip(graphs, pair)}  # pins are in the parts
        prefill, decode = _compile(list(per_model), stage, per_model, options, reporter)
        compiled[f"{PREFILL}_{index}"], compiled[f"{DECODE}_{index}"] = (prefill, pins[PREFILL]), (decode, pins[DECODE])
    return compiled


def _part_checks(model: GenaiModel, graph: Path, parts: list[Path], options: LlmOptions, stage: str) -> list[CheckSettings]:
    """Each part's check: on the graph's decoder inputs and the hidden states the earlier parts make of them (parts.py)."""
    settings = _check_settings(model, graph, options, stage)
    if settings["check"] != "run":
        return [settings for _ in parts]
    return [{"check": "run", "inputs": inputs} for inputs in part_check_inputs(parts, settings["inputs"])]


def _compile_options(options: LlmOptions, pins: dict[str, int], check: CheckSettings) -> CompileOptions:
    return CompileOptions(ep=EP, ep_options=dict(options.ep_options), target=options.target, fix_dims=pins, force=True,
                          share_weights=options.share_weights, offers=(), **check)  # (`llm` takes no --cpu-nodes, --fallback, --inputs, --check)


def _compile(models: list[str], stage: Path, per_model: dict[str, CompileOptions], options: LlmOptions, reporter: Reporter) -> list[CompileResult]:
    if options.share_weights:
        return compile_shared([Path(m) for m in models], stage, lambda m: per_model[str(m)], reporter)
    return compile_models(models, stage, lambda m: per_model[str(m)], reporter)


def _check_settings(model: GenaiModel, graph: Path, options: LlmOptions, stage: str) -> CheckSettings:
    """Run each graph on decoder inputs before publishing (inputs.py). A shared batch whose context this machine
    cannot load (QNN's simulator) is checked as every such batch is: each graph compiled alone and run (twins.py)."""
    if options.check != "run":
        return {"check": options.check}
    import onnx

    ids = next(i for i in onnx.load_model(str(graph), load_external_data=False).graph.input if i.name == model.input_ids)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(ids.type.tensor_type.elem_type)
    vocab = int(model.config["model"]["vocab_size"])
    return {"check": "run", "inputs": check_inputs(model, stage, options.context_length, options.prefill_length, vocab, dtype)}


def _link_or_copy(source: Path, target: Path) -> None:
    """The compiles read the source's weights through a hard link (no copy) when the stage is on the same filesystem."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _write_package(model: GenaiModel, stage: Path, compiled: Compiled, options: LlmOptions) -> None:
    import onnx

    stages = []
    for name, (result, _) in compiled.items():
        graph = onnx.load_model(str(stage / result.model), load_external_data=False).graph
        stages.append(PipelineStage(name, result.model, [i.name for i in graph.input], [o.name for o in graph.output], name.startswith(PREFILL)))
    config = package_config(model, stages, options.context_length, options.prefill_length,
                            {"backend_type": "htp", **{k: v for k, v in options.ep_options.items() if k != "backend_path"}})
    (stage / CONFIG).write_text(json.dumps(config, indent=4) + "\n")
    for path in carried_files(model):
        shutil.copyfile(path, stage / path.name)


def _write_manifest(stage: Path, model: GenaiModel, compiled: Compiled, record: JsonObject) -> JsonObject:
    files = []
    for path in sorted(p for p in stage.iterdir() if p.is_file()):
        written = hash_and_sync(path)
        files.append({"name": path.name, "size": written.size, "sha256": written.sha256})
    manifest = {"format": FORMAT, "source": model.folder.name, **record["settings"], "built_from": record,
                "graphs": {name: {"model": result.model, "pins": pins, "epcontext_nodes": result.epcontext_nodes,
                                  "remaining_ops": result.remaining_ops} for name, (result, pins) in compiled.items()},
                "files": files}
    (stage / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def _publish(stage: Path, out: Path) -> None:
    """Rename the finished package into place; a replaced one is moved aside first and removed last."""
    old = None
    if out.exists():
        old = stage.with_name(stage.name + ".old")
        out.rename(old)
    stage.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
