"""The one place that drives onnxruntime.ModelCompiler: pass 1 happens inside its callbacks.

ORT compiles the EP partitions, then asks `DataPass.location_func` where each remaining initializer
goes (we write it there and then), and finally streams the now-small graph proto to us.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortcompile.compile.blobs import BlobSink, callback_unsupported
from ortcompile.compile.datapass import DataPass
from ortcompile.compile.source import PROTOBUF_LIMIT
from ortcompile.eps import ResolvedEp
from ortcompile.errors import CompilationFailed, InvalidModel, OrtCompileError, first_line, output_error
from ortcompile.native import configure_session_logging, native_stdout_to_stderr

NOTHING_COMPILED = "Unable to compile any nodes"
_CALLBACK_SUPPORT: dict[str, bool] = {}  # EP name -> accepts the EP-context write callback (asked once per process)


@dataclass
class OrtOutput:
    graph_proto: bytes
    blob_sink: BlobSink | None  # set when the EP used the write callback


class _GraphBuffer:
    """Collects the streamed graph proto; refuses to grow past the protobuf limit."""

    def __init__(self) -> None:
        self.buffer = io.BytesIO()

    def write(self, chunk: bytes) -> None:
        if self.buffer.tell() + len(chunk) >= PROTOBUF_LIMIT:
            raise CompilationFailed("the compiled graph proto exceeds the 2 GiB protobuf limit")
        self.buffer.write(chunk)


class _CallbackGuard:
    """Remembers the first exception raised inside an ORT callback: ORT only passes on its text.

    Once cancelled (the user interrupted), every later callback fails, which makes ORT stop early.
    """

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.cancelled = False

    def wrap(self, func: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any) -> Any:
            try:
                if self.cancelled:
                    raise CompilationFailed("interrupted")
                return func(*args)
            except BaseException as exc:  # KeyboardInterrupt too: it must end the compile, not vanish
                self.error = self.error or exc
                raise

        return guarded


def compile_with_ort(
    source: Path,
    ep: ResolvedEp,
    model_path: Path,
    make_data_pass: Callable[[], DataPass],
    overrides: dict[str, int],
    require_compiled: bool,
    on_fallback: Callable[[str], None],
    blobs_in_memory: bool = False,
    session_config: dict[str, str] | None = None,
) -> tuple[OrtOutput, DataPass]:
    """Compile; retry without the EP-context write callback when the EP does not support it.

    `on_fallback` hears about the retry (and may raise to refuse it); with `blobs_in_memory` the
    callback keeps blobs as bytes instead of writing them beside the model.
    """
    if ep.info.compiles and ep_supports_write_callback(ep):
        data_pass = make_data_pass()
        try:
            return _attempt(source, ep, model_path, data_pass, overrides, require_compiled, True, blobs_in_memory, session_config), data_pass
        except _CallbackRefused:
            data_pass.abandon()
            _CALLBACK_SUPPORT[ep.name] = False
        except BaseException:
            data_pass.abandon()
            raise
    if ep.info.compiles:
        on_fallback(f"{ep.name} does not support the EP-context write callback; it writes its own blob files")
    data_pass = make_data_pass()
    try:
        return _attempt(source, ep, model_path, data_pass, overrides, require_compiled, False, False, session_config), data_pass
    except BaseException:
        data_pass.abandon()
        raise


class _CallbackRefused(Exception):
    pass


def _attempt(
    source: Path, ep: ResolvedEp, model_path: Path, data_pass: DataPass, overrides: dict[str, int], require_compiled: bool,
    use_callback: bool, blobs_in_memory: bool = False, session_config: dict[str, str] | None = None,
) -> OrtOutput:
    import onnxruntime as ort

    options = ort.SessionOptions()
    configure_session_logging(options)
    ep.configure(options)
    # EPs name their blob files after this path, so they land in the staging directory.
    options.add_session_config_entry("ep.context_file_path", str(model_path))
    for dim, size in overrides.items():
        options.add_free_dimension_override_by_name(dim, size)
    for key, setting in (session_config or {}).items():
        options.add_session_config_entry(key, setting)
    guard = _CallbackGuard()
    flags = ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED if require_compiled else ort.OrtCompileApiFlags.NONE
    sink = BlobSink(None if blobs_in_memory else model_path.parent) if use_callback else None
    graph = _GraphBuffer()
    try:
        # ORT names compiled partitions (and QNN its graphs inside the blob) after a hash of the model path
        # as given: opening it as a bare file name from its own directory keeps the output bytes the same
        # wherever the model lives and however its path was spelled.
        with _working_directory(source.parent), native_stdout_to_stderr():
            compiler = ort.ModelCompiler(
                options,
                source.name,
                embed_compiled_data_into_model=False,  # we embed ourselves, after checking the size (graphpass)
                flags=flags,
                get_initializer_location_func=guard.wrap(data_pass.location_func),
            )
            if sink is not None:
                compiler.set_ep_context_data_write_func(guard.wrap(sink.write_func))
            _run_interruptibly(lambda: compiler.compile_to_stream(guard.wrap(graph.write)), guard)
    except Exception as exc:
        _raise_translated(exc, guard.error, ep, source)
    return OrtOutput(graph.buffer.getvalue(), sink)


_CWD_LOCK = threading.Lock()  # the working directory is process-wide: one compile at a time changes it


@contextlib.contextmanager
def _working_directory(directory: Path) -> Iterator[None]:
    """Everything else ortcompile touches meanwhile uses absolute paths (staging, digests, blobs)."""
    with _CWD_LOCK:
        previous = os.getcwd()
        os.chdir(directory)
        try:
            yield
        finally:
            os.chdir(previous)


def _run_interruptibly(work: Callable[[], None], guard: _CallbackGuard) -> None:
    """Run ORT's compile in a worker thread so Ctrl-C/SIGTERM reach the main thread at once.

    ORT releases the GIL while it compiles, but a signal handler only runs in the main thread between
    Python bytecodes: with the compile in the main thread, Ctrl-C would wait for the EP (minutes).
    The worker is a daemon: on interrupt we stop waiting, the staging directory is removed, and the
    process exits without waiting for the EP to finish.
    """
    outcome: list[BaseException] = []

    def target() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the main thread
            outcome.append(exc)

    worker = threading.Thread(target=target, name="ortcompile-compile", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.1)
    except BaseException:
        guard.cancelled = True
        raise
    if outcome:
        raise outcome[0]


# ORT status codes and messages that mean the input model itself is broken (exit 3), not the EP (exit 1).
_INVALID_MODEL_MARKERS = (" : INVALID_GRAPH : ", " : INVALID_PROTOBUF : ", " : NO_SUCHFILE : ", "This is an invalid model", "Load model from")


def _raise_translated(exc: Exception, callback_error: BaseException | None, ep: ResolvedEp, source: Path) -> None:
    """Re-raise what really went wrong: our own callback's exception, or ORT's error as one line."""
    if callback_error is not None:
        if isinstance(callback_error, OSError):
            raise output_error(callback_error, "external data") from callback_error
        raise callback_error
    if callback_unsupported(exc):
        raise _CallbackRefused() from exc
    if isinstance(exc, OrtCompileError):
        raise exc
    text = str(exc)
    if NOTHING_COMPILED in text:
        raise CompilationFailed(f"{ep.info.short_name}: the EP compiled no nodes", detail=text) from exc
    if any(marker in text for marker in _INVALID_MODEL_MARKERS):
        raise InvalidModel(f"{source}: ONNX Runtime cannot load this model: {_ort_message(text)}", detail=text) from exc
    raise CompilationFailed(f"{ep.info.short_name}: compilation failed: {_ort_message(text)}", detail=text) from exc


def _ort_message(text: str) -> str:
    """ORT errors read '[ONNXRuntimeError] : 1 : FAIL : file.cc:123 Func message'; keep the message."""
    line = first_line(Exception(text))
    return line.split(" : ")[-1] if " : " in line else line


def tiny_static_model() -> Any:
    """y = x + x on float[1, 8]: every EP takes it. Used to probe and to warm up EPs."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def ep_supports_write_callback(ep: ResolvedEp) -> bool:
    """Ask once per process with the one-node model: ORT refuses an unsupported callback only after loading
    and partitioning the whole model (3 s and 2.4 GB of RSS for a 2.4 GB model), never mind the EP compile."""
    if ep.name in _CALLBACK_SUPPORT:
        return _CALLBACK_SUPPORT[ep.name]
    import tempfile

    import onnxruntime as ort

    supported = True
    with tempfile.TemporaryDirectory(prefix="ortcompile-probe-") as scratch:
        options = ort.SessionOptions()
        configure_session_logging(options)
        ep.configure(options)
        options.add_session_config_entry("ep.context_file_path", str(Path(scratch) / "probe_ctx.onnx"))
        compiler = ort.ModelCompiler(options, tiny_static_model().SerializeToString())
        compiler.set_ep_context_data_write_func(lambda name, data: None)
        try:
            with native_stdout_to_stderr():
                compiler.compile_to_stream(io.BytesIO().write)
        except Exception as exc:  # anything else is for the real compile to report
            supported = not callback_unsupported(exc)
    _CALLBACK_SUPPORT[ep.name] = supported
    return supported


def ep_compiles_anything(ep: ResolvedEp) -> bool:
    """Compile a one-node static model: False means the EP itself is broken (e.g. a bad provider option).

    ORT only logs why an EP failed to start and then reports "Unable to compile any nodes", the same
    words it uses for a model the EP does not support; this tells the two apart.
    """
    import tempfile

    import onnxruntime as ort

    model = tiny_static_model()
    with tempfile.TemporaryDirectory(prefix="ortcompile-probe-") as scratch:
        options = ort.SessionOptions()
        configure_session_logging(options)
        ep.configure(options)
        options.add_session_config_entry("ep.context_file_path", str(Path(scratch) / "probe_ctx.onnx"))
        try:
            with native_stdout_to_stderr():
                compiler = ort.ModelCompiler(options, model.SerializeToString(), flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED)
                compiler.compile_to_stream(io.BytesIO().write)
        except Exception:
            return False
    return True
