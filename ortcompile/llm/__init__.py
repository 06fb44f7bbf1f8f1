"""LLMs to the NPU: an onnxruntime-genai model folder to a prefill/decode package genai runs (package.py)."""

from ortcompile.llm.package import LlmOptions, LlmPackage, compile_llm

__all__ = ["LlmOptions", "LlmPackage", "compile_llm"]
