"""Fuzzing the model reader and the path checks (issue 4): `ortcompile.plan.source.read_source` (input validation before
a compile) and `ortcompile.readback.inspect.inspect_model` (which must work on any model, broken or hostile).

The only allowed outcomes are a result or an `OrtCompileError` (which the CLI turns into one line and an exit code);
any other exception is a crash, and every example runs under an alarm so a hang (e.g. opening a FIFO named by a
location) fails too. Inputs: bit flips, truncations and splices of a real model; random protobuf fields appended;
models built field by field with hostile values (external_data locations with `..`, absolute paths, symlinks out of
the directory, symlink loops, FIFOs, NUL bytes, unicode, 5000-character names; offsets and lengths huge, negative or
not numbers; unknown dtypes, negative and huge dims; EPContext nodes with odd paths and attribute types); random
manifests beside a model; stage-like directories. Plus the CLI `inspect` on a few mutated files (no traceback).

Deterministic by default (derandomized, no example database, no shrinking): CI runs the same examples (about 5,000
when nothing fails) in under a minute.
ORTCOMPILE_FUZZ_SEED=<n> explores new examples; ORTCOMPILE_FUZZ_SCALE=<k> runs k times as many; ORTCOMPILE_FUZZ_SHRINK=1
shrinks a failure to a minimal example.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from genmodels import cli_env, error_lines, external_mlp, initializer, run_cli, set_external  # noqa: E402

from ortcompile.errors import OrtCompileError  # noqa: E402
from ortcompile.plan.source import read_source  # noqa: E402
from ortcompile.readback.inspect import inspect_model  # noqa: E402

BUGS = "/tmp/ortcompile-bugs"
SCALE = float(os.environ.get("ORTCOMPILE_FUZZ_SCALE", "1"))
SEED = os.environ.get("ORTCOMPILE_FUZZ_SEED")
SHRINK = os.environ.get("ORTCOMPILE_FUZZ_SHRINK") == "1"  # minimal failing examples cost minutes: off in CI
PER_EXAMPLE_TIMEOUT = 10  # seconds; the slowest example measured takes ~50 ms
ITERATIONS: dict[str, int] = {}


def fuzz_settings(examples: int) -> Callable[[Any], Any]:
    chosen = settings(
        max_examples=max(1, int(examples * SCALE)),
        deadline=None,  # the alarm below catches hangs; wall time per example varies with the machine's load
        derandomize=SEED is None,
        database=None,  # no .hypothesis/ directory in the repository
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        print_blob=True,
        phases=[Phase.explicit, Phase.generate, *([Phase.shrink] if SHRINK else [])],
    )

    def apply(func: Any) -> Any:
        func = chosen(func)
        return seed(int(SEED))(func) if SEED is not None else func

    return apply


class Hang(Exception):
    pass


@contextlib.contextmanager
def alarm(seconds: int):
    """Raise Hang in the main thread after `seconds` (interrupts a blocking open() of a FIFO too)."""
    assert threading.current_thread() is threading.main_thread()

    def handler(signum: int, frame: object) -> None:
        raise Hang(f"no result after {seconds}s")

    previous = signal.signal(signal.SIGALRM, handler)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def only_clean_outcomes(path: Path, targets: tuple[str, ...] = ("read_source", "inspect")) -> None:
    """Call the targets on `path`: a result or an OrtCompileError; anything else propagates (a crash)."""
    for target in targets:
        with alarm(PER_EXAMPLE_TIMEOUT):
            try:
                if target == "read_source":
                    read_source(path)
                else:
                    inspect_model(path).to_json()
            except OrtCompileError as exc:
                assert exc.message and "\n" not in exc.message, repr(exc.message)
                assert exc.exit_code in (1, 2, 3, 4, 5)


# ---------------------------------------------------------------- the playground directory

@pytest.fixture(scope="module")
def playground(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model directory full of traps: good data, a symlink out, a symlink loop, a FIFO, a subdirectory, a blob."""
    root = tmp_path_factory.mktemp("fuzz")
    outside = root / "outside"
    outside.mkdir()
    (outside / "secret.data").write_bytes(b"\x01" * 65536)
    d = root / "models"
    base = external_mlp(d, name="m_ctx", data="m_ctx.onnx.data")  # named like an output: inspect finds its manifest
    os.symlink(outside / "secret.data", d / "escape.data")
    os.symlink("loop.data", d / "loop.data")
    os.symlink("../models/m_ctx.onnx.data", d / "inside-link.data")
    os.mkfifo(d / "fifo.data")
    (d / "sub").mkdir()
    (d / "blob.bin").write_bytes(b"\0" * 128)
    (d / "base.bytes").write_bytes(base.read_bytes())
    return d


def _write(d: Path, data: bytes) -> Path:
    path = d / "m_ctx.onnx"
    path.write_bytes(data)
    return path


def _rich_base() -> onnx.ModelProto:
    """What the mutations start from: external and inline initializers, a dynamic input, an EPContext node."""
    model = onnx.load_from_string(external_mlp_bytes())
    node = helper.make_node("EPContext", ["r1"], ["ctx_out"], name="ctx0", domain="com.microsoft", embed_mode=0,
                            ep_cache_context=b"blob.bin", source="QNNExecutionProvider", main_context=1, partition_name="p0")
    model.graph.node.append(node)
    model.graph.output.append(helper.make_tensor_value_info("ctx_out", TensorProto.FLOAT, ["batch", 64]))
    model.graph.initializer.append(numpy_helper.from_array(np.arange(16, dtype=np.int64), "idx"))
    model.graph.initializer.append(helper.make_tensor("names", TensorProto.STRING, [2], [b"a", b"b"]))
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


_BASE_CACHE: dict[str, bytes] = {}


def external_mlp_bytes() -> bytes:
    if "mlp" not in _BASE_CACHE:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            path = external_mlp(Path(tmp), name="m_ctx", data="m_ctx.onnx.data", batch="batch")
            _BASE_CACHE["mlp"] = path.read_bytes()
    return _BASE_CACHE["mlp"]


def rich_base_bytes() -> bytes:
    if "rich" not in _BASE_CACHE:
        _BASE_CACHE["rich"] = _rich_base().SerializeToString()
    return _BASE_CACHE["rich"]


# Every example goes to both targets, one after the other (only_clean_outcomes): the examples are drawn and written
# once. (Derandomized, two tests that differed only in their target drew the same examples: the draws, not the
# targets, were most of their time.)
TARGETS = ("read_source", "inspect")


# ---------------------------------------------------------------- 1. byte-level mutations

mutation = st.one_of(
    st.tuples(st.just("flip"), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)), min_size=1, max_size=8)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6)),
    st.tuples(st.just("splice"), st.integers(0, 10**6), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("overwrite"), st.integers(0, 10**6), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.integers(1, 64)),
)


def mutate(data: bytes, ops: list[tuple]) -> bytes:
    buf = bytearray(data)
    for op in ops:
        if not buf:
            break
        at = op[1] % len(buf) if op[0] != "flip" else 0
        if op[0] == "flip":
            for position, bit in op[1]:
                buf[position % len(buf)] ^= 1 << bit
        elif op[0] == "truncate":
            del buf[at:]
        elif op[0] == "splice":
            buf[at:at] = op[2]
        elif op[0] == "overwrite":
            buf[at : at + len(op[2])] = op[2]
        elif op[0] == "delete":
            del buf[at : at + op[2]]
    return bytes(buf)


def test_fuzz_byte_mutations(playground: Path) -> None:
    count = 0

    @fuzz_settings(700)
    @given(base=st.sampled_from(["mlp", "rich"]), ops=st.lists(mutation, min_size=1, max_size=4))
    def run(base: str, ops: list[tuple]) -> None:
        nonlocal count
        count += 1
        data = external_mlp_bytes() if base == "mlp" else rich_base_bytes()
        only_clean_outcomes(_write(playground, mutate(data, ops)), TARGETS)

    run()
    ITERATIONS.update({f"byte mutations ({target})": count for target in TARGETS})
    print(f"\nfuzz: {count} byte-mutation examples (each against read_source and inspect)")


# ---------------------------------------------------------------- 2. random protobuf fields

def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


field_strategy = st.tuples(
    st.integers(1, 40),  # field numbers: ModelProto's own (1..20) and unknown ones
    st.sampled_from([0, 1, 2, 5]),  # varint, fixed64, length-delimited, fixed32
    st.one_of(st.integers(-(2**63), 2**64 - 1), st.binary(max_size=48)),
)


def encode_field(number: int, wire: int, payload: int | bytes) -> bytes:
    key = _varint(number << 3 | wire)
    if wire == 0:
        return key + _varint(payload if isinstance(payload, int) else len(payload))
    if wire == 1:
        return key + (payload if isinstance(payload, bytes) else payload.to_bytes(16, "little", signed=True))[:8].ljust(8, b"\0")
    if wire == 5:
        return key + (payload if isinstance(payload, bytes) else payload.to_bytes(16, "little", signed=True))[:4].ljust(4, b"\0")
    body = payload if isinstance(payload, bytes) else _varint(payload)
    return key + _varint(len(body)) + body


def test_fuzz_random_protobuf_fields(playground: Path) -> None:
    """Fields appended to a valid model (protobuf merges them): wrong wire types for known fields, unknown fields,
    extra graphs, garbage in strings."""
    count = 0

    @fuzz_settings(500)
    @given(base=st.sampled_from(["mlp", "rich"]), fields=st.lists(field_strategy, min_size=1, max_size=6),
           nested_graph_fields=st.lists(field_strategy, max_size=4))
    def run(base: str, fields: list[tuple], nested_graph_fields: list[tuple]) -> None:
        nonlocal count
        count += 1
        data = external_mlp_bytes() if base == "mlp" else rich_base_bytes()
        extra = b"".join(encode_field(*f) for f in fields)
        if nested_graph_fields:  # a GraphProto (field 7) merged into the model's graph: random fields inside it
            inner = b"".join(encode_field(*f) for f in nested_graph_fields)
            extra += _varint(7 << 3 | 2) + _varint(len(inner)) + inner
        only_clean_outcomes(_write(playground, data + extra), TARGETS)

    run()
    ITERATIONS.update({f"protobuf fields ({target})": count for target in TARGETS})
    print(f"\nfuzz: {count} random-protobuf-field examples (each against read_source and inspect)")


# ---------------------------------------------------------------- 3. models built field by field

SPECIAL_LOCATIONS = [
    "m_ctx.onnx.data", "../outside/secret.data", "../../etc/passwd", "/etc/passwd", "/dev/zero", "escape.data",
    "loop.data", "fifo.data", "inside-link.data", "sub", ".", "..", "", "sub/../m_ctx.onnx.data", "a\0b",
    "x" * 5000, "/".join(["d"] * 2000), "ü/ñ☃.data", "C:\\Windows\\x", "\\\\server\\share\\x", "file:///etc/passwd",
    "m_ctx.onnx", "blob.bin", "./m_ctx.onnx.data", "sub/", " m_ctx.onnx.data", "m_ctx.onnx.data\n",
]
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["", "0", "-0", "1e3", "0x10", " 5", "5 ", "٣", "inf", "nan", "9" * 5000, "18446744073709551616", "-1"]),
    st.text(max_size=8),
)
INT64 = st.integers(-(2**63), 2**63 - 1)
DIMS = st.lists(st.one_of(st.integers(-3, 70), INT64), max_size=4)
DTYPE = st.one_of(st.integers(0, 30), st.integers(-(2**31), 2**31 - 1))


@st.composite
def hostile_tensor(draw: Any, index: int) -> TensorProto:
    tensor = TensorProto(name=draw(st.one_of(st.just(f"W{index}"), st.text(max_size=12))))
    tensor.data_type = draw(DTYPE)
    tensor.dims.extend(draw(DIMS))
    if draw(st.booleans()):
        tensor.data_location = TensorProto.EXTERNAL
        entries = draw(st.lists(st.tuples(st.sampled_from(["location", "offset", "length", "checksum", "basepath"]) | st.text(max_size=6),
                                          st.sampled_from(SPECIAL_LOCATIONS) | st.text(max_size=20) | NUMBERS), max_size=5))
        if draw(st.booleans()):
            entries.insert(0, ("location", draw(st.sampled_from(SPECIAL_LOCATIONS))))
        for key, value in entries:
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
    else:
        tensor.data_location = draw(st.sampled_from([0, 0, 1]))  # 1: EXTERNAL without external_data
        if draw(st.booleans()):
            tensor.raw_data = draw(st.binary(max_size=64))
        if draw(st.booleans()):
            tensor.string_data.extend(draw(st.lists(st.binary(max_size=8), max_size=3)))
    return tensor


@st.composite
def hostile_node(draw: Any) -> onnx.NodeProto:
    op = draw(st.sampled_from(["EPContext", "EPContext", "MatMul", "Relu"]) | st.text(max_size=8))
    node = helper.make_node(op, draw(st.lists(st.text(max_size=4), max_size=3)), draw(st.lists(st.text(max_size=4), max_size=2)),
                            name=draw(st.text(max_size=8)), domain=draw(st.sampled_from(["com.microsoft", ""])))
    attributes: dict[str, Any] = {}
    if draw(st.booleans()):
        attributes["embed_mode"] = draw(st.one_of(INT64, st.floats(allow_nan=True), st.text(max_size=3), st.lists(INT64, max_size=2)))
    if draw(st.booleans()):
        attributes["ep_cache_context"] = draw(st.one_of(st.sampled_from(SPECIAL_LOCATIONS).map(lambda s: s.encode()),
                                                        st.binary(max_size=40), INT64))
    for name in ("source", "main_context", "partition_name", "ep_sdk_version"):
        if draw(st.booleans()):
            attributes[name] = draw(st.one_of(st.text(max_size=8), INT64, st.floats(allow_nan=True), st.binary(max_size=8)))
    for name, value in attributes.items():
        with contextlib.suppress(Exception):  # make_attribute refuses some odd values; those simply stay out
            node.attribute.append(helper.make_attribute(name, value))
    return node


@st.composite
def hostile_value_info(draw: Any) -> onnx.ValueInfoProto:
    value = onnx.ValueInfoProto(name=draw(st.sampled_from(["x", "y"]) | st.text(max_size=6)))
    if draw(st.booleans()):
        value.type.tensor_type.elem_type = draw(DTYPE)
        for _ in range(draw(st.integers(0, 3))):
            dim = value.type.tensor_type.shape.dim.add()
            choice = draw(st.integers(0, 2))
            if choice == 0:
                dim.dim_value = draw(INT64)
            elif choice == 1:
                dim.dim_param = draw(st.text(max_size=6))
    return value


@st.composite
def hostile_model(draw: Any) -> bytes:
    model = onnx.ModelProto(ir_version=draw(st.one_of(st.just(9), INT64)))
    for _ in range(draw(st.integers(0, 2))):
        opset = model.opset_import.add()
        opset.domain, opset.version = draw(st.sampled_from(["", "com.microsoft"]) | st.text(max_size=4)), draw(INT64)
    if draw(st.integers(0, 9)):  # mostly with a graph
        graph = model.graph
        graph.name = draw(st.text(max_size=5))
        graph.node.extend(draw(st.lists(hostile_node(), max_size=3)))
        if draw(st.booleans()):
            graph.node.append(helper.make_node("Relu", ["x"], ["y"]))
        graph.initializer.extend([draw(hostile_tensor(i)) for i in range(draw(st.integers(0, 4)))])
        graph.input.extend(draw(st.lists(hostile_value_info(), max_size=2)))
        graph.output.extend(draw(st.lists(hostile_value_info(), max_size=2)))
    return model.SerializeToString()


def test_fuzz_hostile_models(playground: Path) -> None:
    count = 0

    @fuzz_settings(500)
    @given(data=hostile_model())
    def run(data: bytes) -> None:
        nonlocal count
        count += 1
        only_clean_outcomes(_write(playground, data), TARGETS)

    run()
    ITERATIONS.update({f"hostile models ({target})": count for target in TARGETS})
    print(f"\nfuzz: {count} hostile-model examples (each against read_source and inspect)")


def test_fuzz_external_fields_of_a_good_model(playground: Path) -> None:
    """A valid model where only W0's external_data changes: the path and extent checks get every hostile value."""
    count = 0
    base = onnx.load_from_string(external_mlp_bytes())

    @fuzz_settings(600)
    @given(location=st.sampled_from(SPECIAL_LOCATIONS) | st.text(max_size=30), offset=st.none() | NUMBERS, length=st.none() | NUMBERS,
           dtype=st.one_of(st.just(TensorProto.FLOAT), DTYPE), dims=st.one_of(st.just([64, 64]), DIMS))
    def run(location: str, offset: str | None, length: str | None, dtype: int, dims: list[int]) -> None:
        nonlocal count
        count += 1
        model = onnx.ModelProto()
        model.CopyFrom(base)
        w0 = initializer(model, "W0")
        set_external(w0, location=location, offset=offset, length=length)
        w0.data_type = dtype
        del w0.dims[:]
        w0.dims.extend(dims)
        only_clean_outcomes(_write(playground, model.SerializeToString()), TARGETS)

    run()
    ITERATIONS.update({f"external fields ({target})": count for target in TARGETS})
    print(f"\nfuzz: {count} external-field examples (each against read_source and inspect)")


# ---------------------------------------------------------------- 4. manifests and stage directories beside a model

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@st.composite
def hostile_manifest(draw: Any) -> Any:
    """Mostly manifest-shaped JSON with hostile values, sometimes anything at all."""
    if draw(st.integers(0, 4)) == 0:
        return draw(JSON)
    files = draw(st.lists(st.fixed_dictionaries({}, optional={
        "name": st.sampled_from(["m_ctx.onnx", "m_ctx.onnx.data", "../outside/secret.data", "/etc/passwd", "fifo.data", "loop.data",
                                 "sub", "", "escape.data"]) | JSON,
        "size": st.integers(-(2**70), 2**70) | JSON, "sha256": st.text(max_size=64) | JSON, "role": st.sampled_from(["model", "data"]) | JSON,
        "shared": JSON,
    }), max_size=4) | JSON)
    manifest = {"format": draw(st.sampled_from(["ortcompile-manifest/1"]) | JSON), "model": "m_ctx.onnx", "files": files}
    for key in ("options", "nodes", "versions", "input"):
        if draw(st.booleans()):
            manifest[key] = draw(st.fixed_dictionaries({}, optional={"layout": st.fixed_dictionaries({}, optional={
                "align": st.integers(-5, 2**40) | JSON, "align_threshold": st.integers(-5, 2**40) | JSON}) | JSON,
                "compiled_ops": JSON, "epcontext": JSON}) | JSON)
    return manifest


def test_fuzz_manifest_beside_the_model(playground: Path, tmp_path: Path) -> None:
    count = 0
    d = tmp_path / "m"
    d.mkdir()
    for name in ("m_ctx.onnx.data", "blob.bin"):
        (d / name).write_bytes((playground / name).read_bytes())
    os.mkfifo(d / "fifo.data")
    os.symlink("loop.data", d / "loop.data")
    (d / "sub").mkdir()
    model = _write(d, rich_base_bytes())

    @fuzz_settings(300)
    @given(manifest=hostile_manifest(), raw=st.none() | st.binary(max_size=40), check=st.booleans())
    def run(manifest: Any, raw: bytes | None, check: bool) -> None:
        nonlocal count
        count += 1
        (d / "m_ctx.manifest.json").write_bytes(raw if raw is not None else json.dumps(manifest).encode())
        with alarm(PER_EXAMPLE_TIMEOUT):
            try:
                inspect_model(model, check=check).to_json()
            except OrtCompileError:
                pass

    run()
    ITERATIONS["manifests"] = count
    print(f"\nfuzz: {count} manifest examples")


@pytest.mark.parametrize("name", [
    pytest.param(".ortcompile-stage-99999999999999999999-x", id="pid-beyond-c-long"),  # a pid no C long holds (hardening-15)
    ".ortcompile-stage-0-x",  # pid 0: the process group
    ".ortcompile-stage--1-x",
    ".ortcompile-stage-٣-x",  # a unicode digit: isdigit() is True, int() works
    ".ortcompile-stage-",
])
def test_stage_like_directories_next_to_a_model(name: str, playground: Path, tmp_path: Path) -> None:
    """inspect looks for interrupted publishes among `.ortcompile-stage-*` entries: any such name is just data."""
    d = tmp_path / "m"
    d.mkdir()
    (d / "m_ctx.onnx.data").write_bytes((playground / "m_ctx.onnx.data").read_bytes())
    model = _write(d, external_mlp_bytes())
    (d / name).mkdir()
    (d / name / "publish.journal").write_text('{"move": [], "delete": []}')
    with alarm(PER_EXAMPLE_TIMEOUT):
        inspect_model(model).to_json()


# ---------------------------------------------------------------- 5. the CLI on a few mutated files

def test_cli_inspect_on_mutated_files(playground: Path, tmp_path: Path) -> None:
    """`ortcompile inspect` (text and --json) on 12 mutated models: exit 0 or a one-line error (3), no traceback."""
    import random

    rng = random.Random(4)
    env = cli_env({"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    d = tmp_path / "cli"
    d.mkdir()
    (d / "m_ctx.onnx.data").write_bytes((playground / "m_ctx.onnx.data").read_bytes())
    codes = []
    for i in range(12):
        data = bytearray(rich_base_bytes() if i % 2 else external_mlp_bytes())
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        if i % 4 == 3:
            del data[rng.randrange(len(data)) :]
        path = d / f"mut{i}.onnx"
        path.write_bytes(bytes(data))
        for extra in ([], ["--json"]):
            result = run_cli("inspect", path, *extra, env=env, timeout=60)
            assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
            assert result.returncode in (0, 3), (result.returncode, result.stderr)
            if result.returncode == 3:
                lines = error_lines(result.stderr)
                assert len(lines) == 1 and lines[0].startswith("ortcompile: error: "), result.stderr
            elif extra:
                json.loads(result.stdout)
            codes.append(result.returncode)
    ITERATIONS["cli inspect"] = len(codes)
    print(f"\nfuzz: CLI inspect on 12 mutated files x 2 formats: exit codes {sorted(set(codes))}")


def test_report_iterations() -> None:
    """Runs last in this file: the number of fuzz examples executed (see the closing note of issue 4)."""
    print(f"\nfuzz iterations: {ITERATIONS} total {sum(ITERATIONS.values())}")
