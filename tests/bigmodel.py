"""Write multi-gigabyte ONNX models with external data, fast and without holding the weights in memory.

Every large tensor is written straight into the `.data` file, chunk by chunk, from a seeded numpy
generator (one generator per (tensor, chunk), so the bytes do not depend on thread scheduling); only
the small graph proto, whose initializers carry `external_data` fields pointing into that file, is
built in memory. Two worker threads fill and `pwrite` chunks (numpy's generators and `os.pwrite`
release the GIL), so peak memory is two chunks and a 2.4 GB model takes a few seconds.

Two shapes:

* `write_cpu_model`: a chain of MatMul + Add over a [1, K] input, with large weights of odd sizes
  (so the 4 KiB alignment of the compiled data file matters), mid-size biases (external, naturally
  aligned) and tiny constants that stay inline. Runs in about a second on the CPU EP.
* `write_qnn_model`: `partitions` groups of MatMul + Add separated by `Sinh` (which QNN does not
  take), so QNN compiles one HTP graph per group; static shapes throughout.

Weights are uniform in [-a, a) with a = gain * sqrt(3 / K) (standard deviation gain / sqrt(K)), so a
MatMul keeps the activations' scale and outputs stay finite and O(1).

Usable from the command line too: `python tests/bigmodel.py cpu /tmp/big [--gb 2.35]`.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CHUNK_ELEMENTS = 2 << 20  # 8 MiB of float32 per generated chunk; 2 threads -> ~16 MiB of buffers
WORKERS = 2
INPUT_STD = 0.5  # keeps Sinh near its linear range


@dataclass(frozen=True)
class Weight:
    """A tensor whose bytes the generator writes (float32, seeded uniform)."""

    name: str
    shape: tuple[int, ...]
    scale: float  # values are uniform in [-scale, scale)

    @property
    def nbytes(self) -> int:
        return 4 * math.prod(self.shape)


@dataclass
class BigModel:
    """What was written, and what tests need to know about it."""

    path: Path
    data_path: Path
    input_name: str
    input_shape: tuple[int, ...]
    output_name: str
    weights: list[Weight]
    inline_initializers: list[str]
    partitions: int  # QNN-capable groups separated by Sinh (1 for the CPU model)
    seconds: float = 0.0  # generation wall time
    offsets: dict[str, int] = field(default_factory=dict)

    @property
    def data_bytes(self) -> int:
        return self.data_path.stat().st_size

    @property
    def total_bytes(self) -> int:
        return self.path.stat().st_size + self.data_bytes

    @property
    def largest_tensor(self) -> int:
        return max(w.nbytes for w in self.weights)

    def sample_input(self, seed: int = 1) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        x = (rng.standard_normal(self.input_shape) * INPUT_STD).astype(np.float32)
        return {self.input_name: x}

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self.data_path.unlink(missing_ok=True)


def _fill_chunk(weight: Weight, seed: int, tensor_index: int, chunk_index: int, out: np.ndarray) -> None:
    rng = np.random.default_rng([seed, tensor_index, chunk_index])
    rng.random(dtype=np.float32, out=out)  # [0, 1)
    out -= np.float32(0.5)
    out *= np.float32(2 * weight.scale)


def write_data_file(path: Path, weights: list[Weight], seed: int, pad_to: int = 1) -> dict[str, int]:
    """Write every weight back to back (offsets rounded up to `pad_to`); return name -> offset."""
    offsets: dict[str, int] = {}
    position = 0
    for weight in weights:
        position = -(-position // pad_to) * pad_to
        offsets[weight.name] = position
        position += weight.nbytes
    jobs = []
    for index, weight in enumerate(weights):
        count = math.prod(weight.shape)
        for chunk_index, start in enumerate(range(0, count, CHUNK_ELEMENTS)):
            jobs.append((index, weight, chunk_index, start, min(CHUNK_ELEMENTS, count - start)))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:  # reserve the blocks up front: page-cache writes into allocated extents are several times faster
            os.posix_fallocate(fd, 0, position)
        except (AttributeError, OSError):
            os.ftruncate(fd, position)
        buffers: dict[int, np.ndarray] = {}

        def run(job: tuple[int, Weight, int, int, int]) -> None:
            import threading

            index, weight, chunk_index, start, n = job
            buffer = buffers.setdefault(threading.get_ident(), np.empty(CHUNK_ELEMENTS, np.float32))[:n]
            _fill_chunk(weight, seed, index, chunk_index, buffer)
            view = memoryview(buffer).cast("B")
            offset = offsets[weight.name] + 4 * start
            while view:
                written = os.pwrite(fd, view, offset)
                view, offset = view[written:], offset + written

        with ThreadPoolExecutor(WORKERS, thread_name_prefix="bigmodel") as pool:
            for _ in pool.map(run, jobs):
                pass
    finally:
        os.close(fd)
    return offsets


def weight_values(model: BigModel, name: str, seed: int = 0) -> np.ndarray:
    """Regenerate one weight's values (for checks on small models; allocates the whole tensor)."""
    index = next(i for i, w in enumerate(model.weights) if w.name == name)
    weight = model.weights[index]
    flat = np.empty(math.prod(weight.shape), np.float32)
    for chunk_index, start in enumerate(range(0, flat.size, CHUNK_ELEMENTS)):
        _fill_chunk(weight, seed, index, chunk_index, flat[start : start + CHUNK_ELEMENTS])
    return flat.reshape(weight.shape)


class _GraphBuilder:
    def __init__(self, input_name: str, width: int) -> None:
        self.nodes: list = []
        self.weights: list[Weight] = []
        self.inline: list = []  # small TensorProtos kept in the graph
        self.current = input_name
        self.width = width
        self.counter = 0

    def _next(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter:03d}"

    def linear(self, out_width: int, gain: float = 1.0) -> None:
        from onnx import helper

        w = Weight(self._next("w"), (self.width, out_width), gain * math.sqrt(3.0 / self.width))
        b = Weight(self._next("b"), (out_width,), 0.01)
        self.weights += [w, b]
        matmul, added = self._next("mm"), self._next("add")
        self.nodes.append(helper.make_node("MatMul", [self.current, w.name], [matmul], name=matmul))
        self.nodes.append(helper.make_node("Add", [matmul, b.name], [added], name=added))
        self.current, self.width = added, out_width

    def unary(self, op: str) -> None:
        from onnx import helper

        out = self._next(op.lower())
        self.nodes.append(helper.make_node(op, [self.current], [out], name=out))
        self.current = out

    def scale(self, value: float) -> None:
        """Multiply by a tiny inline constant (stays in the graph proto)."""
        from onnx import helper, numpy_helper

        const = numpy_helper.from_array(np.array([value], np.float32), self._next("k"))
        self.inline.append(const)
        out = self._next("mul")
        self.nodes.append(helper.make_node("Mul", [self.current, const.name], [out], name=out))
        self.current = out


def _save(builder: _GraphBuilder, directory: Path, name: str, input_shape: tuple[int, ...], partitions: int,
          seed: int, pad_to: int = 1) -> BigModel:
    from onnx import TensorProto, helper

    directory.mkdir(parents=True, exist_ok=True)
    clock = time.perf_counter()
    path = directory / f"{name}.onnx"
    data_path = directory / f"{name}.onnx.data"
    offsets = write_data_file(data_path, builder.weights, seed, pad_to)
    output = "y"
    builder.nodes.append(helper.make_node("Identity", [builder.current], [output], name="output"))
    initializers = []
    for weight in builder.weights:
        tensor = TensorProto(name=weight.name, data_type=TensorProto.FLOAT, dims=list(weight.shape))
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", data_path.name), ("offset", str(offsets[weight.name])), ("length", str(weight.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        initializers.append(tensor)
    initializers += builder.inline
    graph = helper.make_graph(
        builder.nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, [input_shape[0], builder.width])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ortcompile-tests")
    model.ir_version = 9
    path.write_bytes(model.SerializeToString())
    return BigModel(path, data_path, "x", input_shape, output, builder.weights, [t.name for t in builder.inline],
                    partitions, time.perf_counter() - clock, offsets)


# Widths of the CPU model's chain: close to 8192 but odd, so weight sizes are not multiples of 4096
# and each one's natural offset in a packed file is misaligned.
_CPU_WIDTHS = (8192, 8191, 8193, 8189, 8197, 8183, 8201, 8179, 8209, 8171, 8219, 8167, 8221, 8161, 8231, 8159, 8237)


def write_cpu_model(directory: str | os.PathLike[str], name: str = "bigcpu", min_bytes: int = 2_350_000_000, seed: int = 0) -> BigModel:
    """A MatMul/Add chain of at least `min_bytes` of weights; input x[1, 8192]."""
    builder = _GraphBuilder("x", _CPU_WIDTHS[0])
    total = 0
    i = 1
    while total < min_bytes:
        builder.linear(_CPU_WIDTHS[i % len(_CPU_WIDTHS)])
        if i % 3 == 0:
            builder.scale(0.875)  # a tiny initializer that stays inline
        total = sum(w.nbytes for w in builder.weights)
        i += 1
    return _save(builder, Path(directory), name, (1, _CPU_WIDTHS[0]), 1, seed)


def write_qnn_model(directory: str | os.PathLike[str], name: str = "bigqnn", partitions: int = 3, layers_per_partition: int = 3,
                    width: int = 8192, seed: int = 0, damping: float | None = None) -> BigModel:
    """`partitions` groups of `layers_per_partition` [width x width] MatMul + Add, separated by Sinh.

    Defaults: 9 weights of 256 MiB = 2.25 GiB of weights, 3 QNN partitions of 768 MiB each
    (one HTP graph over ~2 GB fails to finalize; ~1 GB ones compile). Each Sinh squares the spread of what
    it gets (exponentially): past ~3 groups the outputs overflow, even in fp32. `damping` multiplies by a small
    constant before each Sinh (a Mul, in the QNN partition), so any number of groups stays finite.
    """
    builder = _GraphBuilder("x", width)
    for p in range(partitions):
        for _ in range(layers_per_partition):
            builder.linear(width)
        if p < partitions - 1:
            if damping is not None:
                builder.scale(damping)
            builder.unary("Sinh")
    return _save(builder, Path(directory), name, (1, width), partitions, seed)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["cpu", "qnn"])
    parser.add_argument("directory")
    parser.add_argument("--gb", type=float, default=2.35, help="cpu: minimum weight bytes, in 1e9")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.kind == "cpu":
        model = write_cpu_model(args.directory, min_bytes=int(args.gb * 1e9), seed=args.seed)
    else:
        model = write_qnn_model(args.directory, partitions=args.partitions, seed=args.seed)
    print(f"{model.path}: {model.total_bytes} bytes ({len(model.weights)} external weights, largest {model.largest_tensor}, "
          f"{len(model.inline_initializers)} inline) in {model.seconds:.2f}s")


if __name__ == "__main__":
    main()
