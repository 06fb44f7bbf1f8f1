"""`ortcompile llm` reads a model folder someone else may have written (a download, a shared drive): its files must
not make the package carry, link or read files outside the folder (docs/security.md).

Measured before the fix: a `tokenizer_extra.json` symlinked to a file outside the folder was copied into the package
(and would ship with it); an external-data location `../secret.txt` was hard-linked into the stage before the
compile refused it, and the error named the stage's copy instead of the user's file. Each case is refused before
any compile (exit 3, one line naming the user's file), and nothing is written.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import assert_one_line_error, run_cli
from onnx import TensorProto, helper, numpy_helper

from ortcompile.llm.genai import carried_files, read_genai_folder

SECRET = b"SECRET-KEY-MATERIAL"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A minimal genai folder (config, a one-node model with its weight in model.onnx.data, a tokenizer), beside
    a secret the folder's files must never reach."""
    (tmp_path / "secret.txt").write_bytes(SECRET)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    weight = numpy_helper.from_array(np.ones([4, 4], np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["input_ids_f", "w"], ["logits"])], "g",
                              [helper.make_tensor_value_info("input_ids_f", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(model_dir / "model.onnx"), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    config = {"model": {"type": "llama", "vocab_size": 4, "pad_token_id": 0,
                        "decoder": {"filename": "model.onnx", "num_hidden_layers": 1, "num_key_value_heads": 1, "head_size": 4,
                                    "inputs": {"input_ids": "input_ids"}}}}
    (model_dir / "genai_config.json").write_text(json.dumps(config))
    (model_dir / "tokenizer.json").write_text("{}")
    return model_dir


def _refused(folder: Path, *needles: str) -> None:
    out = folder.parent / "pkg"
    result = run_cli("llm", folder, "-o", out)
    assert result.returncode == 3, result.stderr
    assert_one_line_error(result.stderr, *needles)
    assert not out.exists()
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".ortcompile")] == []


def test_a_carried_file_symlinked_out_of_the_folder_is_refused(folder: Path) -> None:
    (folder / "tokenizer_extra.json").symlink_to("../secret.txt")
    _refused(folder, "tokenizer_extra.json", "resolves outside", "the package would carry that file")


def test_a_symlink_inside_the_folder_is_carried(folder: Path) -> None:
    (folder / "tokenizer.real.json").write_text("{}")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to("tokenizer.real.json")
    assert [p.name for p in carried_files(read_genai_folder(folder))] == ["tokenizer.json", "tokenizer.real.json"]


@pytest.mark.parametrize("filename", ["../secret.txt", "/etc/hostname", "sub/../../secret.txt"])
def test_a_decoder_file_outside_the_folder_is_refused(folder: Path, filename: str) -> None:
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["decoder"]["filename"] = filename
    (folder / "genai_config.json").write_text(json.dumps(config))
    _refused(folder, "genai_config.json: decoder filename")


def test_an_external_data_location_outside_the_folder_is_refused_naming_the_users_file(folder: Path) -> None:
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../secret.txt"
    onnx.save(model, str(folder / "model.onnx"))
    _refused(folder, f"{folder / 'model.onnx'}:", "'../secret.txt'")
