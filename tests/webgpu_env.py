"""The WebGPU plugin EP in tests: set its environment early, decide once whether it can run here.

Dawn (inside `onnxruntime-ep-webgpu`) reads two environment variables when the EP library is registered,
so they must be set before anything in the process registers it; importing this module sets them:

- ``ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1``: accept a CPU (software) adapter: Mesa's lavapipe Vulkan.
- ``XDG_RUNTIME_DIR``: a private (0700) directory, created here when the caller has none.

Availability is decided by a probe in a child process: import the package, register the EP, create a
session on ``fixtures/mlp.onnx`` with the EP and check that the session really got it. That last step
matters: with the software-adapter switch the EP *always* lists a device, and when Dawn then finds no
adapter (Mesa's Vulkan missing or too old) onnxruntime's Python layer silently falls back to the CPU EP.

Tests call :func:`require_webgpu`: it skips with the probe's reason when the EP cannot run on this machine,
or fails instead when ``ORTCOMPILE_REQUIRE_WEBGPU=1`` (CI sets it, so a broken install cannot pass as skips).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
REQUIRE_ENV = "ORTCOMPILE_REQUIRE_WEBGPU"


def _set_environment() -> None:
    os.environ.setdefault("ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER", "1")
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if not runtime_dir or not os.path.isdir(runtime_dir):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="ortcompile-xdg-")  # mkdtemp: mode 0700


_set_environment()


def env(**extra: str) -> dict[str, str]:
    """The environment for a child process that uses the WebGPU EP (plus `extra`)."""
    return {**os.environ, **extra}


def required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


_PROBE = r"""
import json, sys
import numpy as np
import onnxruntime as ort
try:
    import onnxruntime_ep_webgpu
except ImportError as exc:
    print(json.dumps({"ok": False, "reason": f"package onnxruntime-ep-webgpu is not installed ({exc})"})); sys.exit()
ort.set_default_logger_severity(3)
ort.register_execution_provider_library("WebGpuExecutionProvider", onnxruntime_ep_webgpu.get_library_path())
devices = [d for d in ort.get_ep_devices() if d.ep_name == "WebGpuExecutionProvider"]
if not devices:
    print(json.dumps({"ok": False, "reason": "WebGpuExecutionProvider lists no device (no GPU, and the software adapter is not allowed)"})); sys.exit()
options = ort.SessionOptions()
options.log_severity_level = 3
options.add_provider_for_devices(devices, {})
session = ort.InferenceSession(sys.argv[1], options)
providers = session.get_providers()
if providers[0] != "WebGpuExecutionProvider":
    print(json.dumps({"ok": False, "reason": "WebGpuExecutionProvider found no adapter (Mesa's Vulkan 25.x from bookworm-backports "
                      "missing? run .ci/install-webgpu.sh); onnxruntime fell back to " + ", ".join(providers)})); sys.exit()
y = session.run(None, {"x": np.ones((1, 256), np.float32)})[0]
print(json.dumps({"ok": True, "reason": "", "sample": float(y[0, 0])}))
"""


@functools.cache
def probe(**extra_env: str) -> tuple[bool, str]:
    """(available, reason): can the WebGPU EP claim an adapter and run a model on this machine?"""
    try:
        child = subprocess.run([sys.executable, "-c", _PROBE, str(FIXTURES / "mlp.onnx")], capture_output=True, text=True,
                               timeout=300, env=env(**extra_env))
    except subprocess.TimeoutExpired:
        return False, "the WebGPU probe did not finish within 300 s"
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    if child.returncode != 0 or not lines:
        tail = (child.stderr.strip().splitlines() or [f"exit code {child.returncode}"])[-1]
        return False, f"the WebGPU probe crashed (exit {child.returncode}): {tail}"
    verdict = json.loads(lines[-1])
    return bool(verdict["ok"]), verdict["reason"]


def require_webgpu() -> None:
    """Skip (or, with ORTCOMPILE_REQUIRE_WEBGPU=1, fail) unless the WebGPU EP runs here."""
    ok, reason = probe()
    if ok:
        return
    if required():
        pytest.fail(f"{REQUIRE_ENV}=1 but the WebGPU EP cannot run here: {reason}", pytrace=False)
    pytest.skip(f"WebGPU EP unavailable: {reason}")
