"""ortcompile: compile ONNX models of any size into ONNX Runtime EPContext models, in two passes.

The package imports nothing heavy at import time; onnx and onnxruntime load when a command needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from ortcompile.buffers import CompiledArtifact, compile_to_buffers, open_session
    from ortcompile.compiler import compile_model
    from ortcompile.options import CompileOptions, CompileResult
    from ortcompile.plan import LayoutPolicy

_LAZY = {
    "CompileOptions": "ortcompile.options",
    "CompileResult": "ortcompile.options",
    "compile_model": "ortcompile.compiler",
    "LayoutPolicy": "ortcompile.plan",
    "CompiledArtifact": "ortcompile.buffers",
    "compile_to_buffers": "ortcompile.buffers",
    "open_session": "ortcompile.buffers",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ortcompile' has no attribute {name!r}")


__all__ = [
    "CompileOptions",
    "CompileResult",
    "CompiledArtifact",
    "LayoutPolicy",
    "__version__",
    "compile_model",
    "compile_to_buffers",
    "open_session",
]
