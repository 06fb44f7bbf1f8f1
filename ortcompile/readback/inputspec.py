"""One model input as the feeds and the given inputs see it: its name, element type and dims."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx


@dataclass(frozen=True)
class InputSpec:
    """One model input: name, element type (ONNX TensorProto.DataType; 0 when not a tensor), dims."""

    name: str
    elem_type: int
    dims: tuple[int | str | None, ...]  # int: fixed; str: symbolic name; None: unknown
    type_text: str = ""  # as ORT prints it, for messages: "tensor(float)", "seq(tensor(float))"

    @property
    def dtype(self) -> np.dtype | None:
        """The numpy dtype to feed (object for strings), or None when numpy cannot hold this type."""
        if self.elem_type == onnx.TensorProto.STRING:
            return np.dtype(object)
        if self.elem_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.BFLOAT16) or self.elem_type >= onnx.TensorProto.FLOAT8E4M3FN:
            return None
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(self.elem_type))

    def dim_key(self, axis: int) -> str | None:
        """The name a non-fixed dim is set by: its symbol, or `NAME[AXIS]` when unnamed; None when fixed."""
        dim = self.dims[axis]
        if isinstance(dim, int):
            return None
        return dim if dim and dim != "?" else f"{self.name}[{axis}]"  # "?" is how some exporters write "unknown"

    def describe(self) -> str:
        shown = ",".join("?" if d is None else str(d) for d in self.dims)
        return f"{self.type_text or 'tensor(' + onnx.TensorProto.DataType.Name(self.elem_type).lower() + ')'}[{shown}]"
