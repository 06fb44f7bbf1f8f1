"""Initializers a model also lists as graph inputs: the defaults a compiled model takes as the constants they are.

Below IR 4 every initializer is listed as an input and ONNX Runtime treats it as a constant. From IR 4 such an input
is an overridable default (torch.onnx.export(..., keep_initializers_as_inputs=True) makes every weight one), which ORT
neither folds nor lets an EP bake in. Left as they are, ORT's optimizer de-duplicates equal constants and saves
their inputs without the initializer (the output then asks for them: seen on an IR 3 AlexNet whose bias shapes are
equal), QNN refuses the graph ("The count of graph inputs should be at least the count of tensor_wrapper"), and a
split cuts the parts' interfaces through them. ORT's own remedy is the same (its tools'
remove_initializer_from_input.py); a compiled model is a specialization anyway, and the user is told which inputs
it no longer takes.
"""

from __future__ import annotations

from typing import Any


def initializers_as_constants(model: Any) -> list[str]:
    """Take every initializer out of `model`'s graph inputs and make it IR 4 at least (IR 3 wants every initializer
    listed as an input, and ORT's IR 3 writer lists those it folds too); returns the names that were overridable."""
    names = {t.name for t in model.graph.initializer}
    overridable = [i.name for i in model.graph.input if i.name in names] if model.ir_version >= 4 else []
    kept = [i for i in model.graph.input if i.name not in names]
    if len(kept) < len(model.graph.input):
        del model.graph.input[:]
        model.graph.input.extend(kept)
    model.ir_version = max(model.ir_version, 4)
    return overridable


def constants_warning(model_name: str, constants: list[str]) -> str:
    """What the user is told when the compiled model stopped taking inputs the source had defaults for."""
    if len(constants) == 1:
        return (f"{model_name}: {constants[0]} is an initializer also listed as a graph input (an overridable default); "
                "compiled as a constant: the compiled model does not take it as an input")
    shown = ", ".join(constants[:3]) + (f" and {len(constants) - 3} more" if len(constants) > 3 else "")
    return (f"{model_name}: {len(constants)} initializers are also listed as graph inputs (overridable defaults: {shown}); "
            "compiled as constants: the compiled model does not take them as inputs")
