"""Inputs for real runs (ortcompile.readback.feeds/hints/given): models built with onnx.helper and run on the
real CPU EP, plus the real-model corpus (tests/corpus.py: pinned PyPI wheels; CI fails when it is missing). No mocks: a feed is right when
onnxruntime runs the model on it and the values are what the graph needs."""

from __future__ import annotations

from pathlib import Path

import corpus
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortcompile.errors import UsageError
from ortcompile.readback.feeds import (
    IMAGE_EXTENT,
    INTEGER_HIGH,
    SEQUENCE_EXTENT,
    Given,
    InputSpec,
    load_inputs,
    make_feeds,
    parse_input,
    read_hints,
    specs_from_model,
    specs_from_session,
    unknown_dims,
)

IR_VERSION = 10  # onnx 1.23 writes IR 14 by default; onnxruntime 1.31 reads up to 13


def save(path: Path, nodes: list, inputs: list, outputs: list, initializers: list = (), opset: int = 17) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, list(initializers))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION), path)
    return path


def cpu(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def feeds_for(path: Path, **kwargs):
    """Specs from the session (what verify runs), hints from the source graph: how the product uses the API."""
    return make_feeds(specs_from_session(cpu(path)), hints=read_hints(path), **kwargs)


@pytest.fixture
def embedding(tmp_path: Path) -> Path:
    """A BERT-like embedding: token ids through Cast/Unsqueeze/Squeeze into a 3-row table (like token_type_ids),
    position ids into a 16-row table, an attention mask multiplied in. [0, 4) indices read past the 3-row table."""
    table = np.arange(3 * 4, dtype=np.float32).reshape(3, 4)
    positions = np.ones((16, 4), dtype=np.float32)
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids32"], to=TensorProto.INT32),
        helper.make_node("Unsqueeze", ["ids32", "axis0"], ["ids_u"]),
        helper.make_node("Squeeze", ["ids_u", "axis0"], ["ids_s"]),
        helper.make_node("Gather", ["table", "ids_s"], ["tok"]),
        helper.make_node("Gather", ["positions", "position_ids"], ["pos"]),
        helper.make_node("Add", ["tok", "pos"], ["emb"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis_last"], ["mask3"]),
        helper.make_node("Mul", ["emb", "mask3"], ["y"]),
    ]
    inputs = [
        helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
    ]
    inits = [numpy_helper.from_array(table, "table"), numpy_helper.from_array(positions, "positions"),
             numpy_helper.from_array(np.array([0], np.int64), "axis0"), numpy_helper.from_array(np.array([-1], np.int64), "axis_last")]
    return save(tmp_path / "embedding.onnx", nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


@pytest.fixture
def sample_rate(tmp_path: Path) -> Path:
    """A VAD-like switch: `sr` (a scalar) reshaped, picked with Gather (data side) and compared with Equal to 16000;
    the model computes x*2 only on that path, -1 elsewhere. The constant is a Constant node, not an initializer."""
    nodes = [
        helper.make_node("Constant", [], ["rate"], value=numpy_helper.from_array(np.array(16000, np.int64))),
        helper.make_node("Reshape", ["sr", "one"], ["sr1"]),
        helper.make_node("Gather", ["sr1", "zero"], ["sr0"], axis=0),
        helper.make_node("Equal", ["sr0", "rate"], ["is16k"]),
        helper.make_node("Mul", ["x", "two"], ["doubled"]),
        helper.make_node("Where", ["is16k", "doubled", "minus_one"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "samples"]), helper.make_tensor_value_info("sr", TensorProto.INT64, [])]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "one"), numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"), numpy_helper.from_array(np.array(-1.0, np.float32), "minus_one")]
    return save(tmp_path / "vad.onnx", nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


# ---------------------------------------------------------------- hints from the source graph


def test_indices_into_a_small_table_stay_inside_it(embedding: Path) -> None:
    session = cpu(embedding)
    with pytest.raises(Exception, match="out of bounds|indices element out of data bounds"):
        rng = np.random.default_rng(0)  # today's verify inputs: [0, 4) into a 3-row table
        session.run(None, {"ids": rng.integers(0, INTEGER_HIGH, (1, 64)), "position_ids": np.zeros((1, 64), np.int64),
                           "attention_mask": np.ones((1, 64), np.int64)})
    feeds = feeds_for(embedding, seed=0, dims={"seq": 16})
    ids = feeds.arrays["ids"]
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() <= 2 and len(np.unique(ids)) == 3  # all rows, none past
    assert any("ids: uniform in [0, 3)" in n and "'table'" in n for n in feeds.notes)
    y = session.run(None, feeds.arrays)[0]
    assert y.shape == (1, 16, 4) and np.isfinite(y).all()


def test_mask_is_all_ones_and_positions_count_up(embedding: Path) -> None:
    feeds = feeds_for(embedding, seed=3, dims={"seq": 20})
    assert (feeds.arrays["attention_mask"] == 1).all()
    # 20 positions into a 16-row table: counted modulo the table, never past it
    assert feeds.arrays["position_ids"].tolist() == [[i % 16 for i in range(20)]]
    cpu(embedding).run(None, feeds.arrays)


def test_sample_rate_compared_with_16000_gets_16000(sample_rate: Path) -> None:
    assert read_hints(sample_rate)["sr"].value == 16000
    feeds = feeds_for(sample_rate, seed=0)
    assert feeds.arrays["sr"].shape == () and feeds.arrays["sr"] == 16000 and feeds.arrays["sr"].dtype == np.int64
    y = cpu(sample_rate).run(None, feeds.arrays)[0]
    np.testing.assert_array_equal(y, feeds.arrays["x"] * 2)  # the 16 kHz path ran, not the -1 fallback


def test_a_one_hot_encoded_input_gets_classes_of_its_range(tmp_path: Path) -> None:
    """Equal against a constant 0..N-1 is a one-hot encoding (jax/TF exports; magika's bytes): values in [0, N),
    and the input is ids, so its edge sets apply. Before, it was drawn from [0, 4): magika passed its check at
    66 dB and was wrong at -122 dB on a text file. A constant that is not a range gives no bound."""
    def model(classes: np.ndarray, name: str) -> Path:
        graph = helper.make_graph(
            [helper.make_node("Unsqueeze", ["b", "axis"], ["u"]), helper.make_node("Equal", ["u", "classes"], ["hot"]),
             helper.make_node("Cast", ["hot"], ["y"], to=TensorProto.FLOAT)], "g",
            [helper.make_tensor_value_info("b", TensorProto.INT32, [1, 64])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, classes.size])],
            [numpy_helper.from_array(classes.reshape(1, 1, -1), "classes"), numpy_helper.from_array(np.array([2], np.int64), "axis")])
        path = tmp_path / name
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
        return path

    one_hot = model(np.arange(257, dtype=np.int32), "one_hot.onnx")
    hint = read_hints(one_hot)["b"]
    assert hint.high == 257 and "one-hot" in hint.why
    values = feeds_for(one_hot, seed=0).arrays["b"]
    assert values.min() >= 0 and values.max() < 257 and values.max() > 200
    assert read_hints(model(np.array([0, 1, 3], np.int32), "not_a_range.onnx")).get("b") is None


def test_table_sizes_from_constants_subgraphs_and_shape_inference(tmp_path: Path) -> None:
    """Tables that are a Constant node, a computed tensor (Concat of two initializers: shape inference), and a
    Gather inside an If branch reading an outer input; GatherElements along axis 1."""
    then = helper.make_graph([helper.make_node("Gather", ["big", "k"], ["picked"])], "then", [],
                             [helper.make_tensor_value_info("picked", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Identity", ["big"], ["picked2"])], "else", [],
                              [helper.make_tensor_value_info("picked2", TensorProto.FLOAT, None)])
    nodes = [
        helper.make_node("Constant", [], ["const_table"], value=numpy_helper.from_array(np.zeros((7, 2), np.float32))),
        helper.make_node("Gather", ["const_table", "i"], ["a"]),
        helper.make_node("Concat", ["half", "half"], ["joined"], axis=0),
        helper.make_node("Gather", ["joined", "j"], ["b"]),
        helper.make_node("If", ["flag"], ["c"], then_branch=then, else_branch=other),
        helper.make_node("GatherElements", ["wide", "e"], ["d"], axis=1),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, [4]) for n in "ijk"]
    inputs += [helper.make_tensor_value_info("flag", TensorProto.BOOL, []), helper.make_tensor_value_info("e", TensorProto.INT64, [2, 3])]
    inits = [numpy_helper.from_array(np.zeros((5, 2), np.float32), "half"), numpy_helper.from_array(np.zeros((9, 2), np.float32), "big"),
             numpy_helper.from_array(np.zeros((2, 11), np.float32), "wide")]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "abcd"]
    path = save(tmp_path / "tables.onnx", nodes, inputs, outputs, inits)
    hints = read_hints(path)
    assert {name: hint.high for name, hint in hints.items()} == {"i": 7, "j": 10, "k": 9, "e": 11}
    feeds = feeds_for(path, seed=1)
    assert feeds.arrays["flag"].all()  # a bool input: all true, so the If's then-branch (the Gather) runs
    cpu(path).run(None, feeds.arrays)


def test_initializers_are_not_inputs_and_specs_agree_with_the_session(embedding: Path, tmp_path: Path) -> None:
    model = onnx.load(embedding)
    model.graph.input.append(helper.make_tensor_value_info("table", TensorProto.FLOAT, [3, 4]))  # overridable initializer
    onnx.save(model, tmp_path / "with_init_input.onnx")
    specs = specs_from_model(model)
    assert [s.name for s in specs] == ["ids", "position_ids", "attention_mask"]
    session_specs = specs_from_session(cpu(tmp_path / "with_init_input.onnx"))
    assert [(s.name, s.elem_type, s.dims) for s in session_specs] == [(s.name, s.elem_type, s.dims) for s in specs]
    assert specs[0].describe() == "tensor(int64)[batch,seq]"


# ---------------------------------------------------------------- dims


def test_guessed_dims_are_reported_and_explicit_dims_win(tmp_path: Path) -> None:
    nodes = [helper.make_node("Identity", ["image"], ["a"]), helper.make_node("Identity", ["tokens"], ["b"])]
    inputs = [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, "height", None]),
              helper.make_tensor_value_info("tokens", TensorProto.INT64, ["n", "length"])]
    path = save(tmp_path / "dims.onnx", nodes, inputs, [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "a"]
                + [helper.make_tensor_value_info("b", TensorProto.INT64, None)])
    feeds = feeds_for(path, seed=0)
    assert feeds.guessed == {"batch": 1, "height": IMAGE_EXTENT, "image[3]": IMAGE_EXTENT, "n": 1, "length": SEQUENCE_EXTENT}
    assert feeds.arrays["image"].shape == (1, 3, 64, 64) and feeds.arrays["tokens"].shape == (1, 256)
    assert feeds.notes[0] == "guessed dims: batch=1, height=64, image[3]=64, n=1, length=256"
    explicit = feeds_for(path, seed=0, dims={"height": 32, "image[3]": 48, "length": 5})
    assert explicit.arrays["image"].shape == (1, 3, 32, 48) and explicit.guessed == {"batch": 1, "n": 1}
    assert unknown_dims(specs_from_model(onnx.load(path)), {"height": 1, "hieght": 2}) == ["hieght"]


def test_given_arrays_set_symbolic_dims_and_must_agree(embedding: Path) -> None:
    ids = np.array([[0, 1, 2, 2, 1]], np.int64)
    feeds = feeds_for(embedding, seed=0, given={"ids": ids})
    assert feeds.dims == {"batch": 1, "seq": 5} and feeds.guessed == {}
    assert feeds.arrays["ids"] is ids and feeds.arrays["attention_mask"].shape == (1, 5)
    with pytest.raises(UsageError, match=r"input 'position_ids' \(given\) has seq=4, but input 'ids' \(given\) has seq=5"):
        feeds_for(embedding, given={"ids": ids, "position_ids": np.zeros((1, 4), np.int64)})
    with pytest.raises(UsageError, match=r"has seq=5, but seq=8 was asked for"):
        feeds_for(embedding, given={"ids": ids}, dims={"seq": 8})


def test_same_seed_same_arrays_whatever_the_order_or_the_given_inputs() -> None:
    specs = [InputSpec("a", TensorProto.FLOAT, (2, 3)), InputSpec("b", TensorProto.INT32, (4,))]
    first = make_feeds(specs, seed=7).arrays
    np.testing.assert_array_equal(make_feeds(specs[::-1], seed=7).arrays["a"], first["a"])
    np.testing.assert_array_equal(make_feeds(specs, seed=7, given={"b": np.zeros(4, np.int32)}).arrays["a"], first["a"])
    assert not np.array_equal(make_feeds(specs, seed=8).arrays["a"], first["a"])


def test_every_numpy_type_is_generated_and_runs(tmp_path: Path) -> None:
    types = {"f16": TensorProto.FLOAT16, "f32": TensorProto.FLOAT, "f64": TensorProto.DOUBLE, "i8": TensorProto.INT8, "i16": TensorProto.INT16,
             "i32": TensorProto.INT32, "i64": TensorProto.INT64, "u8": TensorProto.UINT8, "u16": TensorProto.UINT16, "u32": TensorProto.UINT32,
             "u64": TensorProto.UINT64, "b": TensorProto.BOOL, "s": TensorProto.STRING}
    nodes = [helper.make_node("Identity", [n], [f"{n}_out"]) for n in types]
    inputs = [helper.make_tensor_value_info(n, t, [2, "k"]) for n, t in types.items()]
    outputs = [helper.make_tensor_value_info(f"{n}_out", t, None) for n, t in types.items()]
    path = save(tmp_path / "types.onnx", nodes, inputs, outputs)
    feeds = feeds_for(path, seed=0, dims={"k": 3})
    results = dict(zip([f"{n}_out" for n in types], cpu(path).run([f"{n}_out" for n in types], feeds.arrays)))
    for name, array in feeds.arrays.items():
        assert array.shape == (2, 3)
        np.testing.assert_array_equal(results[f"{name}_out"], array)
    assert feeds.arrays["f16"].dtype == np.float16 and feeds.arrays["u64"].dtype == np.uint64
    assert (feeds.arrays["s"] == "ortcompile").all() and feeds.arrays["b"].all()
    with pytest.raises(UsageError, match=r"input 'bf' has type tensor\(bfloat16\)\[2\], which cannot be generated"):
        make_feeds([InputSpec("bf", TensorProto.BFLOAT16, (2,), "tensor(bfloat16)")])


# ---------------------------------------------------------------- inputs the user gives


def test_parse_input_scalars_and_files(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.ones((1, 3), np.float64))
    assert parse_input("sr=16000") == ("sr", Given(16000, "sr=16000"))
    assert parse_input("scale=0.5")[1].value == 0.5 and parse_input("flag=true")[1].value is True
    name, given = parse_input(f"a=b={tmp_path / 'x.npy'}", names=["a=b"])  # a known name containing '='
    assert name == "a=b" and given.origin == "x.npy" and given.value.shape == (1, 3)
    for bad, message in [("novalue", "expected NAME=FILE.npy or NAME=VALUE"), ("x=", "expected NAME"),
                         ("x=nope.npy", "is neither a number nor a file")]:
        with pytest.raises(UsageError, match=message):
            parse_input(bad)


def test_load_inputs_from_npz_and_directory(tmp_path: Path) -> None:
    np.savez(tmp_path / "in.npz", ids=np.zeros((1, 2), np.int64), sr=np.array(8000))
    loaded = load_inputs(tmp_path / "in.npz")
    assert set(loaded) == {"ids", "sr"} and loaded["sr"].origin == "in.npz:sr"
    (tmp_path / "dir").mkdir()
    np.save(tmp_path / "dir" / "ids.npy", np.zeros((1, 2), np.int64))
    (tmp_path / "dir" / "README").write_text("ignored")
    assert set(load_inputs(tmp_path / "dir")) == {"ids"}
    np.save(tmp_path / "single.npy", np.zeros(2))
    (tmp_path / "empty").mkdir()
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    for path, message in [(tmp_path / "missing.npz", "no such file"), (tmp_path / "empty", "no .npy or .npz files"),
                          (tmp_path / "single.npy", "a single array has no input name")]:
        with pytest.raises(UsageError, match=message):
            load_inputs(path)
    with pytest.raises(UsageError, match="cannot read as .npy"):
        parse_input(f"x={tmp_path / 'objects.npy'}")  # pickles are refused: a data file must not run code


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"idz": np.zeros((1, 2), np.int64)}, "unknown input 'idz': the model's inputs are ids, position_ids, attention_mask"),
        ({"ids": np.zeros((2,), np.int64)}, r"input 'ids' \(given\) has shape \[2\] \(rank 1\), the model needs tensor\(int64\)\[batch,seq\] \(rank 2\)"),
        ({"ids": np.zeros((1, 2), np.float32)}, r"holds float32, the model needs tensor\(int64\)\[batch,seq\]: an integer input needs integers"),
        ({"attention_mask": np.array([[2**40]], np.int64)}, None),  # fits int64: fine
    ],
)
def test_given_arrays_are_checked_against_the_inputs(embedding: Path, given: dict, message: str | None) -> None:
    if message is None:
        feeds_for(embedding, given=given)
        return
    with pytest.raises(UsageError, match=message) as info:
        feeds_for(embedding, given=given)
    assert info.value.exit_code == 2 and "\n" not in info.value.message


def test_dtype_conversions_keep_values_or_refuse() -> None:
    specs = [InputSpec("f", TensorProto.FLOAT, (3,)), InputSpec("i", TensorProto.INT32, (3,)), InputSpec("m", TensorProto.BOOL, (3,)),
             InputSpec("fixed", TensorProto.FLOAT, (2, 4)), InputSpec("s", TensorProto.STRING, (1,))]
    feeds = make_feeds(specs, given={"f": np.arange(3, dtype=np.float64), "i": np.array([1, 2, 3], np.int64), "m": np.array([0, 1, 1]),
                                     "s": np.array(["text"]), "fixed": Given(7, "fixed=7")})
    assert feeds.arrays["f"].dtype == np.float32 and feeds.arrays["i"].dtype == np.int32 and feeds.arrays["m"].tolist() == [False, True, True]
    assert feeds.arrays["fixed"].tolist() == [[7.0] * 4] * 2  # a scalar fills the input
    refused = [
        ({"i": np.array([2**31, 0, 0], np.int64)}, "values 0..2147483648 do not fit int32"),
        ({"m": np.array([0, 2, 1])}, "a bool input needs bools or 0/1"),
        ({"fixed": np.zeros((2, 5), np.float32)}, r"has shape \[2, 5\], the model needs tensor\(float\)\[2,4\] \(dim 1 is 4\)"),
        ({"i": Given(0.5, "i=0.5")}, r"input 'i' \(i=0.5\) holds float64, the model needs tensor\(int32\)\[3\]"),
        ({"s": np.array([1])}, "a string input needs strings"),
    ]
    for given, message in refused:
        with pytest.raises(UsageError, match=message):
            make_feeds(specs, given=given)


# ---------------------------------------------------------------- the real-model corpus

@pytest.mark.corpus
@pytest.mark.parametrize("model_id", [m.id for m in corpus.models()])
def test_corpus_models_run_on_generated_inputs(model_id: str) -> None:
    """Every corpus model runs on the CPU EP with generated feeds; the one whose batch is unnamed in two inputs
    (silero_vad.onnx: input[None, None], state[2, None, 128]) runs once that dim is given by NAME[AXIS]."""
    path = corpus.require_model(model_id).path
    dims = {"state[1]": 1} if path.name == "silero_vad.onnx" else {}
    feeds = feeds_for(path, seed=0, dims=dims)
    outputs = cpu(path).run(None, feeds.arrays)
    assert all(np.isfinite(o).all() for o in outputs if o.dtype.kind == "f")


@pytest.mark.corpus
def test_corpus_token_inputs_index_their_tables_and_the_vad_gets_its_sample_rate() -> None:
    hints = read_hints(corpus.require_model("rxnmap/rxnmap").path)
    assert {name: hint.high for name, hint in hints.items()} == {"atoms": 121, "neighbors": 17, "distances": 13, "roles": 4}
    for vad in ["silero/silero_vad", "silero/silero_vad_op18_ifless"]:  # Equal directly, and through Reshape + Gather
        assert read_hints(corpus.require_model(vad).path)["sr"].value == 16000


def _resize(path: Path, operand: str, out: list[int], axes: list[int] | None = None) -> Path:
    """X [1, 2, 3, 4] -> Resize with `operand` ("scales" or "sizes") a graph input, the output declared `out`."""
    n = len(axes) if axes else 4
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2, 3, 4]),
              helper.make_tensor_value_info(operand, TensorProto.FLOAT if operand == "scales" else TensorProto.INT64, [n])]
    wiring = ["X", "", "scales"] if operand == "scales" else ["X", "", "", "sizes"]
    node = helper.make_node("Resize", wiring, ["Y"], mode="nearest", **({"axes": axes} if axes else {}))
    return save(path, [node], inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, out)], opset=18)


def test_a_resize_scales_or_sizes_input_gets_what_the_shapes_imply(tmp_path: Path) -> None:
    """Random scales are no scales (ORT refuses <= 0: the check refused ONNX's resize node tests on the source):
    the output over the input per axis; sizes: the output's dims; with `axes`, those axes only; with the output's
    shape unknown, the identity. Each model runs on the CPU EP on its feeds and gives the declared shape."""
    cases = [
        (_resize(tmp_path / "scales.onnx", "scales", [1, 2, 6, 12]), "scales", [1.0, 1.0, 2.0, 3.0]),
        (_resize(tmp_path / "sizes.onnx", "sizes", [1, 2, 6, 2]), "sizes", [1, 2, 6, 2]),
        (_resize(tmp_path / "axes.onnx", "scales", [1, 2, 6, 8], axes=[2, 3]), "scales", [2.0, 2.0]),
        (_resize(tmp_path / "unknown.onnx", "scales", ["h", "w", "c", "d"]), "scales", [1.0, 1.0, 1.0, 1.0]),
    ]
    for path, operand, values in cases:
        hint = read_hints(path)[operand]
        assert list(hint.values) == values and f"the {operand} of Resize" in hint.why, (path.name, hint)
        feeds = feeds_for(path, seed=0)
        assert feeds.arrays[operand].tolist() == values
        assert any(note.startswith(f"{operand}: {values}") for note in feeds.notes), feeds.notes
        [y] = ort.InferenceSession(str(path)).run(None, feeds.arrays)
        declared = [d.dim_value or None for d in onnx.load(str(path)).graph.output[0].type.tensor_type.shape.dim]
        assert [d or s for d, s in zip(declared, y.shape)] == list(y.shape)
