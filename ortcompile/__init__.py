"""ortcompile: compile ONNX models of any size into ONNX Runtime EPContext models, in two passes.

The package imports nothing heavy at import time; onnx and onnxruntime load when a command needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ortcompile.version import __version__

if TYPE_CHECKING:
    from ortcompile.compile.buffers import CompiledArtifact, compile_to_buffers, open_session
    from ortcompile.compile.job import compile_model
    from ortcompile.layout import LayoutPolicy
    from ortcompile.options import CompileOptions, CompileResult
    from ortcompile.run.load import load_session

_LAZY = {
    "CompileOptions": "ortcompile.options",
    "CompileResult": "ortcompile.options",
    "compile_model": "ortcompile.compile.job",
    "LayoutPolicy": "ortcompile.layout",
    "CompiledArtifact": "ortcompile.compile.buffers",
    "compile_to_buffers": "ortcompile.compile.buffers",
    "open_session": "ortcompile.compile.buffers",
    "load_session": "ortcompile.run.load",
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
    "load_session",
    "open_session",
]
