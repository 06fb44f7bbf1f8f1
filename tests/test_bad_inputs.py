"""Bad-input corpus (issue 4): hostile, broken and unlucky inputs, each refused cleanly.

Every case runs the real CLI (`ortcompile compile ...` in this process, helpers.run_cli; real onnxruntime, real QNN
EP; the Ctrl-C/SIGTERM cases start `python -m ortcompile` processes) in a fresh workspace whose output directory
already holds a previous good output (compiled with other options than the case uses, so a half-replaced output
would differ byte for byte), and asserts:

* the exit code (2 usage, 3 invalid/unsafe input, 4 output problem, 1 compile failed);
* the one-line message (`ortcompile: error: ...`, click's own option errors included) and its key
  parts (what is wrong, which tensor/node/path, what to do);
* no Python traceback and no "internal error";
* the whole workspace — source model, output directory (names + sizes + sha256 of every entry, hidden ones
  included), anything outside — is byte-for-byte unchanged, and no staging directory is left.

Known bugs are `xfail(strict=True)` with the report in /tmp/ortcompile-bugs/hardening-N.md, so they flip to
XPASS (and fail the run) once fixed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from genmodels import (  # noqa: E402
    FIXTURES,
    STAGE_PREFIX,
    check_published,
    cli_env,
    edit_model,
    epcontext_model,
    error_lines,
    external_mlp,
    finalize_failing_model,
    initializer,
    mlp,
    popen_process,
    run_cli,
    save,
    set_external,
    sized_model,
    snapshot,
    stage_dirs,
)
from helpers import cpu_only_model, published, run_process, without_digest  # noqa: E402

BUGS = "/tmp/ortcompile-bugs"


def bug(n: int, what: str) -> str:
    return f"{BUGS}/hardening-{n}.md: {what}"


# ---------------------------------------------------------------- workspace

@dataclass
class Ws:
    """One case's world: root/src (the model m.onnx + m.onnx.data), root/out (a previous good output),
    root/outside (a directory next to src that a model must not reach)."""

    root: Path
    env: dict[str, str]
    compiled: Callable[[str], Path] | None = None  # ep -> m.onnx compiled with default options, once per module

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def out(self) -> Path:
        return self.root / "out"

    @property
    def outside(self) -> Path:
        return self.root / "outside"

    @property
    def model(self) -> Path:
        return self.src / "m.onnx"

    def edit(self, fn: Callable[[onnx.ModelProto], None], path: Path | None = None) -> Path:
        return edit_model(path or self.model, fn)

    def w0(self, **fields: object) -> Path:
        """Rewrite W0's external_data fields."""
        return self.edit(lambda m: set_external(initializer(m, "W0"), **fields))

    def write(self, name: str, data: bytes) -> Path:
        path = self.src / name
        path.write_bytes(data)
        return path

    def args(self, model: Path | None = None, *extra: object, ep: str = "cpu", force: bool = True, out: Path | None = None) -> list[object]:
        return ["compile", model or self.model, "-o", out or self.out, "--ep", ep, *(["--force"] if force else []), *extra]


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[Ws], list[object]]  # prepares the workspace, returns the CLI arguments
    code: int
    needles: tuple[str, ...]  # substrings of the error line
    click: bool = False  # found by click's option parsing (same one-line format as every other error)
    xfail: str | None = None  # a known bug: the whole case is xfail(strict)
    needs: str | None = None  # "mount", "chattr": skip cleanly where the machine cannot do it
    # Run the CLI as a process of its own: the case is about an environment variable read when an EP's library is
    # registered, which happens once per process (a test process that registered it already would not read it again,
    # and one registered here without it would leave the rest of the process without the EP's device).
    fresh_process: bool = False

    def param(self) -> object:
        marks = [pytest.mark.xfail(strict=True, reason=self.xfail)] if self.xfail else []
        return pytest.param(self, id=self.id, marks=marks)


# ---------------------------------------------------------------- helpers used by the builders

def _mount_tmpfs(ws: Ws, path: Path, size: str, *options: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    opts = ",".join([f"size={size}", *options])
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root/CAP_SYS_ADMIN): {result.stderr.strip()}")
    _MOUNTS.append(path)
    return path


def _bind_read_only(path: Path) -> None:
    for cmd in (["mount", "--bind", str(path), str(path)], ["mount", "-o", "remount,bind,ro", str(path)]):
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot make a read-only bind mount here: {result.stderr.strip()}")
        if cmd[1] == "--bind":
            _MOUNTS.append(path)


def _immutable(path: Path) -> None:
    result = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"chattr +i is not available on this filesystem: {result.stderr.strip()}")
    _IMMUTABLE.append(path)


_MOUNTS: list[Path] = []
_IMMUTABLE: list[Path] = []


def _undo_system_changes() -> None:
    while _IMMUTABLE:
        subprocess.run(["chattr", "-i", str(_IMMUTABLE.pop())], check=False)
    while _MOUNTS:
        subprocess.run(["umount", str(_MOUNTS.pop())], check=False)


def _fill(directory: Path, leave_bytes: int) -> None:
    """Fill a (tmpfs) filesystem so that exactly `leave_bytes` stay free."""
    free = shutil.disk_usage(directory).free
    with open(directory / ".filler", "wb") as stream:
        stream.write(b"\xa5" * max(0, free - leave_bytes))
    assert shutil.disk_usage(directory).free == leave_bytes


def _previous_output(ws: Ws, out: Path) -> None:
    """Compile the good m.onnx into `out` with options that differ from every case (--inline-threshold 0)."""
    result = run_cli("compile", ws.model, "-o", out, "--ep", "cpu", "--inline-threshold", "0", env=ws.env)
    assert result.returncode == 0, result.stderr


def _dynamic(ws: Ws) -> Path:
    shutil.copyfile(FIXTURES / "dynamic.onnx", ws.src / "dyn.onnx")
    return ws.src / "dyn.onnx"


def _static_inline(ws: Ws) -> Path:
    return save(mlp(seed=3), ws.src / "s.onnx")


def _tensor_proto_bytes() -> bytes:
    return numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(8, 8), "t").SerializeToString()


def _model_without_graph() -> bytes:
    model = onnx.ModelProto(ir_version=9, producer_name="x")
    model.opset_import.append(helper.make_opsetid("", 17))
    return model.SerializeToString()


def _graph_without_nodes() -> bytes:
    graph = helper.make_graph([], "empty", [], [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _ir_version_zero(model: onnx.ModelProto) -> None:
    model.ir_version = 0


def _set_op(op: str) -> Callable[[onnx.ModelProto], None]:
    def edit(model: onnx.ModelProto) -> None:
        model.graph.node[0].op_type = op

    return edit


def _cycle(model: onnx.ModelProto) -> None:
    model.graph.node[0].input[0] = "y"


def _dtype(value: int) -> Callable[[onnx.ModelProto], None]:
    def edit(model: onnx.ModelProto) -> None:
        initializer(model, "W0").data_type = value

    return edit


def _type_mismatch(ws: Ws) -> list[object]:
    """Inline int64 W0 into a float MatMul: the graph proto is fine, ONNX Runtime's type check is not."""
    model = mlp()
    initializer(model, "W0").CopyFrom(numpy_helper.from_array(np.zeros((64, 64), np.int64), "W0"))
    return ws.args(save(model, ws.src / "t.onnx"))


def _negative_dim(model: onnx.ModelProto) -> None:
    initializer(model, "W0").dims[0] = -64


def _symlink_loop(ws: Ws) -> list[object]:
    os.symlink("loop.data", ws.src / "loop.data")
    ws.w0(location="loop.data")
    return ws.args()


def _symlink_file_out(ws: Ws) -> list[object]:
    ws.outside.mkdir()
    shutil.copyfile(ws.src / "m.onnx.data", ws.outside / "secret.data")
    os.symlink(ws.outside / "secret.data", ws.src / "link.data")
    ws.w0(location="link.data")
    return ws.args()


def _symlink_dir_out(ws: Ws) -> list[object]:
    ws.outside.mkdir()
    shutil.copyfile(ws.src / "m.onnx.data", ws.outside / "m.onnx.data")
    os.symlink("../outside", ws.src / "weights")
    ws.w0(location="weights/m.onnx.data")
    return ws.args()


def _epcontext(cache: bytes) -> Callable[[Ws], list[object]]:
    def build(ws: Ws) -> list[object]:
        ws.outside.mkdir()
        (ws.outside / "secret.bin").write_bytes(b"\0" * 64)
        return ws.args(epcontext_model(ws.src / "c.onnx", cache), ep="qnn")

    return build


def _epcontext_symlink(ws: Ws) -> list[object]:
    ws.outside.mkdir()
    (ws.outside / "secret.bin").write_bytes(b"\0" * 64)
    os.symlink(ws.outside / "secret.bin", ws.src / "blob.bin")
    return ws.args(epcontext_model(ws.src / "c.onnx", b"blob.bin"), ep="qnn")


def _invalid_utf8_location(ws: Ws) -> list[object]:
    """The location bytes are not UTF-8 (protobuf proto2 strings may hold anything; python protobuf then returns bytes)."""
    data = ws.model.read_bytes()
    assert data.count(b"m.onnx.data") >= 2
    bad = b"m\xdf.onnx.dat"  # 0xDF opens a 2-byte UTF-8 sequence that "." does not continue
    assert len(bad) == len(b"m.onnx.data")  # same length: the protobuf stays well-formed
    ws.model.write_bytes(data.replace(b"m.onnx.data", bad))
    return ws.args()


def _fifo(ws: Ws) -> list[object]:
    os.mkfifo(ws.src / "pipe.data")
    ws.w0(location="pipe.data")
    return ws.args()


def _location_is_dir(ws: Ws) -> list[object]:
    (ws.src / "sub").mkdir()
    ws.w0(location="sub")
    return ws.args()


def _short_data(ws: Ws) -> list[object]:
    data = ws.src / "m.onnx.data"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    return ws.args()


def _offset_past_eof(ws: Ws) -> list[object]:
    ws.w0(offset=(ws.src / "m.onnx.data").stat().st_size)
    return ws.args()


def _missing_data(ws: Ws) -> list[object]:
    (ws.src / "m.onnx.data").unlink()
    return ws.args()


def _out_is_file(ws: Ws) -> list[object]:
    (ws.root / "afile").write_text("not a directory\n")
    return ws.args(out=ws.root / "afile")


def _out_parent_is_file(ws: Ws) -> list[object]:
    (ws.root / "afile").write_text("not a directory\n")
    return ws.args(out=ws.root / "afile" / "build")


def _out_read_only(ws: Ws) -> list[object]:
    _bind_read_only(ws.out)
    return ws.args()


def _out_read_only_new_subdir(ws: Ws) -> list[object]:
    _bind_read_only(ws.out)
    return ws.args(out=ws.out / "sub")


def _out_read_only_tmpfs(ws: Ws) -> list[object]:
    mnt = _mount_tmpfs(ws, ws.root / "rofs", "1m", "ro")
    return ws.args(out=mnt)


def _out_immutable(ws: Ws) -> list[object]:
    _immutable(ws.out)
    return ws.args()


def _old_model_immutable(ws: Ws) -> list[object]:
    """The previous model file cannot be replaced (chattr +i; as non-root: owned by someone else in a sticky
    directory). Publishing must fail before it replaces anything — not after moving the new data file in."""
    _immutable(ws.out / "m_ctx.onnx")
    return ws.args()


def _dest_name_is_dir(name: str) -> Callable[[Ws], list[object]]:
    def build(ws: Ws) -> list[object]:
        shutil.rmtree(ws.out)
        (ws.out / (_published_data(ws) if name == "data" else name)).mkdir(parents=True)
        return ws.args()

    return build


def _published_data(ws: Ws) -> str:
    """The content-addressed name the case's compile publishes m.onnx's data under (`m_ctx.<digest>.data`)."""
    assert ws.compiled is not None
    return published(ws.compiled("cpu"), "m_ctx.onnx.data")


def _overwrite_via_symlink(ws: Ws) -> list[object]:
    """-o is the source directory and the input `r.onnx` is a symlink to `r_ctx.onnx`: the output model name."""
    save(mlp(seed=4), ws.src / "r_ctx.onnx")
    os.symlink("r_ctx.onnx", ws.src / "r.onnx")
    return ws.args(ws.src / "r.onnx", out=ws.src, force=True)


def _input_data_named_like(data_name: str, stem: str = "m", ep: str = "cpu", *extra: str) -> Callable[[Ws], list[object]]:
    """The input's external data file has the name of one of our outputs, and -o is the input's directory."""

    def build(ws: Ws) -> list[object]:
        model = external_mlp(ws.root / "in", name=stem, data=data_name, seed=6)
        return ws.args(model, *extra, ep=ep, out=model.parent, force=True)

    return build


def _exists_without_force(ws: Ws) -> list[object]:
    return ws.args(force=False)


def _tmpfs_with_previous(ws: Ws, size: str = "2m") -> Path:
    """A small tmpfs holding m.onnx's previous output: the files the template compiled into out/ with
    _previous_output, copied (the bytes a compile of the same model and options writes, without compiling again)."""
    mnt = _mount_tmpfs(ws, ws.root / "small", size)
    manifest = ws.out / "m_ctx.manifest.json"
    for name in [*(f["name"] for f in json.loads(manifest.read_text())["files"]), manifest.name]:
        shutil.copyfile(ws.out / name, mnt / name)
    check_published(mnt, "m")
    return mnt


def _disk_full(ws: Ws) -> list[object]:
    mnt = _tmpfs_with_previous(ws)
    _fill(mnt, 0)
    return ws.args(out=mnt)


def _larger_than_tmpfs(ws: Ws) -> list[object]:
    mnt = _tmpfs_with_previous(ws, "4m")
    big = sized_model(ws.src, "m", 6)  # 6 MiB of weights, replaces m.onnx + m.onnx.data
    return ws.args(big, out=mnt)


def _vtcm(ws: Ws) -> list[object]:
    shutil.copyfile(FIXTURES / "split.onnx", ws.src / "split.onnx")
    return ws.args(ws.src / "split.onnx", "--ep-option", "vtcm_mb=100000", ep="qnn")


def _without_openvino(ws: Ws, ep: str) -> list[object]:
    if importlib.util.find_spec("onnxruntime_ep_openvino") is not None:
        pytest.skip("onnxruntime-ep-openvino is installed here; this case is about a machine without it")
    return ws.args(ep=ep)


def _finalize_fails(ws: Ws) -> list[object]:
    return ws.args(finalize_failing_model(ws.src / "f.onnx"), ep="qnn")


_WEBGPU_INSTALLED = importlib.util.find_spec("onnxruntime_ep_webgpu") is not None
# Installed (onnxruntime-ep-webgpu 0.4.0): without a GPU it claims no device unless the software adapter is allowed.
_WEBGPU_NEEDLES = ("webgpu", "claims no device", "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1") if _WEBGPU_INSTALLED else ("pip install onnxruntime-ep-webgpu",)


def _webgpu(ws: Ws) -> list[object]:
    ws.env.pop("ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER", None)
    return ws.args(ep="webgpu")


def _same_stem_twice(ws: Ws) -> list[object]:
    a = save(mlp(seed=1), ws.root / "a" / "m.onnx")
    b = save(mlp(seed=2), ws.root / "b" / "m.onnx")
    return ["compile", a, b, "-o", ws.out, "--ep", "cpu", "--force"]


def _stray_output_name(ws: Ws) -> list[object]:
    """A file of ours by name (m_ctx.<digest>.data) but not of any output (no manifest, no model): without --force
    it must not be overwritten."""
    shutil.rmtree(ws.out)
    ws.out.mkdir()
    (ws.out / _published_data(ws)).write_text("the user's own file\n")
    return ws.args(force=False)


def _new_out_dir_compile_fails(ws: Ws) -> list[object]:
    return ws.args(_cpu_only(ws), ep="qnn", out=ws.root / "new" / "build")


def _cpu_only(ws: Ws) -> Path:
    return cpu_only_model(ws.src / "c.onnx")


# ---------------------------------------------------------------- the corpus

def m(ws: Ws) -> Path:
    return ws.model


CASES: list[Case] = [
    # ---- the input file itself
    Case("input-is-a-directory", lambda ws: ws.args(ws.src), 3, ("is a directory, not a model: give one of its models",)),
    Case("input-missing", lambda ws: ws.args(ws.src / "nope.onnx"), 3, ("nope.onnx", "no such file")),
    Case("empty-file", lambda ws: ws.args(ws.write("e.onnx", b"")), 3, ("e.onnx", "empty file")),
    Case("random-bytes", lambda ws: ws.args(ws.write("r.onnx", np.random.default_rng(1).bytes(4096))), 3, ("r.onnx", "not a valid ONNX model")),
    Case("truncated-protobuf", lambda ws: ws.args(ws.write("t.onnx", ws.model.read_bytes()[:-7])), 3, ("t.onnx", "not a valid ONNX model")),
    Case("truncated-inline-weights", lambda ws: ws.args(ws.write("t.onnx", mlp(width=128).SerializeToString()[:40000])), 3,
         ("t.onnx", "not a valid ONNX model")),
    Case("tensorproto-not-a-model", lambda ws: ws.args(ws.write("t.onnx", _tensor_proto_bytes())), 3, ("t.onnx", "ONNX model")),
    Case("graphproto-not-a-model", lambda ws: ws.args(ws.write("g.onnx", mlp().graph.SerializeToString())), 3,
         ("g.onnx", "not an ONNX model with a graph")),
    Case("model-without-graph", lambda ws: ws.args(ws.write("n.onnx", _model_without_graph())), 3, ("n.onnx", "not an ONNX model with a graph")),
    Case("graph-without-nodes", lambda ws: ws.args(ws.write("n.onnx", _graph_without_nodes())), 3, ("n.onnx", "not an ONNX model with a graph")),
    Case("ir-version-zero", lambda ws: ws.args(ws.edit(_ir_version_zero)), 3, ("m.onnx", "not an ONNX model")),
    # ---- external data: missing, short, inconsistent
    Case("missing-external-data-file", _missing_data, 3, ("external data file 'm.onnx.data'", "'W0'", "missing")),
    Case("short-external-data-file", _short_data, 3, ("'W", "needs bytes up to", "'m.onnx.data'", "has only")),
    Case("offset-past-eof", _offset_past_eof, 3, ("'W0'", "needs bytes up to", "has only")),
    Case("huge-offset", lambda ws: ws.args(ws.w0(offset=2**64)), 3, ("'W0'", f"needs bytes up to {2**64 + 16384}")),
    Case("length-disagrees-with-shape", lambda ws: ws.args(ws.w0(length=100)), 3,
         ("'W0'", "external length 100", "[64, 64]", "FLOAT", "16384 bytes")),
    Case("huge-length", lambda ws: ws.args(ws.w0(length=2**64)), 3, ("'W0'", f"external length {2**64}", "16384 bytes")),
    Case("negative-offset", lambda ws: ws.args(ws.w0(offset=-4096)), 3, ("'W0'", "negative external offset")),
    Case("negative-length", lambda ws: ws.args(ws.w0(length=-5)), 3, ("'W0'", "length")),
    Case("non-numeric-offset", lambda ws: ws.args(ws.w0(offset="0x10")), 3, ("'W0'", "non-numeric external offset")),
    Case("external-without-location", lambda ws: ws.args(ws.w0(location=None)), 3, ("'W0'", "no location")),
    Case("location-is-a-directory", _location_is_dir, 3, ("'sub'", "'W0'")),
    Case("location-is-a-fifo", _fifo, 3, ("'pipe.data'", "'W0'")),  # must not block reading a FIFO
    Case("unknown-tensor-dtype", lambda ws: ws.args(ws.edit(_dtype(99))), 3, ("'W0'",)),
    Case("negative-dimension", lambda ws: ws.args(ws.edit(_negative_dim)), 3, ("'W0'", "-64")),
    # ---- unsafe paths in the input
    Case("absolute-location", lambda ws: ws.args(ws.w0(location=str(ws.src / "m.onnx.data"))), 3,
         ("initializer 'W0'", "absolute external data path", "m.onnx.data")),
    Case("absolute-location-etc-passwd", lambda ws: ws.args(ws.w0(location="/etc/passwd", offset=0, length=16384)), 3,
         ("initializer 'W0'", "absolute", "/etc/passwd")),
    Case("dotdot-location", lambda ws: ws.args(ws.w0(location="../src/m.onnx.data")), 3, ("initializer 'W0'", "'..'", "../src/m.onnx.data")),
    Case("dotdot-inside-location", lambda ws: ws.args(ws.w0(location="a/../../etc/passwd")), 3, ("initializer 'W0'", "'..'")),
    Case("symlinked-file-escaping", _symlink_file_out, 3, ("initializer 'W0'", "'link.data'", "resolves outside the model's directory")),
    Case("symlinked-dir-escaping", _symlink_dir_out, 3, ("initializer 'W0'", "'weights/m.onnx.data'", "resolves outside")),
    Case("nul-byte-in-location", lambda ws: ws.args(ws.w0(location="m.onnx.data\0.txt")), 3, ("initializer 'W0'", "NUL byte")),
    Case("symlink-loop-location", _symlink_loop, 3, ("'W0'", "loop.data")),
    Case("overlong-location", lambda ws: ws.args(ws.w0(location="x" * 5000)), 3, ("'W0'", "File name too long")),
    Case("epcontext-dotdot-path", _epcontext(b"../outside/secret.bin"), 3, ("EPContext node 'ctx0'", "'..'", "../outside/secret.bin")),
    Case("epcontext-absolute-path", _epcontext(b"/etc/passwd"), 3, ("EPContext node 'ctx0'", "absolute EP context path", "/etc/passwd")),
    Case("epcontext-symlink-escaping", _epcontext_symlink, 3, ("EPContext node 'ctx0'", "'blob.bin'", "resolves outside")),
    Case("epcontext-path-overlong", _epcontext(b"x" * 5000), 3, ("EPContext node 'ctx0'",)),  # found by test_fuzz (hardening-18)
    Case("location-invalid-utf8", _invalid_utf8_location, 3, ("'W0'", "UTF-8")),  # found by test_fuzz (hardening-18)
    Case("epcontext-missing-blob", _epcontext(b"nothere.bin"), 3, ("'nothere.bin'", "ctx0")),
    # ---- models ONNX Runtime refuses to load
    Case("unknown-operator", lambda ws: ws.args(ws.edit(_set_op("FooBar"))), 3, ("m.onnx", "ONNX Runtime cannot load this model", "FooBar")),
    Case("type-mismatch", _type_mismatch, 3, ("t.onnx", "ONNX Runtime cannot load this model", "Type Error")),
    Case("graph-with-a-cycle", lambda ws: ws.args(ws.edit(_cycle)), 3, ("ONNX Runtime cannot load this model", "not acyclic")),
    # ---- execution providers
    Case("unknown-ep", lambda ws: ws.args(ep="tpu"), 2, ("unknown execution provider 'tpu'", "qnn", "ortcompile eps")),
    Case("ep-openvino-not-installed", lambda ws: _without_openvino(ws, "openvino"), 2, ("pip install onnxruntime-ep-openvino",)),
    Case("ep-webgpu-not-installed-or-no-device", _webgpu, 2, _WEBGPU_NEEDLES, fresh_process=True),
    Case("ep-refuses-bad-option-value", lambda ws: ws.args(m(ws), "--ep-option", "soc_model=99999", "--allow-partial", ep="qnn"), 2,
         ("qnn", "refused --ep-option soc_model=99999", "QNN_DEVICE_ERROR_INVALID_CONFIG")),
    Case("ep-full-name-not-installed", lambda ws: _without_openvino(ws, "OpenVINOExecutionProvider"), 2, ("onnxruntime-ep-openvino",)),
    Case("ep-option-without-equals", lambda ws: ws.args(m(ws), "--ep-option", "backend_path", ep="qnn"), 2,
         ("'--ep-option'", "'backend_path'", "KEY=VALUE")),
    Case("ep-option-empty-key", lambda ws: ws.args(m(ws), "--ep-option", "=burst", ep="qnn"), 2, ("'--ep-option'", "'=burst'")),
    Case("ep-option-misspelled-key", lambda ws: ws.args(m(ws), "--ep-option", "htp_performace_mode=burst", ep="qnn"), 2,
         ("htp_performace_mode",)),
    Case("ep-needs-static-shapes", lambda ws: ws.args(_dynamic(ws), ep="qnn"), 2,
         ("qnn compiles static shapes only", "x[batch,256]", "--fix-dim batch=N")),
    Case("ep-compiles-nothing", lambda ws: ws.args(_cpu_only(ws), ep="qnn"), 1, ("qnn: the EP took none of this model's nodes", "--allow-partial")),
    Case("ep-refuses-value-it-fails-on", _vtcm, 2, ("qnn: QNNExecutionProvider refused --ep-option vtcm_mb=100000", "QNN_GRAPH_ERROR")),
    Case("ep-graph-finalize-fails", _finalize_fails, 1, ("qnn: compilation failed",)),
    # ---- --fix-dim / --fix-shape
    Case("fix-dim-without-equals", lambda ws: ws.args(_dynamic(ws), "--fix-dim", "batch", ep="qnn"), 2, ("'--fix-dim'", "'batch'", "NAME=VALUE")),
    Case("fix-dim-not-an-integer", lambda ws: ws.args(_dynamic(ws), "--fix-dim", "batch=1.5", ep="qnn"), 2, ("'1.5' is not a whole number",)),
    Case("fix-dim-zero", lambda ws: ws.args(_dynamic(ws), "--fix-dim", "batch=0", ep="qnn"), 2, ("batch=0", "must be positive")),
    Case("fix-dim-negative", lambda ws: ws.args(_dynamic(ws), "--fix-dim", "batch=-2", ep="qnn"), 2, ("batch=-2", "must be positive")),
    Case("fix-dim-too-large", lambda ws: ws.args(_dynamic(ws), "--fix-dim", f"batch={2**64}", ep="qnn"), 2, ("batch",)),
    Case("fix-dim-unknown-name", lambda ws: ws.args(_dynamic(ws), "--fix-dim", "seq=4", ep="qnn"), 2,
         ("no symbolic dimension 'seq'", "(it has: batch)")),
    Case("fix-dim-on-static-model", lambda ws: ws.args(_static_inline(ws), "--fix-dim", "batch=1", ep="qnn"), 2, ("(it has: none)",)),
    Case("fix-shape-without-equals", lambda ws: ws.args(_dynamic(ws), "--fix-shape", "x", ep="qnn"), 2, ("bad --fix-shape 'x'",)),
    Case("fix-shape-unknown-input", lambda ws: ws.args(_dynamic(ws), "--fix-shape", "z=1,256", ep="qnn"), 2, ("no input 'z'", "(it has: x)")),
    Case("fix-shape-wrong-rank", lambda ws: ws.args(_dynamic(ws), "--fix-shape", "x=1,256,1", ep="qnn"), 2, ("rank 2, not 3",)),
    Case("fix-shape-contradicts-fixed-dim", lambda ws: ws.args(_dynamic(ws), "--fix-shape", "x=1,128", ep="qnn"), 2,
         ("dimension 1 is fixed at 256, not 128",)),
    Case("fix-shape-not-an-integer", lambda ws: ws.args(_dynamic(ws), "--fix-shape", "x=a,256", ep="qnn"), 2, ("'a' is not a whole number",)),
    Case("fix-shape-zero", lambda ws: ws.args(_dynamic(ws), "--fix-shape", "x=0,256", ep="qnn"), 2, ("must be positive",)),
    Case("fix-shape-vs-fix-dim", lambda ws: ws.args(_dynamic(ws), "--fix-dim", "batch=1", "--fix-shape", "x=2,256", ep="qnn"), 2,
         ("dimension 'batch' is already fixed to 1",)),
    # ---- layout options
    Case("align-not-power-of-two", lambda ws: ws.args(m(ws), "--align", "3"), 2, ("--align must be a power of two, got 3",)),
    Case("align-zero", lambda ws: ws.args(m(ws), "--align", "0"), 2, ("--align must be a power of two, got 0",)),
    Case("align-bad-size", lambda ws: ws.args(m(ws), "--align", "4X"), 2, ("'--align'", "'4X' is not a size"), click=True),
    Case("shard-size-zero", lambda ws: ws.args(m(ws), "--shard-size", "0"), 2, ("--shard-size must be a positive size",)),
    Case("shard-size-fraction", lambda ws: ws.args(m(ws), "--shard-size", "1.5G"), 2, ("'--shard-size'", "'1.5G' is not a size"), click=True),
    Case("inline-threshold-negative", lambda ws: ws.args(m(ws), "--inline-threshold", "-1"), 2, ("'--inline-threshold'", "'-1' is not a size"),
         click=True),
    Case("align-threshold-negative", lambda ws: ws.args(m(ws), "--align-threshold", "-1"), 2, ("'--align-threshold'",), click=True),
    Case("embed-unknown-mode", lambda ws: ws.args(m(ws), "--embed", "sometimes"), 2, ("'--embed'", "'sometimes'"), click=True),
    Case("missing-output-dir", lambda ws: ["compile", ws.model, "--ep", "cpu"], 2, ("compile: missing option '-o'",), click=True),
    # ---- the destination
    Case("output-exists-without-force", _exists_without_force, 4, ("m_ctx.", "already exists", "--force")),
    Case("output-path-is-a-file", _out_is_file, 4, ("afile", "is a file, not a directory")),
    Case("output-parent-is-a-file", _out_parent_is_file, 4, ("afile/build", "Not a directory")),
    Case("output-dir-read-only-mount", _out_read_only, 4, ("cannot write output directory", "choose a writable -o"), needs="mount"),
    Case("output-subdir-on-read-only-mount", _out_read_only_new_subdir, 4, ("read-only filesystem", "choose a writable -o"), needs="mount"),
    Case("output-on-read-only-tmpfs", _out_read_only_tmpfs, 4, ("choose a writable -o",), needs="mount"),
    Case("output-dir-immutable", _out_immutable, 4, ("cannot write output directory", "choose a writable -o"), needs="chattr"),
    Case("previous-model-cannot-be-replaced", _old_model_immutable, 4, ("choose a writable -o",), needs="chattr"),
    Case("output-model-name-is-a-directory", _dest_name_is_dir("m_ctx.onnx"), 4, ("Is a directory",)),
    Case("output-manifest-name-is-a-directory", _dest_name_is_dir("m_ctx.manifest.json"), 4, ("Is a directory",)),
    Case("output-data-name-is-a-directory", _dest_name_is_dir("data"), 4, ("Is a directory",)),
    Case("output-would-overwrite-input-symlink", _overwrite_via_symlink, 4, ("would overwrite the input", "r.onnx", "choose another -o")),
    Case("output-would-overwrite-input-manifest-name", _input_data_named_like("m_ctx.manifest.json"), 4, ("would overwrite the input",)),
    Case("output-would-overwrite-input-data", _input_data_named_like("m_ctx.onnx.data"), 4, ("would overwrite the input", "m_ctx.onnx.data")),
    Case("output-would-overwrite-input-qnn-blob", _input_data_named_like("m_ctx_qnn.bin", "m", "qnn", "--embed", "never"), 4,
         ("would overwrite the input", "m_ctx_qnn.bin")),
    Case("stray-file-with-an-output-name", _stray_output_name, 4, ("m_ctx.", ".data already exists", "--force")),
    Case("same-output-twice-in-one-command", _same_stem_twice, 2, ("m_ctx.onnx",)),
    Case("failed-compile-leaves-no-new-output-dir", _new_out_dir_compile_fails, 1, ("took none of this model's nodes",)),
    # ---- no space
    Case("disk-full", _disk_full, 4, ("no space left on the device", "free some space or choose another -o"), needs="mount"),
    Case("model-larger-than-filesystem", _larger_than_tmpfs, 4, ("no space left on the device",), needs="mount"),
]


def test_corpus_size() -> None:
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """src/ with the good model and out/ with its previous output (+ a QNN output with a blob, + a hidden file)."""
    root = tmp_path_factory.mktemp("template")
    env = cli_env({"XDG_CACHE_HOME": str(root / "xdg-cache")})
    ws = Ws(root, env)
    external_mlp(ws.src, name="m", seed=0)
    _previous_output(ws, ws.out)
    shutil.copyfile(FIXTURES / "split.onnx", root / "split.onnx")
    result = run_cli("compile", root / "split.onnx", "-o", ws.out, "--ep", "qnn", "--embed", "never", env=env)
    assert result.returncode == 0, result.stderr
    (root / "split.onnx").unlink()
    (ws.out / ".hidden-user-file").write_text("kept\n")
    published(ws.out, "split_ctx_qnn.bin")
    return root


@pytest.fixture(scope="module")
def compiled_m(template: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """ep -> a directory with the template's m.onnx compiled for that EP with default options, compiled on first use
    and shared by the module (tests copy it: the same bytes as compiling the same model again)."""
    root = tmp_path_factory.mktemp("compiled-m")
    done: dict[str, Path] = {}

    def get(ep: str) -> Path:
        if ep not in done:
            result = run_cli("compile", template / "src" / "m.onnx", "-o", root / ep, "--ep", ep, env=cli_env({"XDG_CACHE_HOME": str(root / ".x")}))
            assert result.returncode == 0, result.stderr
            done[ep] = root / ep
        return done[ep]

    return get


@pytest.fixture
def ws(template: Path, compiled_m: Callable[[str], Path], tmp_path: Path):
    root = tmp_path / "ws"
    shutil.copytree(template, root, symlinks=True, ignore=shutil.ignore_patterns("xdg-cache"))
    workspace = Ws(root, cli_env({"XDG_CACHE_HOME": str(tmp_path / "xdg-cache")}), compiled_m)
    try:
        yield workspace
    finally:
        _undo_system_changes()


def _assert_error(result: subprocess.CompletedProcess[str], case: Case) -> str:
    where = f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    assert result.returncode == case.code, where
    assert "Traceback" not in result.stderr + result.stdout, where
    assert "internal error" not in result.stderr, where
    assert result.stdout == "", where
    lines = error_lines(result.stderr)
    assert lines, where
    last = lines[-1]
    assert last.startswith("ortcompile: error: "), where  # click's own usage errors too (issue 15)
    assert len(lines) == 1, f"more than the one error line on stderr:\n{result.stderr}"
    for needle in case.needles:
        assert needle in last, f"{needle!r} not in {last!r}"
    return last


def _walk_stages(root: Path) -> list[str]:
    return [str(p) for p in root.rglob(STAGE_PREFIX + "*")]


@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_bad_input(case: Case, ws: Ws) -> None:
    args = case.build(ws)
    before = snapshot(ws.root)
    result = (run_process if case.fresh_process else run_cli)(*args, env=ws.env, timeout=240)
    after = snapshot(ws.root)
    _undo_system_changes()  # before asserting, so a failed assert leaves nothing mounted
    _assert_error(result, case)
    changed = {k: (before.get(k), after.get(k)) for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)}
    assert not changed, f"the workspace changed: {changed}"
    assert not _walk_stages(ws.root)


def test_ep_failure_detail_with_verbose(ws: Ws) -> None:
    """-v adds the EP's own words after the one line (the value is refused when the EP is probed, before compiling)."""
    result = run_cli(*_vtcm(ws), "-v", env=ws.env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "ortcompile: error: qnn: QNNExecutionProvider refused --ep-option vtcm_mb=100000" in result.stderr
    assert "qnn_model_wrapper" in result.stderr and "CreateQnnGraph" in result.stderr


# ---------------------------------------------------------------- disk full at every step

def _pages(size: int) -> int:
    return -(-size // 4096)


@pytest.fixture(scope="module")
def output_sizes(compiled_m: Callable[[str], Path]) -> dict[str, int]:
    """File sizes of a good compile of m.onnx with default options (the case's compile), by name without digest."""
    return {without_digest(p.name): p.stat().st_size for p in compiled_m("cpu").iterdir() if p.is_file()}


FULL_AT = {  # which write meets the full disk: number of free 4 KiB pages, from the output's file sizes
    "data-first-byte": lambda s: 0,
    "data-middle": lambda s: _pages(s["m_ctx.data"]) // 2,
    "graph": lambda s: _pages(s["m_ctx.data"]),
    "manifest": lambda s: _pages(s["m_ctx.data"]) + _pages(s["m_ctx.onnx"]),
    "journal": lambda s: _pages(s["m_ctx.data"]) + _pages(s["m_ctx.onnx"]) + _pages(s["m_ctx.manifest.json"]),
}


@pytest.mark.parametrize("step", list(FULL_AT))
def test_disk_full_at_each_write(step: str, ws: Ws, output_sizes: dict[str, int]) -> None:
    """Free space ends during the data file, the graph, the manifest or the publish journal: always exit 4 with
    the no-space message, the previous output intact, no stage left; with one more page free it succeeds."""
    try:
        mnt = _tmpfs_with_previous(ws, "1m")
        free_pages = FULL_AT[step](output_sizes)
        _fill(mnt, free_pages * 4096)
        before = snapshot(ws.root)
        result = run_cli(*ws.args(out=mnt), env=ws.env)
        after = snapshot(ws.root)
        assert result.returncode == 4, result.stderr
        line = _assert_error(result, Case(step, lambda w: [], 4, ("no space left on the device", "free some space or choose another -o")))
        assert before == after, line
        assert not stage_dirs(mnt)
        # the budget is tight, not generous: the whole output fits once the filler is gone
        (mnt / ".filler").unlink()
        result = run_cli(*ws.args(out=mnt), env=ws.env)
        assert result.returncode == 0, result.stderr
        check_published(mnt, "m")
    finally:
        _undo_system_changes()


def test_disk_full_budget_is_tight(ws: Ws, output_sizes: dict[str, int]) -> None:
    """The 'journal' budget is one page short: one more page and the compile succeeds (so the steps above are the real
    boundaries of this output, not an arbitrary number)."""
    try:
        mnt = _tmpfs_with_previous(ws, "1m")
        _fill(mnt, (FULL_AT["journal"](output_sizes) + 1) * 4096)
        result = run_cli(*ws.args(out=mnt), env=ws.env)
        assert result.returncode == 0, result.stderr
        check_published(mnt, "m")
    finally:
        _undo_system_changes()


# ---------------------------------------------------------------- what users do that must simply work

def test_paths_with_spaces_and_unicode(tmp_path: Path) -> None:
    src = tmp_path / "mödels with spaces" / "ünïcode ☃"
    model = external_mlp(src, name="my model ☃", data="wéights of my model.bin")
    out = tmp_path / "build dir" / "out ☃"
    env = cli_env({"XDG_CACHE_HOME": str(tmp_path / "x")})
    before = snapshot(src)
    result = run_cli("compile", model, "-o", out, "--ep", "cpu", env=env)
    assert result.returncode == 0, result.stderr
    assert snapshot(src) == before
    check_published(out, "my model ☃")
    result = run_cli("compile", model, "-o", out, "--ep", "qnn", "--force", "--embed", "never", env=env)
    assert result.returncode == 0, result.stderr
    manifest = check_published(out, "my model ☃")
    assert any(f["role"] == "ep_context" for f in manifest["files"])
    assert not stage_dirs(out)


def test_output_into_the_source_directory(tmp_path: Path) -> None:
    """-o being the model's own directory is fine: <stem>_ctx.* never collides with <stem>.onnx(.data)."""
    model = external_mlp(tmp_path / "d")
    before = {n: (tmp_path / "d" / n).read_bytes() for n in os.listdir(tmp_path / "d")}
    result = run_cli("compile", model, "-o", model.parent, "--ep", "cpu", env=cli_env({"XDG_CACHE_HOME": str(tmp_path / "x")}))
    assert result.returncode == 0, result.stderr
    assert {n: (tmp_path / "d" / n).read_bytes() for n in before} == before
    check_published(model.parent, "m")


def test_external_data_without_length_is_accepted(tmp_path: Path) -> None:
    """`length` is optional in ONNX: the tensor's own size is used (and checked against the file)."""
    model = external_mlp(tmp_path / "d")
    edit_model(model, lambda mp: [set_external(t, length=None) for t in mp.graph.initializer if t.external_data])
    result = run_cli("compile", model, "-o", tmp_path / "o", "--ep", "cpu", env=cli_env({"XDG_CACHE_HOME": str(tmp_path / "x")}))
    assert result.returncode == 0, result.stderr
    check_published(tmp_path / "o", "m")


def test_huggingface_cache_layout_is_refused_with_advice(tmp_path: Path) -> None:
    """Hub caches store snapshots/<rev>/model.onnx and model.onnx.data as symlinks into blobs/<sha>. ONNX Runtime loads
    that, but the data's real path leaves the directory the model path names, which issue 4 says to refuse: exit 3,
    naming the tensor, the location and where it really leads, and saying what to do (lead's decision, hardening-7)."""
    made = external_mlp(tmp_path / "tmp")
    blobs, snap = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "rev1"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    shutil.move(made, blobs / "a1b2")
    shutil.move(made.with_name("m.onnx.data"), blobs / "c3d4")
    os.symlink("../../blobs/a1b2", snap / "m.onnx")
    os.symlink("../../blobs/c3d4", snap / "m.onnx.data")
    before = snapshot(tmp_path / "hub")
    result = run_cli("compile", snap / "m.onnx", "-o", tmp_path / "o", "--ep", "cpu", env=cli_env({"XDG_CACHE_HOME": str(tmp_path / "x")}))
    line = _assert_error(result, Case("hf", lambda w: [], 3, ("'m.onnx.data'", "resolves outside the model's directory", str(blobs / "c3d4"),
                                                                "copy or hard-link")))
    assert "'W" in line
    assert snapshot(tmp_path / "hub") == before
    assert not (tmp_path / "o").exists()
    # the advice works: hard-link the files into one directory and it compiles
    flat = tmp_path / "flat"
    flat.mkdir()
    os.link(blobs / "a1b2", flat / "m.onnx")
    os.link(blobs / "c3d4", flat / "m.onnx.data")
    result = run_cli("compile", flat / "m.onnx", "-o", tmp_path / "o", "--ep", "cpu", env=cli_env({"XDG_CACHE_HOME": str(tmp_path / "x")}))
    assert result.returncode == 0, result.stderr
    check_published(tmp_path / "o", "m")


def test_symlinked_model_data_beside_the_link(tmp_path: Path) -> None:
    """models/m.onnx -> store/m.onnx, and models/m.onnx.data is a different file: ORT reads the one beside the link,
    so that is the one ortcompile must check (it checks store/m.onnx.data and passes, then ORT fails, exit 1)."""
    store = external_mlp(tmp_path / "store", seed=1)
    models = tmp_path / "models"
    models.mkdir()
    os.symlink(store, models / "m.onnx")
    (models / "m.onnx.data").write_bytes(b"\0" * 100)  # short: the model needs 32 KiB
    result = run_cli("compile", models / "m.onnx", "-o", tmp_path / "o", "--ep", "cpu", env=cli_env({"XDG_CACHE_HOME": str(tmp_path / "x")}))
    assert "Traceback" not in result.stderr
    assert result.returncode == 3, result.stderr
    assert "m.onnx.data" in error_lines(result.stderr)[-1]


# ---------------------------------------------------------------- Ctrl-C and SIGTERM mid-compile

@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory):
    """~400 MB: QNN compiles it in ~6-8 s, the CPU EP lays out its weights in ~2 s (measured on the 2-core box)."""
    import bigmodel

    root = tmp_path_factory.mktemp("slow")
    model = bigmodel.write_qnn_model(root, name="slow", partitions=2, layers_per_partition=3, width=4096)
    yield model.path
    model.remove()


@pytest.fixture(scope="module")
def slow_previous_output(slow_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """slow_model compiled for the CPU EP with every weight in the data file: the previous output each interrupted
    run must leave as it was. Compiled once; each case replaces its own copy (the same bytes, which is what it checks)."""
    root = tmp_path_factory.mktemp("slow-previous")
    result = run_cli("compile", slow_model, "-o", root / "out", "--ep", "cpu", "--inline-threshold", "0",
                     env=cli_env({"XDG_CACHE_HOME": str(root / "x")}))
    assert result.returncode == 0, result.stderr
    yield root / "out"
    shutil.rmtree(root, ignore_errors=True)  # 400 MB: pytest keeps old tmp dirs


def _wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return False


def _staged(out: Path, suffix: str) -> bool:
    try:
        return any(f.name.endswith(suffix) and f.stat().st_size > 0 for s in out.glob(STAGE_PREFIX + "*") for f in s.iterdir())
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("signum,ep,when", [
    (signal.SIGINT, "qnn", "ep-compiling"),
    (signal.SIGTERM, "qnn", "ep-compiling"),
    (signal.SIGINT, "cpu", "data-pass"),
    (signal.SIGTERM, "cpu", "data-pass"),
], ids=["sigint-qnn-compiling", "sigterm-qnn-compiling", "sigint-cpu-data-pass", "sigterm-cpu-data-pass"])
def test_interrupted_mid_compile(signum: int, ep: str, when: str, slow_model: Path, slow_previous_output: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    try:
        shutil.copytree(slow_previous_output, out)  # the previous output
        _interrupt(signum, ep, when, slow_model, tmp_path, out)
    finally:
        shutil.rmtree(out, ignore_errors=True)  # 400 MB: pytest keeps old tmp dirs


def _interrupt(signum: int, ep: str, when: str, slow_model: Path, tmp_path: Path, out: Path) -> None:
    env = cli_env({"XDG_CACHE_HOME": str(tmp_path / "x")})
    before = snapshot(out)
    proc = popen_process("compile", slow_model, "-o", out, "--ep", ep, "--force", env=env)
    try:
        if when == "ep-compiling":  # the stage exists; QNN is inside its native compile for seconds
            assert _wait_for(lambda: bool(stage_dirs(out)), 60), "no staging directory appeared"
            time.sleep(1.5)
        else:  # the data file is being written
            assert _wait_for(lambda: _staged(out, ".onnx.data"), 60), "the data pass never started"
        assert proc.poll() is None, "the compile finished before the signal"
        sent = time.monotonic()
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=30)
        reaction = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr
    lines = error_lines(stderr)
    assert lines == [f"ortcompile: interrupted ({name}); nothing was published"], stderr
    assert stdout == ""
    assert reaction < 5, f"took {reaction:.1f}s to stop after {name}"
    assert snapshot(out) == before
    assert not stage_dirs(out)


# ---------------------------------------------------------------- `ortcompile inspect` on what the fuzzer found (tests/test_fuzz.py)

# Each of these crashed inspect (internal error) until hardening-16 (model fields) / hardening-17 (manifests) were fixed.


def _rich(ws: Ws) -> Path:
    """m_ctx.onnx (external data) + an EPContext node naming blob.bin, in its own directory."""
    d = ws.root / "insp"
    model = external_mlp(d, name="m_ctx", data="m_ctx.onnx.data")
    (d / "blob.bin").write_bytes(b"\0" * 64)

    def add(m: onnx.ModelProto) -> None:
        m.graph.node.append(helper.make_node("EPContext", ["y"], ["z"], name="ctx0", domain="com.microsoft", embed_mode=0,
                                             ep_cache_context=b"blob.bin", source="QNNExecutionProvider", main_context=1))
        m.graph.output.append(helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1, 64]))

    return edit_model(model, add)


def _ctx_attr(name: str, value: object) -> Callable[[Ws], Path]:
    def build(ws: Ws) -> Path:
        def edit(m: onnx.ModelProto) -> None:
            node = next(n for n in m.graph.node if n.op_type == "EPContext")
            kept = [a for a in node.attribute if a.name != name]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute(name, value)])

        return edit_model(_rich(ws), edit)

    return build


def _rich_w0(**fields: object) -> Callable[[Ws], Path]:
    return lambda ws: edit_model(_rich(ws), lambda m: set_external(initializer(m, "W0"), **fields))


def _rich_loop(ws: Ws) -> Path:
    model = _rich(ws)
    os.symlink("loop.data", model.parent / "loop.data")
    return edit_model(model, lambda m: set_external(initializer(m, "W0"), location="loop.data"))


def _rich_input_dtype(ws: Ws) -> Path:
    return edit_model(_rich(ws), lambda m: setattr(m.graph.input[0].type.tensor_type, "elem_type", 99))


def _with_manifest(content: object, ep: str = "cpu") -> Callable[[Ws], Path]:
    def build(ws: Ws) -> Path:
        out = ws.root / "insp-out"
        assert ws.compiled is not None
        shutil.copytree(ws.compiled(ep), out)  # m.onnx compiled for `ep` (once per module)
        manifest = out / "m_ctx.manifest.json"
        good = json.loads(manifest.read_text())
        manifest.write_text(json.dumps(content(good) if callable(content) else content))
        return out / "m_ctx.onnx"

    return build


def _set(path: str, value: object, *more: tuple[str, object]) -> Callable[[dict], dict]:
    def change(manifest: dict) -> dict:
        for where, what in ((path, value), *more):
            target = manifest
            keys = where.split(".")
            for key in keys[:-1]:
                target = target[int(key)] if isinstance(target, list) else target[key]
            target[int(keys[-1]) if isinstance(target, list) else keys[-1]] = what
        return manifest

    return change


INSPECT_CASES = [
    pytest.param(lambda ws: _rich(ws), id="control-good-model"),
    pytest.param(_rich_w0(location="nothere.data"), id="control-missing-data"),
    pytest.param(_rich_w0(location="../../etc/passwd"), id="control-unsafe-location"),
    pytest.param(_rich_w0(offset="0x10"), id="non-numeric-offset"),
    pytest.param(_rich_w0(length="16K"), id="non-numeric-length"),
    pytest.param(_rich_w0(location="x" * 5000), id="overlong-location"),
    pytest.param(_rich_w0(location="m_ctx.onnx.data\0x"), id="nul-in-location"),
    pytest.param(_rich_loop, id="symlink-loop-location"),
    pytest.param(_rich_input_dtype, id="unknown-input-elem-type"),
    pytest.param(_ctx_attr("embed_mode", "zero"), id="embed-mode-string"),
    pytest.param(_ctx_attr("embed_mode", [0, 1]), id="embed-mode-list"),
    pytest.param(_ctx_attr("main_context", float("inf")), id="main-context-inf"),
    pytest.param(_ctx_attr("ep_cache_context", b"x" * 5000), id="ctx-path-overlong"),
    pytest.param(_with_manifest(lambda m: m), id="control-good-manifest"),
    pytest.param(_with_manifest("not an object"), id="manifest-is-a-string"),
    pytest.param(_with_manifest(_set("files", None)), id="manifest-files-null"),
    pytest.param(_with_manifest(_set("files", ["m_ctx.onnx"])), id="manifest-file-entry-string"),
    pytest.param(_with_manifest(_set("files.0.size", "big")), id="manifest-size-not-a-number"),
    pytest.param(_with_manifest(_set("files.0.name", "y" * 5000)), id="manifest-name-overlong"),
    pytest.param(_with_manifest(_set("files.0.shared", True, ("files.0.name", {}))), id="manifest-shared-unhashable"),
    pytest.param(_with_manifest(_set("options.layout.align", 0, ("options.layout.align_threshold", 0))), id="manifest-align-zero"),
    pytest.param(_with_manifest(_set("options", [])), id="manifest-options-list"),
    pytest.param(_with_manifest(_set("nodes", False), ep="qnn"), id="manifest-nodes-false"),
]


@pytest.mark.parametrize("build", INSPECT_CASES)
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_inspect_bad_input(build: Callable[[Ws], Path], fmt: str, ws: Ws) -> None:
    """inspect works on any model: exit 0 with the problems listed (or a one-line exit 3), never an internal error;
    and it is read-only."""
    model = build(ws)
    before = snapshot(ws.root)
    result = run_cli("inspect", model, *(["--json"] if fmt == "json" else []), env=ws.env)
    assert snapshot(ws.root) == before
    where = f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr}"
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, where
    assert result.returncode in (0, 3), where
    if result.returncode == 3:
        assert len(error_lines(result.stderr)) == 1 and result.stderr.startswith("ortcompile: error: "), where
    elif fmt == "json":
        report = json.loads(result.stdout)
        assert report["format"] == "ortcompile-inspect/1"
