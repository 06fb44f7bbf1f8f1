"""Greedy generation with onnxruntime-genai, in a process of its own (tests/test_llm.py).

Why a process: genai loads its own ONNX Runtime environment and registers QNN there; a crash of the HTP simulator
then ends this child, not pytest. Prints one JSON document: the tokens, and the logits of each decode step.

    python genai_run.py FOLDER N TOKEN... [--qnn]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime_genai as og


def main(argv: list[str]) -> None:
    qnn = "--qnn" in argv
    folder, count, *prompt = [a for a in argv if a != "--qnn"]
    if qnn:
        import onnxruntime_qnn

        og.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    config = json.loads(Path(folder, "genai_config.json").read_text())
    vocab = int(config["model"]["vocab_size"])
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=int(config["search"]["max_length"]))
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([int(t) for t in prompt], dtype=np.int32))
    tokens: list[int] = []
    logits: list[list[float]] = []
    while not generator.is_done() and len(tokens) < int(count):
        generator.generate_next_token()
        row = np.asarray(generator.get_output("logits"), np.float32).reshape(-1)
        if tokens and row.size == vocab:  # a decode step: one token in, one row of logits out
            logits.append(row.tolist())
        tokens.append(int(generator.get_next_tokens()[0]))
    print(json.dumps({"tokens": tokens, "logits": logits}))


if __name__ == "__main__":
    main(sys.argv[1:])
