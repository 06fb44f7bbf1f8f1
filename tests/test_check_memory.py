"""The pre-publish check must not need more memory than the model: a load-only check maps the weights, copies none.

Measured (issue 22's 16 GB moonshot): `--ep cpu` of a 16 GB fp16 decoder with the default check (load-only above
1 GiB of weights) grew past 19.8 GiB before it was stopped: ONNX Runtime's CPU EP, at its default optimization level,
folds the Casts it puts around fp16 MatMuls into an fp32 copy of every weight (2x the weights, in RAM). A session
that only proves the output loads needs none of that.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from helpers import run_process
from onnx import TensorProto, helper, numpy_helper

WIDTH = 2048
LAYERS = 8  # 8 x 2048 x 2048 fp16: 64 MiB of weights


def fp16_chain(path: Path) -> int:
    """MatMuls over fp16 weights in an external data file; returns the weights' bytes."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) * 0.02).astype(np.float16), f"w{i}") for i in range(LAYERS)]
    nodes = [helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"h{i + 1}"], name=f"mm{i}") for i in range(LAYERS)]
    graph = helper.make_graph(nodes, "fp16_chain", [helper.make_tensor_value_info("h0", TensorProto.FLOAT16, [1, WIDTH])],
                              [helper.make_tensor_value_info(f"h{LAYERS}", TensorProto.FLOAT16, [1, WIDTH])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data", size_threshold=0)
    return LAYERS * WIDTH * WIDTH * 2


def test_load_check_of_fp16_weights_on_the_cpu_ep_copies_no_weight(tmp_path: Path) -> None:
    """--check load (what --check auto does above 1 GiB of weights) of an fp16 pass-through: the worker's peak while
    checking stays within the data pass's plus a fraction of the weights (an fp32 copy would add twice them)."""
    weight_bytes = fp16_chain(tmp_path / "chain.onnx")
    # A process of its own: its peaks are the compile's alone (in this process they would be pytest's and every test's)
    proc = run_process("compile", tmp_path / "chain.onnx", "-o", tmp_path / "out", "--ep", "cpu", "--check", "load", "--json")
    assert proc.returncode == 0, proc.stderr
    (output,) = json.loads(proc.stdout)["outputs"]
    assert output["check"]["mode"] == "load" and output["check"]["ok"] is True
    peaks = output["peak_rss_by_stage"]
    assert peaks["check"] < peaks["compile"] + weight_bytes // 2, (peaks, weight_bytes)
