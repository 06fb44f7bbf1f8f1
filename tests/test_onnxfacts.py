"""ortcompile.onnxfacts on real protos: sizes against numpy and onnx's own packing, external fields as ORT
reads them, subgraphs of a real If/Loop model that onnxruntime runs, EPContext nodes of a real QNN compile."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import FIXTURES, REPO, published, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import ExternalDataInfo

from ortcompile import onnxfacts as facts
from ortcompile.onnxfacts import ExternalRef, MalformedTensor
from ortcompile.paths import resolve_inside

SIZED = [(name, number) for name, number in TensorProto.DataType.items() if name not in ("STRING", "UNDEFINED")]
# Packed sub-byte types and their bits per element, as the ONNX IR spec defines them (checked against onnx below).
PACKED = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2, "FLOAT6E2M3": 6, "FLOAT6E3M2": 6}
SHAPES = [(), (0,), (1,), (3,), (2, 3), (5, 7), (4, 0, 9), (3, 3, 3)]


# ---------------------------------------------------------------- sizes of every data type

def test_every_data_type_this_onnx_defines_has_a_size() -> None:
    """A type a newer onnx adds must be listed in onnxfacts, or its tensors would go unchecked."""
    assert [name for name, number in SIZED if facts.element_bits(number) is None] == []
    assert sorted((name, number) for name, number, _ in facts.DATA_TYPES) == sorted(SIZED)


def test_enum_numbers_are_onnxs() -> None:
    """onnxfacts spells these numbers out so that importing it costs no `import onnx`."""
    assert facts.EXTERNAL == TensorProto.EXTERNAL
    assert (facts.ATTR_INT, facts.ATTR_STRING, facts.ATTR_TENSOR, facts.ATTR_GRAPH) == (
        onnx.AttributeProto.INT, onnx.AttributeProto.STRING, onnx.AttributeProto.TENSOR, onnx.AttributeProto.GRAPH)
    assert (facts.ATTR_TENSORS, facts.ATTR_GRAPHS, facts.ATTR_SPARSE_TENSOR, facts.ATTR_SPARSE_TENSORS) == (
        onnx.AttributeProto.TENSORS, onnx.AttributeProto.GRAPHS, onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.SPARSE_TENSORS)


def test_importing_onnxfacts_loads_no_onnx() -> None:
    """graphpass, datapass and publish sit on the CLI's light paths (--help, --if-changed): they may import
    onnxfacts at top level only because it does not import onnx (~200 ms) itself."""
    code = ("import sys, ortcompile.onnxfacts as f; f.tensor_nbytes(22, (3,)); f.element_count((2, 3)); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('onnx', 'onnxruntime', 'numpy')))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name, number", SIZED, ids=[n for n, _ in SIZED])
def test_size_matches_numpy_and_onnx_round_trip(name: str, number: int) -> None:
    np_dtype = helper.tensor_dtype_to_np_dtype(number)
    for shape in SHAPES:
        count = int(np.prod(shape))
        size = facts.tensor_nbytes(number, shape)
        if name in PACKED:  # numpy holds one element per byte; ONNX packs them
            assert size == -(-count * PACKED[name] // 8), (shape, size)
        else:
            assert size == np.zeros(shape, np_dtype).nbytes, shape
        tensor = numpy_helper.from_array(np.zeros(shape, np_dtype), "t")
        assert tensor.data_type == number
        assert len(tensor.raw_data) == size, shape  # what onnx writes as raw (and external) data
        assert numpy_helper.to_array(tensor).shape == shape
        assert facts.inline_nbytes(tensor) == facts.stored_nbytes(tensor) == size


@pytest.mark.parametrize("name, number", SIZED, ids=[n for n, _ in SIZED])
def test_size_is_exactly_what_make_tensor_accepts_as_raw_data(name: str, number: int) -> None:
    """onnx.helper.make_tensor checks raw bytes against its own rule: one byte more or less is refused."""
    for shape in [(1,), (3,), (5, 7), (2, 3, 5)]:
        size = facts.tensor_nbytes(number, shape)
        assert size is not None
        helper.make_tensor("t", number, shape, b"\0" * size, raw=True)
        for wrong in (size - 1, size + 1):
            with pytest.raises(ValueError, match="Raw data size"):
                helper.make_tensor("t", number, shape, b"\0" * wrong, raw=True)


@pytest.mark.parametrize("name, bits", sorted(PACKED.items()))
def test_packed_types(name: str, bits: int) -> None:
    number = TensorProto.DataType.Value(name)
    assert facts.element_bits(number) == bits and facts.element_size(number) == 1
    assert [facts.tensor_nbytes(number, (n,)) for n in range(9)] == [-(-n * bits // 8) for n in range(9)]
    huge = (2**40 + 1, 3)  # exact integer arithmetic far past float precision
    assert facts.tensor_nbytes(number, huge) == -(-(2**40 + 1) * 3 * bits // 8)


@pytest.mark.parametrize("name, size", [("FLOAT", 4), ("BFLOAT16", 2), ("FLOAT16", 2), ("DOUBLE", 8), ("COMPLEX64", 8),
                                        ("COMPLEX128", 16), ("BOOL", 1), ("INT64", 8), ("FLOAT8E4M3FN", 1), ("FLOAT8E4M3FNUZ", 1),
                                        ("FLOAT8E5M2", 1), ("FLOAT8E5M2FNUZ", 1), ("FLOAT8E8M0", 1)])
def test_element_size(name: str, size: int) -> None:
    number = TensorProto.DataType.Value(name)
    assert facts.element_size(number) == size == helper.tensor_dtype_to_np_dtype(number).itemsize


@pytest.mark.parametrize("number", [TensorProto.STRING, TensorProto.UNDEFINED, 99, -1, 2**31 - 1])
def test_types_without_a_size(number: int) -> None:
    assert facts.tensor_nbytes(number, (2, 3)) is None
    assert facts.element_bits(number) is None and facts.element_size(number) is None


def test_dtype_name() -> None:
    assert facts.dtype_name(TensorProto.INT4) == "INT4" and facts.dtype_name(1) == "FLOAT"
    assert facts.dtype_name(99) is None


def test_negative_dimension() -> None:
    with pytest.raises(ValueError, match=r"negative dimension in shape \[2, -1\]"):
        facts.tensor_nbytes(TensorProto.FLOAT, (2, -1))
    tensor = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[-64, 4])
    with pytest.raises(MalformedTensor, match=r"'W' has a negative dimension in its shape \[-64, 4\]"):
        facts.stored_nbytes(tensor)


def test_element_count() -> None:
    assert [facts.element_count(s) for s in [(), (0,), (3,), (2, 3, 4)]] == [1, 0, 3, 24]


def test_inline_sizes_from_typed_fields_and_strings() -> None:
    """Without raw_data, a tensor stands for dtype x shape bytes (what ORT makes of it), strings for their bytes."""
    floats = helper.make_tensor("f", TensorProto.FLOAT, (2, 3), [1.0] * 6)
    int4 = helper.make_tensor("i", TensorProto.INT4, (5,), [1, -2, 3, -4, 5])
    text = helper.make_tensor("s", TensorProto.STRING, (3,), [b"ab", b"", b"cde"])
    assert not floats.raw_data and not int4.raw_data
    assert [facts.inline_nbytes(t) for t in (floats, int4, text)] == [24, 3, 5]
    assert [facts.stored_nbytes(t) for t in (floats, int4, text)] == [24, 3, 5]


# ---------------------------------------------------------------- external data

def external(name: str = "W", data_type: int = TensorProto.FLOAT, dims: tuple[int, ...] = (4, 4),
             fields: list[tuple[Any, Any]] | None = None) -> TensorProto:
    tensor = TensorProto(name=name, data_type=data_type, dims=dims, data_location=TensorProto.EXTERNAL)
    for key, value in fields if fields is not None else [("location", "w.data"), ("offset", "4096"), ("length", "64")]:
        tensor.external_data.add(key=key, value=value)
    return tensor


def not_utf8(tensor: TensorProto, text: str, raw: bytes) -> TensorProto:
    """The same tensor with `text` replaced by bytes that are not UTF-8 (protobuf proto2 strings hold anything)."""
    assert len(raw) == len(text.encode())  # same length: the length prefixes stay right
    parsed = TensorProto()
    parsed.ParseFromString(tensor.SerializeToString().replace(text.encode(), raw))
    return parsed


def test_reference_from_a_model_onnx_saved(tmp_path: Path) -> None:
    """onnx.save's references read back as onnx reads them, and name exactly the tensors' bytes."""
    rng = np.random.default_rng(0)
    arrays = {"a": rng.standard_normal((64, 32)).astype(np.float32), "b": rng.integers(-8, 8, (999,)).astype(np.int8),
              "c": rng.standard_normal((17,)).astype(np.float16)}
    graph = helper.make_graph([helper.make_node("Identity", ["a"], ["y"])], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(a, n) for n, a in arrays.items()])
    onnx.save(helper.make_model(graph), str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    model = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    data = (tmp_path / "m.data").read_bytes()
    for tensor in model.graph.initializer:
        ref = facts.external_ref(tensor)
        info = ExternalDataInfo(tensor)
        assert ref == ExternalRef(info.location, info.offset, info.length)
        assert facts.stored_nbytes(tensor) == ref.length == arrays[tensor.name].nbytes
        assert data[ref.offset : ref.offset + ref.length] == arrays[tensor.name].tobytes()
    assert facts.external_locations(model) == ["m.data"]


def test_length_is_optional_and_means_the_tensors_own_size() -> None:
    tensor = external(fields=[("location", "w.data"), ("offset", "128")])
    assert facts.external_ref(tensor) == ExternalRef("w.data", 128, None)
    assert facts.stored_nbytes(tensor) == 64
    assert facts.external_ref(tensor).length_or(64) == 64 and ExternalRef("x", 0, 8).length_or(64) == 8
    strings = external(data_type=TensorProto.STRING, fields=[("location", "w.data")])
    assert facts.stored_nbytes(strings) is None  # no fixed size and none written


def test_length_disagreeing_with_the_shape() -> None:
    tensor = external(fields=[("location", "w.data"), ("length", "60")])
    with pytest.raises(MalformedTensor, match=r"'W' has external length 60 but its shape \[4, 4\] of FLOAT needs 64 bytes"):
        facts.stored_nbytes(tensor)
    assert facts.external_ref(tensor).length == 60  # the reference itself reads as written


def test_offset_defaults_to_zero_and_empty_values_are_not_written() -> None:
    """ORT skips an empty value, so an empty offset is 0, an empty length is "not written", and an empty
    later entry does not undo an earlier one."""
    tensor = external(fields=[("location", "w.data"), ("offset", ""), ("length", "64"), ("length", ""), ("location", "")])
    assert facts.external_ref(tensor) == ExternalRef("w.data", 0, 64)


def test_the_last_written_value_wins() -> None:
    tensor = external(fields=[("location", "a.data"), ("offset", "1"), ("location", "b.data"), ("offset", "2")])
    assert facts.external_ref(tensor) == ExternalRef("b.data", 2, None)


def test_checksum_and_keys_ort_refuses_are_kept_without_a_warning() -> None:
    tensor = external(fields=[("location", "w.data"), ("checksum", "abc"), ("basepath", "/x"), ("colour", "red"),
                              ("prepacked_w", "k|0;4;x")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # onnx's ExternalDataInfo warns about unknown keys: we must not pass them on
        ref = facts.external_ref(tensor)
    assert ref == ExternalRef("w.data", 0, None, "abc", ("basepath", "colour"))


@pytest.mark.parametrize("value, number", [("0", 0), ("-0", 0), ("+7", 7), (" 42", 42), ("\t8", 8), ("007", 7),
                                           ("0" * 5000 + "12", 12), (str(2**63 - 1), 2**63 - 1)])
def test_numbers_ort_reads(value: str, number: int) -> None:
    tensor = external(fields=[("location", "w.data"), ("offset", value), ("length", value)])
    assert facts.external_ref(tensor) == ExternalRef("w.data", number, number)


@pytest.mark.parametrize("fields, problem", [
    ([("location", "w.data"), ("offset", "0x10")], "has a non-numeric external offset '0x10'"),
    ([("location", "w.data"), ("length", "16K")], "has a non-numeric external length '16K'"),
    ([("location", "w.data"), ("offset", "1e3")], "non-numeric external offset"),
    ([("location", "w.data"), ("offset", "1_000")], "non-numeric external offset"),  # int() would take it, ORT not
    ([("location", "w.data"), ("offset", "5 ")], "non-numeric external offset"),  # strtoll stops at the space
    ([("location", "w.data"), ("offset", "٣")], "non-numeric external offset"),  # int() reads Arabic-Indic digits
    ([("location", "w.data"), ("offset", "inf")], "non-numeric external offset"),
    ([("location", "w.data"), ("offset", "-4096")], "has a negative external offset -4096"),
    ([("location", "w.data"), ("length", "-5")], "has a negative external length -5"),
    ([("location", "w.data"), ("offset", str(2**63))], f"has an external offset {2**63} beyond the int64 range"),
    ([("location", "w.data"), ("length", "9" * 5000)], "has an external length of 5000 digits, beyond the int64 range"),
    ([("offset", "0")], "is external but has no location"),
    ([("location", "")], "is external but has no location"),
    ([], "is external but has no location"),
])
def test_malformed_fields(fields: list[tuple[str, str]], problem: str) -> None:
    tensor = external(fields=fields)
    with pytest.raises(MalformedTensor) as caught:
        facts.external_ref(tensor)
    assert problem in caught.value.problem and caught.value.tensor == "W"
    assert str(caught.value).startswith("tensor 'W' ") and isinstance(caught.value, ValueError)
    ref, problems = facts.lenient_external_ref(tensor)
    assert ref is not None and problem in problems[0]
    with pytest.raises(MalformedTensor):
        facts.stored_nbytes(tensor)


@pytest.mark.parametrize("text, raw", [("w.data", b"w\xdfdata"), ("location", b"locat\xffon"), ("4096", b"40\xc06")])
def test_fields_that_are_not_utf8(text: str, raw: bytes) -> None:
    tensor = not_utf8(external(), text, raw)
    assert any(isinstance(v, bytes) for e in tensor.external_data for v in (e.key, e.value))
    with pytest.raises(MalformedTensor, match="'W' has external data fields that are not valid UTF-8"):
        facts.external_ref(tensor)


def test_lenient_reference_keeps_what_it_can_and_lists_every_problem() -> None:
    tensor = external(fields=[("location", "w.data"), ("offset", "0x10"), ("length", "-5")])
    ref, problems = facts.lenient_external_ref(tensor)
    assert ref == ExternalRef("w.data", 0, None)
    assert problems == ("has a non-numeric external offset '0x10'", "has a negative external length -5")
    assert facts.lenient_external_ref(external(fields=[])) == (ExternalRef(""), ("is external but has no location",))


def test_only_data_location_makes_a_tensor_external() -> None:
    """ORT ignores external_data fields unless data_location is EXTERNAL."""
    inline = external()
    inline.data_location = TensorProto.DEFAULT
    assert not facts.is_external(inline)
    assert facts.external_ref(inline) is None and facts.lenient_external_ref(inline) == (None, ())
    assert facts.stored_nbytes(inline) == 64  # dtype x shape: what ORT reads from the (empty) typed fields


NUMBERS = st.one_of(st.integers(-(2**70), 2**70).map(str), st.text(max_size=8),
                    st.sampled_from(["", "0", "-0", "1e3", "0x10", " 5", "5 ", "٣", "inf", "9" * 5000, "0" * 5000 + "1"]))
ENTRIES = st.lists(st.tuples(st.sampled_from(["location", "offset", "length", "checksum", "basepath", "x", ""]),
                             st.one_of(NUMBERS, st.sampled_from(["w.data", "../x", "/etc/passwd"]))), max_size=6)


@settings(max_examples=300, deadline=None)
@given(entries=ENTRIES, dims=st.lists(st.integers(-2, 5), max_size=3), data_type=st.integers(-3, 40))
def test_hostile_fields_raise_only_malformed_tensor(entries: list[tuple[str, str]], dims: list[int], data_type: int) -> None:
    tensor = external(data_type=data_type, dims=tuple(dims), fields=entries)
    ref, problems = facts.lenient_external_ref(tensor)  # never raises
    try:
        strict = facts.external_ref(tensor)
    except MalformedTensor as error:
        assert problems and error.problem == problems[0]
    else:
        assert strict == ref and not problems
        assert ref.offset >= 0 and (ref.length is None or 0 <= ref.length < 2**63) and ref.location
    try:
        size = facts.stored_nbytes(tensor)
    except MalformedTensor:
        return
    assert size is None or size >= 0


# ---------------------------------------------------------------- subgraphs on a real If/Loop model

def nested_model() -> onnx.ModelProto:
    """y = If(cond) then [x + Tthen] else [x + Telse]; z = Loop(3) body [acc + Tbody, with an If inside whose
    branches hold a Constant]; a sparse initializer. Every graph has its own initializer."""
    f32 = TensorProto.FLOAT

    def vec(name: str, value: float) -> TensorProto:
        return numpy_helper.from_array(np.full((4,), value, np.float32), name)

    def branch(name: str, init: str, value: float) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("Add", ["x", init], [f"{name}_out"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", f32, [4])], [vec(init, value)])

    inner_then = helper.make_graph([helper.make_node("Constant", [], ["c_then"], value=vec("", 10.0))], "inner_then", [],
                                   [helper.make_tensor_value_info("c_then", f32, [4])])
    inner_else = helper.make_graph([helper.make_node("Constant", [], ["c_else"], value=vec("", 20.0))], "inner_else", [],
                                   [helper.make_tensor_value_info("c_else", f32, [4])])
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "Tbody"], ["acc_mid"]),
         helper.make_node("If", ["cond"], ["inner"], name="If_inner", then_branch=inner_then, else_branch=inner_else),
         helper.make_node("Add", ["acc_mid", "inner"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", f32, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", f32, [4])],
        [vec("Tbody", 1.0)],
    )
    nodes = [
        helper.make_node("If", ["cond"], ["y"], name="If_0", then_branch=branch("then", "Tthen", 2.0), else_branch=branch("else", "Telse", 3.0)),
        helper.make_node("Loop", ["trip", "cond", "x"], ["z"], name="Loop_1", body=body),
        helper.make_node("Constant", [], ["k"], value=vec("", 5.0)),
        helper.make_node("Add", ["z", "k"], ["w"]),
        helper.make_node("Add", ["w", "dense"], ["v"]),
    ]
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.array([7.0], np.float32), "dense"),
                                       numpy_helper.from_array(np.array([2], np.int64), ""), [4])
    graph = helper.make_graph(
        nodes, "nested",
        [helper.make_tensor_value_info("x", f32, [4]), helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("trip", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", f32, [4]), helper.make_tensor_value_info("v", f32, [4])],
        [vec("Tmain", 0.5)],
        sparse_initializer=[sparse],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)  # full_check would type "dense" as a sparse tensor; ORT densifies it
    return model


def test_the_nested_model_is_real(tmp_path: Path) -> None:
    """onnxruntime runs it: the walk below is over a model ORT accepts, not a hand-shaped proto."""
    path = tmp_path / "nested.onnx"
    onnx.save(nested_model(), str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.arange(4, dtype=np.float32)
    y, v = session.run(None, {"x": x, "cond": np.array(True), "trip": np.array(3, np.int64)})
    assert y.tolist() == (x + 2).tolist()
    assert v.tolist() == (x + 3 * (1 + 10) + 5 + np.array([0, 0, 7, 0])).tolist()


def test_iter_graphs_visits_every_subgraph_with_its_path() -> None:
    model = nested_model()
    sites = list(facts.iter_graphs(model))
    # Depth first, in node and attribute order (make_node sorts attributes: else_branch comes first).
    assert [s.path for s in sites] == ["", "If_0/else_branch", "If_0/then_branch", "Loop_1/body",
                                       "Loop_1/body/If_inner/else_branch", "Loop_1/body/If_inner/then_branch"]
    assert [s.graph.name for s in sites] == ["nested", "else", "then", "body", "inner_else", "inner_then"]


def test_iter_initializers_in_every_graph() -> None:
    found = [(s.graph, s.name, s.kind) for s in facts.iter_initializers(nested_model())]
    assert found == [("", "Tmain", "initializer"), ("If_0/else_branch", "Telse", "initializer"),
                     ("If_0/then_branch", "Tthen", "initializer"), ("Loop_1/body", "Tbody", "initializer")]


def test_iter_tensors_adds_constants_and_sparse_initializers() -> None:
    found = [(s.graph, s.name, s.kind, facts.stored_nbytes(s.tensor)) for s in facts.iter_tensors(nested_model())]
    assert found == [
        ("", "Tmain", "initializer", 16),
        ("", "dense", "sparse_initializer", 4),  # values
        ("", "dense", "sparse_initializer", 8),  # indices
        ("", "k", "attribute", 16),  # a Constant is named after its output, as ORT names the initializer it makes
        ("If_0/else_branch", "Telse", "initializer", 16),
        ("If_0/then_branch", "Tthen", "initializer", 16),
        ("Loop_1/body", "Tbody", "initializer", 16),
        ("Loop_1/body/If_inner/else_branch", "c_else", "attribute", 16),
        ("Loop_1/body/If_inner/then_branch", "c_then", "attribute", 16),
    ]


def test_unnamed_nodes_graphs_attributes_and_functions() -> None:
    """GRAPHS/TENSORS attributes and model-local functions (bodies ORT inlines) are walked too."""
    sub = helper.make_graph([], "g", [], [], [numpy_helper.from_array(np.zeros(2, np.int8), "S")])
    custom = helper.make_node("Custom", [], ["o"], domain="test.domain")
    custom.attribute.extend([helper.make_attribute("gs", [sub, sub]), helper.make_attribute("ts", [numpy_helper.from_array(np.zeros(3, np.int16))])])
    inner_if = helper.make_node("If", ["c"], ["r"], then_branch=sub, else_branch=sub)
    function = helper.make_function("test.fn", "F", ["c"], ["r", "k"],
                                    [inner_if, helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.zeros(5, np.int64)))],
                                    [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("Relu", ["a"], ["b"]), custom], "main", [], [])
    model = helper.make_model(graph, functions=[function])
    assert [s.path for s in facts.iter_graphs(model)] == [
        "", "Custom#1/gs[0]", "Custom#1/gs[1]", "function:test.fn:F/If#0/else_branch", "function:test.fn:F/If#0/then_branch"]
    tensors = [(s.graph, s.name, facts.stored_nbytes(s.tensor)) for s in facts.iter_tensors(model)]
    assert ("", "Custom#1/ts", 6) in tensors and ("function:test.fn:F", "k", 40) in tensors
    assert ("function:test.fn:F/If#0/then_branch", "S", 2) in tensors and len(tensors) == 6


def test_external_data_in_subgraphs_is_found(tmp_path: Path) -> None:
    """onnx.save puts subgraph initializers (and, asked to, Constant values) in the data file too: every reader
    must see their locations."""
    onnx.save(nested_model(), str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0,
              convert_attribute=True)
    model = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    external = [(s.graph, s.name) for s in facts.iter_tensors(model) if facts.is_external(s.tensor)]
    assert ("If_0/then_branch", "Tthen") in external and ("Loop_1/body/If_inner/else_branch", "c_else") in external
    assert facts.external_locations(model) == ["m.data"]
    inline = [(s.name, facts.inline_nbytes(s.tensor)) for s in facts.iter_tensors(nested_model())]
    assert [(s.name, facts.stored_nbytes(s.tensor)) for s in facts.iter_tensors(model)] == inline


def test_graph_facts() -> None:
    model = nested_model()
    assert facts.graph_tensor_names(model.graph) == {"Tmain", "k"}
    assert facts.op_counts(model.graph.node) == {"Add": 2, "Constant": 1, "If": 1, "Loop": 1}
    assert facts.op_counts(model.graph.node, exclude=["Add", "Constant"]) == {"If": 1, "Loop": 1}
    model.graph.input.append(helper.make_tensor_value_info("Tmain", TensorProto.FLOAT, [4]))  # IR < 4 style
    assert [v.name for v in facts.graph_inputs(model.graph)] == ["x", "cond", "trip"]


# ---------------------------------------------------------------- EPContext nodes of a real compile

def compile_split(out: Path, embed: str) -> onnx.ModelProto:
    result = run_cli("compile", FIXTURES / "split.onnx", "-o", out, "--ep", "qnn", "--embed", embed)
    assert result.returncode == 0, result.stderr
    return onnx.load(str(out / "split_ctx.onnx"), load_external_data=False)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, onnx.ModelProto]]:
    """split.onnx compiled for QNN twice: blob left as a file, and blob embedded."""
    found = {}
    for embed in ("never", "always"):
        out = tmp_path_factory.mktemp(f"split-{embed}")
        found[embed] = (out, compile_split(out, embed))
    return found


def test_epcontext_attributes_of_a_file_blob(compiled: dict[str, tuple[Path, onnx.ModelProto]]) -> None:
    out, model = compiled["never"]
    nodes = facts.epcontext_nodes(model)
    assert len(nodes) == 3 and [n.op_type for n in model.graph.node].count("EPContext") == 3
    assert all(facts.is_epcontext(n) for n in nodes) and not any(facts.is_epcontext(n) for n in model.graph.node if n not in nodes)
    attrs = [facts.epcontext_attrs(n) for n in nodes]
    for node, a in zip(nodes, attrs):
        raw = {x.name: helper.get_attribute_value(x) for x in node.attribute}  # onnx's own reading, for comparison
        assert (a.embed_mode, a.main_context, a.max_size) == (raw["embed_mode"], raw["main_context"], raw.get("max_size", 0))
        assert a.source == raw["source"].decode() == "QNNExecutionProvider"
        assert a.partition_name == raw["partition_name"].decode() == node.name
        assert a.ep_sdk_version == raw["ep_sdk_version"].decode() and a.ep_sdk_version
        assert a.cache == raw.get("ep_cache_context", b"") and a.problems == ()
    [main] = [a for a in attrs if a.main_context == 1]
    blob = published(out, "split_ctx_qnn.bin")
    assert main.embed_mode == 0 and main.blob_location == blob and main.embedded_bytes == 0
    assert [facts.blob_location(n) for n in nodes].count(blob) == 1
    assert [a.blob_location for a in attrs if a.main_context == 0] == [None, None]  # QNN: one shared context
    assert resolve_inside(out, main.blob_location, plain=True).is_file()
    assert facts.external_locations(model) == [published(out, "split_ctx.onnx.data")]
    assert "cache" not in repr(main)  # a multi-megabyte context never lands in a log line


def test_epcontext_attributes_of_an_embedded_blob(compiled: dict[str, tuple[Path, onnx.ModelProto]]) -> None:
    never_out, _ = compiled["never"]
    _, model = compiled["always"]
    [main] = [facts.epcontext_attrs(n) for n in facts.epcontext_nodes(model) if facts.epcontext_attrs(n).main_context == 1]
    assert main.embed_mode == 1 and main.blob_location is None
    assert main.cache == (never_out / published(never_out, "split_ctx_qnn.bin")).read_bytes()
    assert main.embedded_bytes == len(main.cache) > 100_000
    assert all(facts.blob_location(n) is None for n in facts.epcontext_nodes(model))


def test_epcontext_defaults_follow_the_schema() -> None:
    """com.microsoft EPContext: embed_mode and main_context default to 1, max_size to 0."""
    assert facts.epcontext_attrs(helper.make_node("EPContext", ["x"], ["y"], domain="com.microsoft")) == facts.EpContextAttrs()
    node = helper.make_node("EPContext", ["x"], ["y"], domain="com.microsoft", ep_cache_context=b"ctx bytes")
    assert facts.epcontext_attrs(node).embedded_bytes == 9 and facts.blob_location(node) is None


@pytest.mark.parametrize("attrs, problem, expect", [
    ({"embed_mode": "zero"}, "'embed_mode' is STRING, not INT", {"embed_mode": None}),
    ({"embed_mode": [0, 1]}, "'embed_mode' is INTS, not INT", {"embed_mode": None}),
    ({"main_context": float("inf")}, "'main_context' is FLOAT, not INT", {"main_context": None}),
    ({"source": 5}, "'source' is INT, not STRING", {"source": ""}),
    ({"ep_cache_context": 5, "embed_mode": 0}, "'ep_cache_context' is INT, not STRING", {"cache": b""}),
])
def test_attributes_of_the_wrong_type_are_reported_not_raised(attrs: dict[str, Any], problem: str, expect: dict[str, Any]) -> None:
    node = helper.make_node("EPContext", ["x"], ["y"], domain="com.microsoft", **attrs)
    read = facts.epcontext_attrs(node)
    assert read.problems == (f"attribute {problem}",)
    assert {k: getattr(read, k) for k in expect} == expect


def test_blob_location_of_odd_nodes() -> None:
    def node(**attrs: Any) -> onnx.NodeProto:
        return helper.make_node("EPContext", ["x"], ["y"], domain="com.microsoft", **attrs)

    assert facts.blob_location(node(embed_mode=0, ep_cache_context=b"blob.bin")) == "blob.bin"
    assert facts.blob_location(node(embed_mode="zero", ep_cache_context=b"blob.bin")) == "blob.bin"  # unreadable: checked
    assert facts.blob_location(node(embed_mode=0, ep_cache_context=b"m\xdf.bin")) == "m\ufffd.bin"
    assert facts.blob_location(node(embed_mode=0)) is None
    assert facts.blob_location(node(embed_mode=0, ep_cache_context=b"")) is None
    assert facts.blob_location(helper.make_node("Relu", ["x"], ["y"], ep_cache_context=b"blob.bin", embed_mode=0)) is None
    repeated = node(embed_mode=0, ep_cache_context=b"first.bin")
    repeated.attribute.append(helper.make_attribute("ep_cache_context", b"second.bin"))
    assert facts.blob_location(repeated) == "first.bin" and facts.attribute(repeated, "ep_cache_context").s == b"first.bin"
    assert facts.attribute(repeated, "missing") is None


# ---------------------------------------------------------------- input shapes

def test_input_dims() -> None:
    value_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "batch", -1, None, 0])
    assert facts.input_dims(value_info) == (1, "batch", None, None, 0)
    value_info.type.tensor_type.shape.dim[1].dim_param = ""  # an empty dim_param is unknown too
    assert facts.input_dims(value_info)[1] is None
    assert facts.input_dims(helper.make_tensor_value_info("s", TensorProto.FLOAT, [])) == ()  # scalar
    assert facts.input_dims(helper.make_tensor_value_info("u", TensorProto.FLOAT, None)) == ()  # rank unknown
    sequence = helper.make_value_info("q", helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [2])))
    assert facts.input_dims(sequence) == ()


def test_input_dims_of_the_fixtures() -> None:
    inputs = {f: [(v.name, facts.input_dims(v)) for v in facts.graph_inputs(onnx.load(str(FIXTURES / f"{f}.onnx")).graph)]
              for f in ("dynamic", "mixed")}
    assert inputs == {"dynamic": [("x", ("batch", 256))],
                      "mixed": [("x", (1, 16)), ("h", (1, 16)), ("idx", ("n",)), ("mask", (1, 16))]}


def test_symbolic_dim_that_is_not_utf8() -> None:
    value_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["bat"])
    parsed = onnx.ValueInfoProto()
    parsed.ParseFromString(value_info.SerializeToString().replace(b"bat", b"b\xdft"))
    assert facts.input_dims(parsed) == ("b\ufffdt",)
