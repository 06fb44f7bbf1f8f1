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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortcompile import ortmarkers
from ortcompile.compile.blobs import BlobSink, callback_unsupported
from ortcompile.compile.datapass import DataPass
from ortcompile.eps import ResolvedEp, diagnose
from ortcompile.eps.sessionopts import session_options
from ortcompile.errors import CompilationFailed, ComponentMissing, InvalidModel, OrtCompileError, ort_reason, output_error
from ortcompile.native import native_stdout_to_stderr
from ortcompile.onnxfacts import tiny_static_model
from ortcompile.paths import model_dir
from ortcompile.plan.source import PROTOBUF_LIMIT


class NothingCompiled(CompilationFailed):
    """The EP took no node of the model (ORT's ERROR_IF_NO_NODES_COMPILED); the job explains why."""

    def __init__(self, message: str, detail: str | None = None, ep_starts: bool | None = None, model: str = "") -> None:
        super().__init__(message, detail)
        self.ep_starts = ep_starts  # None: not asked; False: the EP fails even on a one-node model
        self.model = model  # which model of a batch (its source file name)

    def __reduce__(self) -> tuple[type, tuple[str, str | None, bool | None, str]]:  # type: ignore[override]
        return (type(self), (self.message, self.detail, self.ep_starts, self.model))


class LayoutRefused(CompilationFailed):
    """ORT's layout transform rewrote `op_type` into NHWC for the EP, and the EP did not take the result: a graph no
    EP can run. Keeping that op type on the CPU EP avoids it (--cpu-nodes, or --fallback auto: fallback.py)."""

    def __init__(self, message: str, detail: str | None = None, op_type: str = "") -> None:
        super().__init__(message, detail)
        self.op_type = op_type

    def __reduce__(self) -> tuple[type, tuple[str, str | None, str]]:  # type: ignore[override]
        return (type(self), (self.message, self.detail, self.op_type))


_CALLBACK_SUPPORT: dict[str, bool] = {}  # EP name -> accepts the EP-context write callback (asked once per process)
# Measured answers, so a fresh worker does not ask again on every compile (the one-node probe: 0.04-0.06 CPU s of a
# 0.4-1.6 s small-model compile): (EP name, EP version, onnxruntime version) -> accepts the callback. Any other
# version, or a library given by path (its own version), is asked. tests/test_compile_probe.py asks the installed one.
KNOWN_CALLBACK_SUPPORT: dict[tuple[str, str, str], bool] = {
    ("QNNExecutionProvider", "2.7.0", "1.31.1"): False,  # onnxruntime-qnn 2.7.0 writes its own context binary files
}


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


@dataclass(frozen=True)
class OrtCompile:
    """One call of ONNX Runtime's Compile API: what to compile, for which EP, and where blobs go."""

    source: Path  # the model ORT reads (the prepared one, or the source itself)
    ep: ResolvedEp
    context_path: Path  # ep.context_file_path: EPs name their blob files after it (inside the staging directory)
    overrides: dict[str, int] = field(default_factory=dict)  # free-dimension overrides (without the prepare step)
    require_compiled: bool = True
    session_config: dict[str, str] = field(default_factory=dict)
    blobs_in_memory: bool = False  # the write callback keeps blobs as bytes instead of files
    in_process: bool = False  # running in the caller's process (compile_to_buffers), not the worker child


def compile_with_ort(request: OrtCompile, make_data_pass: Callable[[], DataPass], on_fallback: Callable[[str], None]) -> tuple[OrtOutput, DataPass]:
    """Compile; retry without the EP-context write callback when the EP does not support it.

    `on_fallback` hears about the retry (and may raise to refuse it).
    """
    ep = request.ep
    if ep.info.compiles and ep_supports_write_callback(ep, recorded=not request.in_process):
        data_pass = make_data_pass()
        try:
            return _attempt(request, data_pass, use_callback=True), data_pass
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
        return _attempt(request, data_pass, use_callback=False), data_pass
    except BaseException:
        data_pass.abandon()
        raise


class _CallbackRefused(Exception):
    pass


def _attempt(request: OrtCompile, data_pass: DataPass, use_callback: bool) -> OrtOutput:
    import onnxruntime as ort

    options = session_options(request.ep, request.overrides, {"ep.context_file_path": str(request.context_path), **request.session_config})
    guard = _CallbackGuard()
    flags = ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED if request.require_compiled else ort.OrtCompileApiFlags.NONE
    sink = BlobSink(None if request.blobs_in_memory else request.context_path.parent) if use_callback else None
    graph = _GraphBuffer()
    try:
        with _model_for_ort(request.source, options, request.in_process) as model, native_stdout_to_stderr():
            compiler = ort.ModelCompiler(
                options,
                model,
                embed_compiled_data_into_model=False,  # we embed ourselves, after checking the size (graphpass)
                flags=flags,
                get_initializer_location_func=guard.wrap(data_pass.location_func),
            )
            if sink is not None:
                compiler.set_ep_context_data_write_func(guard.wrap(sink.write_func))
            _run_interruptibly(lambda: compiler.compile_to_stream(guard.wrap(graph.write)), guard, request.in_process)
    except Exception as exc:
        _raise_translated(exc, guard.error, request.ep, request.source)
    return OrtOutput(graph.buffer.getvalue(), sink)


@contextlib.contextmanager
def _model_for_ort(source: Path, options: Any, in_process: bool) -> Iterator[str | bytes]:
    """How ORT is given the model, so the output does not depend on where the model lives.

    ORT names compiled partitions (and QNN its graphs inside the blob) after a hash of the model path as
    given. In the worker child (a process of its own) the model is opened by its bare file name from its
    own directory. In this process the working directory is not ours to change: the graph is passed as
    bytes, its external data found through ORT's folder option (ORT then hashes the graph's contents).
    """
    if in_process:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(model_dir(source)))
        yield source.read_bytes()
        return
    before = os.getcwd()
    os.chdir(model_dir(source))  # the worker's own process: nothing else runs in it
    try:
        yield source.name
    finally:
        os.chdir(before)  # a --share-weights batch compiles its next model, named relative to it, in the same child


def _run_interruptibly(work: Callable[[], None], guard: _CallbackGuard, in_process: bool) -> None:
    """Run ORT's compile in a worker thread so Ctrl-C/SIGTERM reach the main thread at once.

    ORT releases the GIL while it compiles, but a signal handler only runs in the main thread between
    Python bytecodes: with the compile in the main thread, Ctrl-C would wait for the EP (minutes).
    On interrupt we stop waiting and the guard refuses every later callback, so ORT stops at the next one.

    In the worker child the thread is a daemon: the child leaves through os._exit. In the caller's own
    process (compile_to_buffers) it is not: ORT cannot be stopped inside the EP's compile, so the
    interpreter must wait at exit for that native code to return. Exiting under it (libQnnHtp's static
    destructors freeing the graph a live compile is optimizing) crashed 6 of 8 interrupted runs with
    SIGSEGV or SIGABRT. The wait is on an Event, not Thread.join: Python 3.11's join, interrupted by
    KeyboardInterrupt, marks a running thread as stopped, and the interpreter then exits without it.
    """
    outcome: list[BaseException] = []
    done = threading.Event()

    def target() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the main thread
            outcome.append(exc)
        finally:
            done.set()

    threading.Thread(target=target, name="ortcompile-compile", daemon=not in_process).start()
    try:
        while not done.wait(0.1):
            pass
    except BaseException:
        guard.cancelled = True
        raise
    if outcome:
        raise outcome[0]


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
    missing = diagnose.compile_failure_hint(ep.info, text)
    if missing is not None:  # a driver or device compiler library is not on this machine
        raise ComponentMissing(missing, detail=text) from exc
    if ortmarkers.NOTHING_COMPILED in text:
        raise NothingCompiled(f"{ep.info.short_name}: the EP compiled no nodes", detail=text) from exc
    if ortmarkers.any_in(text, ortmarkers.INVALID_MODEL) and not _cpu_can_load(source):
        raise InvalidModel(f"{source}: ONNX Runtime cannot load this model: {ort_reason(text)}", detail=text) from exc
    refused = ortmarkers.LAYOUT_REFUSED.search(text)
    if refused:
        op, short = refused.group(1), ep.info.short_name
        raise LayoutRefused(f"{short}: compilation failed: {short} refused the NHWC {op} ONNX Runtime's layout transform made for it "
                            f"(a graph no EP can run); keep {op} on the CPU EP: --cpu-nodes op:{op}, or --fallback auto", detail=text,
                            op_type=op) from exc
    # The model itself is fine (the CPU EP loads it): the EP failed while partitioning or compiling it.
    raise CompilationFailed(f"{ep.info.short_name}: compilation failed: {ort_reason(text)}{_switch_hint(source)}", detail=text) from exc


def _switch_hint(source: Path) -> str:
    """Models that switch networks on an input (If on sr == 16000) often compile once specialized: say how."""
    import onnx

    from ortcompile.readback.hints import freeze_suggestion

    try:
        return freeze_suggestion(onnx.load_model(str(source.absolute()), load_external_data=False))
    except Exception:
        return ""  # only a hint: never let it hide the real error


def _cpu_can_load(source: Path) -> bool:
    """Tell a broken model (exit 3) from an EP that cannot handle a valid one (exit 1): only on failure."""
    import onnxruntime as ort

    options = session_options(None, graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    try:
        with native_stdout_to_stderr(quiet_stderr=True):
            ort.InferenceSession(str(source.absolute()), options, providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


def ep_supports_write_callback(ep: ResolvedEp, recorded: bool = True) -> bool:
    """Ask once per process with the one-node model, unless KNOWN_CALLBACK_SUPPORT has this EP's answer (`recorded`):
    ORT refuses an unsupported callback only after loading and partitioning the whole model (3 s and 2.4 GB of RSS
    for a 2.4 GB model), never mind the EP compile. In the caller's own process (compile_to_buffers) it is always
    asked: the probe is also where the EP first starts, under the output redirect, so its banner (QNN prints one to
    stdout) does not reach the program's stdout from a compile an interrupt abandoned (test_buffers' interrupted
    program)."""
    if ep.name not in _CALLBACK_SUPPORT:
        import onnxruntime as ort

        table = KNOWN_CALLBACK_SUPPORT if recorded and ep.info.library is None else {}
        known = table.get((ep.name, ep.version, ort.__version__))
        _CALLBACK_SUPPORT[ep.name] = known if known is not None else ask_write_callback_support(ep)
    return _CALLBACK_SUPPORT[ep.name]


def ask_write_callback_support(ep: ResolvedEp) -> bool:
    """The one-node probe itself (what KNOWN_CALLBACK_SUPPORT records the answers of)."""
    import tempfile

    import onnxruntime as ort

    supported = True
    with tempfile.TemporaryDirectory(prefix="ortcompile-probe-") as scratch:
        options = session_options(ep, config={"ep.context_file_path": str(Path(scratch) / "probe_ctx.onnx")})
        compiler = ort.ModelCompiler(options, tiny_static_model().SerializeToString())
        compiler.set_ep_context_data_write_func(lambda name, data: None)
        try:
            with native_stdout_to_stderr():
                compiler.compile_to_stream(io.BytesIO().write)
        except Exception as exc:  # anything else is for the real compile to report
            supported = not callback_unsupported(exc)
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
        options = session_options(ep, config={"ep.context_file_path": str(Path(scratch) / "probe_ctx.onnx")})
        try:
            with native_stdout_to_stderr():
                compiler = ort.ModelCompiler(options, model.SerializeToString(), flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED)
                compiler.compile_to_stream(io.BytesIO().write)
        except Exception:
            return False
    return True
