"""The first stage of a split: the source's graph as the parts are cut from it, read and decided once.

Only the graph proto is read (the weights stay in the source's files). The frozen inputs are decided first (freeze.py,
as the prepare step of a whole compile does), then the shapes: the tensors between parts need static ones, so the
inputs must be pinned (or frozen), and the pins go into the graph. The user's --input is checked against the pinned
inputs now, not after every part compiled; last, ONNX shape inference types every tensor, which the parts'
interfaces are made of. What comes out is data: the partition (partition.py) and the parts' files (partfiles.py)
work from it and read the source's graph no more.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from ortcompile.compile.defaults import constants_warning, initializers_as_constants
from ortcompile.compile.freeze import freeze_inputs
from ortcompile.errors import CompilationFailed, OrtCompileWarning
from ortcompile.onnxfacts import graph_inputs, stored_nbytes
from ortcompile.options import GivenInputs
from ortcompile.plan.shapes import Pins, apply_pins, require_static
from ortcompile.plan.source import SourceModel

ValueTypes = dict[str, Any]  # tensor name -> its onnx ValueInfoProto (onnx is imported only when a model is split)


@dataclass(frozen=True)
class PartSource:
    """The source's graph with its frozen inputs decided and its pins in place, typed: what the parts are cut from."""

    source: SourceModel
    model: Any  # onnx ModelProto, graph only: the weights stay in the source's files
    types: ValueTypes  # every tensor's type after shape inference, with the pins in place
    weight_bytes: dict[str, int]  # each initializer's stored bytes (the frozen values' included)


def read_part_source(source: SourceModel, pins: Pins, frozen: dict[str, int | float], given: GivenInputs | None = None) -> PartSource:
    """`source` read and decided for a split: frozen (`frozen`), pinned (`pins`, which must leave no input dynamic),
    `given` (--input, with the frozen values) checked against its inputs, every tensor typed."""
    import onnx

    from ortcompile.readback.feeds import make_feeds, specs_from_model

    model = onnx.load_model(str(source.path), load_external_data=False)
    interface = _interface_only(model)  # the inputs a caller feeds, as the source declares them
    constants = initializers_as_constants(model)  # before the cut: a part's interface must not run through a default
    if constants:
        warnings.warn(constants_warning(source.path.name, constants), OrtCompileWarning, stacklevel=2)
    if frozen:
        freeze_inputs(model, frozen)
    require_static(source, pins, "--partition", frozen=set(frozen))  # the tensors between parts need static shapes
    apply_pins(interface, pins)
    apply_pins(model, pins)
    if given:  # refused now, not after every part compiled (as the check of the stitched model would refuse it)
        make_feeds(specs_from_model(interface), dims=pins.named, given=given)
    sizes = {t.name: stored_nbytes(t) or 0 for t in model.graph.initializer}
    return PartSource(source, model, _value_types(model), sizes)


def _interface_only(model: Any) -> Any:
    """A model of `model`'s fed inputs and outputs only (no nodes, no weights): cheap to copy whatever its size."""
    import onnx

    interface = onnx.ModelProto()
    interface.graph.input.extend(graph_inputs(model.graph))  # frozen inputs are still inputs: the check feeds them too
    interface.graph.output.extend(model.graph.output)
    return interface


def _value_types(model: Any) -> ValueTypes:
    """Every tensor's type after shape inference (with the pins in place): the parts' interfaces need them."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise CompilationFailed(f"cannot partition: ONNX shape inference fails on the model ({exc})") from exc
    graph = inferred.graph
    return {v.name: v for v in (*graph.value_info, *graph.input, *graph.output)}
