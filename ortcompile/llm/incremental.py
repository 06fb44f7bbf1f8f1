"""`ortcompile llm --if-changed`: is the published package what these inputs, settings and versions would give?

The package manifest records the sha256 of every input file (genai_config.json, the decoder and its data, the
carried tokenizer files), the settings that shape the package, and the versions of ortcompile, ONNX Runtime and
the QNN EP. The package is current when all of them match and every listed file is there with its size.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

from ortcompile.jsonedge import JsonObject
from ortcompile.llm.genai import CONFIG, GenaiModel, carried_files
from ortcompile.onnxfacts import external_locations
from ortcompile.output.digest import hash_file

DISTRIBUTIONS = ("ortcompile", "onnxruntime", "onnxruntime-qnn")


def input_files(model: GenaiModel) -> list[Path]:
    import onnx


    data = external_locations(onnx.load_model(str(model.model_file), load_external_data=False))
    return [model.folder / CONFIG, model.model_file, *(model.folder / d for d in data), *carried_files(model)]


def build_record(model: GenaiModel, settings: JsonObject) -> JsonObject:
    """What the package was built from: input digests by file name, settings, versions."""
    return {"inputs": {p.name: hash_file(p).sha256 for p in input_files(model)}, "settings": settings,
            "versions": {name: _version(name) for name in DISTRIBUTIONS}}


def why_not_current(out: Path, manifest_name: str, record: JsonObject) -> str:
    """'' when the package in `out` is current; else the reason to rebuild it."""
    path = out / manifest_name
    if not path.is_file():
        return "no package yet"
    try:
        manifest = json.loads(path.read_text())
    except ValueError:
        return f"{manifest_name} is unreadable"
    built = manifest.get("built_from", {})
    for key, what in (("inputs", "an input file changed"), ("settings", "other settings"), ("versions", "other versions")):
        if built.get(key) != record[key]:
            return what
    for entry in manifest.get("files", []):
        file = out / entry["name"]
        if not file.is_file() or file.stat().st_size != entry["size"]:
            return f"{entry['name']} is missing or changed"
    return ""


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
