"""A tiny Llama-shaped decoder built the way users build them: random weights from `transformers`, a tokenizer trained
here (`tokenizers`), then onnxruntime-genai's model builder (fp32, CPU). Built once into a cache directory: the
builder takes ~10 s; nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

CACHE = Path.home() / ".cache" / "ortcompile-tests" / "llm"
LLAMA = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
TEXT = ["the quick brown fox jumps over the lazy dog " * 3, "hello world, this is a tiny tokenizer for tests " * 3,
        "onnx runtime compiles models for npus and cpus " * 3]


def _key() -> str:
    import onnxruntime_genai
    import transformers

    recipe = f"{sorted(LLAMA.items())}|{TEXT}|{transformers.__version__}|{onnxruntime_genai.__version__}"
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


# The builder's form for EPs without fused rotary (DML): RotaryEmbedding nodes fed by a position_ids input before an
# unpacked GroupQueryAttention. The builder makes it for -e dml in fp16 only; these two switches make it in fp32 on the CPU.
SEPARATE_ROTARY = ("import runpy, sys; import onnxruntime_genai.models; from builders.base import Model; "
                   "Model.is_fused_rope_supported = lambda self: False; Model.is_packed_matmul_supported = lambda self: False; "
                   "sys.argv[0] = 'builder'; runpy.run_module('onnxruntime_genai.models.builder', run_name='__main__')")


def genai_builder_model(precision: str = "fp32", rotary: str = "fused") -> Path:
    """The builder's output folder (genai_config.json, model.onnx + .data, tokenizer files), built once per recipe.
    `precision`: fp32, or int4 (MatMulNBits weights). `rotary`: fused (inside GroupQueryAttention, the builder's CPU
    default) or separate (RotaryEmbedding nodes and a position_ids input, SEPARATE_ROTARY)."""
    folder = CACHE / f"llama-2l-64-{precision}{'' if rotary == 'fused' else '-' + rotary}-{_key()}"
    if (folder / "genai" / "genai_config.json").is_file():
        return folder / "genai"
    scratch = folder.with_name(f"{folder.name}.building-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    _hf_folder(scratch / "hf")
    builder = ["-m", "onnxruntime_genai.models.builder"] if rotary == "fused" else ["-c", SEPARATE_ROTARY]
    subprocess.run([sys.executable, *builder, "-i", str(scratch / "hf"), "-o", str(scratch / "genai"),
                    "-p", precision, "-e", "cpu", "-c", str(scratch / "cache")], check=True, capture_output=True, timeout=600)
    try:
        scratch.rename(folder)
    except OSError:  # another session built it meanwhile
        shutil.rmtree(scratch, ignore_errors=True)
    return folder / "genai"


def _hf_folder(target: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**LLAMA)).save_pretrained(target)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=LLAMA["vocab_size"], special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(TEXT, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>").save_pretrained(target)
