"""A session residency pool: keep compiled models loaded while they fit a memory budget, evict the least
recently used when they do not, reload transparently on the next use.

Compiled EPContext models load in seconds, which makes "load on demand, evict under pressure" a practical
policy for pipelines whose models fit one at a time but not all at once (Stable Diffusion's encoder, UNet
and VAE; an LLM's several graphs).

Footprint: a model's resident cost is the growth of this process's resident set size (RSS, from
/proc/self/statm) across its load and first run (the first run allocates the arena and, with graph
capture, records the command buffers). Before a model's first load the estimate is the size of its files.
Eviction returns freed heap to the OS (malloc_trim), so the next measurement starts from a true base.
The pool evicts before loading until resident + incoming fits the budget, so it exceeds the budget by at
most one model (only when that model alone is larger than the budget).

Graph capture (WebGPU `enableGraphCapture=1`, CUDA graphs): a captured session replays command buffers
recorded against its own bound inputs and outputs, so each session gets its own IOBinding with device
values, and eviction calls `release_captured_graph()` before dropping the session: the next use captures
again instead of replaying stale commands.
"""

from __future__ import annotations

import gc
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortcompile import eps
from ortcompile.errors import UsageError
from ortcompile.jsonedge import JsonObject
from ortcompile.native import return_freed_memory, vm_hwm_bytes
from ortcompile.onnxfacts import tiny_static_model
from ortcompile.readback.feeds import numpy_dtype
from ortcompile.readback.inspect import inspect_model
from ortcompile.run import sessions

GRAPH_CAPTURE_OPTION = "enableGraphCapture"
DEVICE_FOR_EP = {"WebGpuExecutionProvider": "webgpu", "CUDAExecutionProvider": "cuda", "DmlExecutionProvider": "dml"}


def peak_rss_since_reset() -> int | None:
    return vm_hwm_bytes()


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def model_file_bytes(model: Path) -> int:
    """The model file plus every file next to it that it names (data, EP blobs): a first footprint guess."""
    report = inspect_model(model)
    blobs = sum(e.blob.size or 0 for e in report.epcontext if e.blob)
    return report.graph_bytes + sum(f.size or 0 for f in report.data_files) + blobs


@dataclass
class PoolEvent:
    kind: str  # load | hit | evict | reload | capture
    model: str
    seconds: float = 0.0
    bytes: int = 0

    def to_json(self) -> JsonObject:
        return {"kind": self.kind, "model": self.model, "seconds": round(self.seconds, 4), "bytes": self.bytes}


@dataclass(frozen=True)
class _Binding:
    """Graph capture: the session's IOBinding and the device values bound to it."""

    io: Any  # onnxruntime.IOBinding (onnxruntime is imported where a session is made)
    values: dict[str, Any]  # onnxruntime.OrtValue by input and output name


@dataclass
class _Resident:
    session: Any
    footprint: int
    binding: _Binding | None = None  # graph capture: made on the first run
    runs: int = 0


class SessionPool:
    """Named models loaded on demand under a memory budget (bytes of RSS)."""

    def __init__(self, memory_budget_bytes: int, ep: str = "auto", ep_options: dict[str, str] | None = None,
                 graph_capture: bool = False, dims: dict[str, int] | None = None) -> None:
        self.budget = memory_budget_bytes
        self.ep = eps.resolve(ep, dict(ep_options or {}, **({GRAPH_CAPTURE_OPTION: "1"} if graph_capture else {})))
        self.graph_capture = graph_capture
        if graph_capture and self.ep.name not in DEVICE_FOR_EP:
            raise UsageError(f"--graph-capture needs an EP that captures graphs (webgpu); {self.ep.name} does not")
        self.dims = dict(dims or {})
        self.models: dict[str, Path] = {}
        self.footprints: dict[str, int] = {}  # last measured, kept after eviction for the next decision
        self.resident: OrderedDict[str, _Resident] = OrderedDict()  # least recently used first
        self.events: list[PoolEvent] = []
        self._loaded_before: set[str] = set()

    def warm_up(self) -> int:
        """Start the EP once with a one-node model and drop it; returns the RSS the EP's start-up cost.

        The first session on an EP loads its libraries and device (~100 MiB for QNN and for WebGPU on a
        software adapter): without this, that one-time cost would be charged to the first model's footprint.
        It also fails cleanly (EpUnavailable) where the EP cannot create sessions, before graph capture
        could abort the process.
        """
        before = rss_bytes()
        plain = eps.ResolvedEp(self.ep.info, self.ep.devices, {k: v for k, v in self.ep.options.items() if k != GRAPH_CAPTURE_OPTION},
                               self.ep.version)
        session = sessions.open_session(tiny_static_model().SerializeToString(), plain, label="a one-node model").session
        sessions.run_session(session, {"x": np.ones((1, 8), np.float32)}, "a one-node model", plain)
        del session
        gc.collect()
        return_freed_memory()
        return max(0, rss_bytes() - before)

    def add(self, name: str, model: str | os.PathLike[str]) -> None:
        path = Path(model)
        if not path.is_file():
            raise UsageError(f"{path}: no such model")
        self.models[name] = path
        self.footprints.setdefault(name, model_file_bytes(path))

    @property
    def resident_bytes(self) -> int:
        return sum(r.footprint for r in self.resident.values())

    def session(self, name: str) -> Any:
        return self._acquire(name).session

    def run(self, name: str, feeds: dict[str, np.ndarray] | Callable[[Any], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Run one model (loading it if needed); returns outputs by name as numpy arrays.

        `feeds` may be a function of the session, to build inputs from its metadata on first use.
        """
        entry = self._acquire(name)
        if callable(feeds):
            feeds = feeds(entry.session)
        if entry.runs == 0:
            return_freed_memory()
        start_rss = rss_bytes()
        outputs = self._run_bound(name, entry, feeds) if self.graph_capture else self._run_plain(name, entry, feeds)
        if entry.runs == 0:  # the first run allocates the arena (and captures): part of the footprint
            entry.footprint += max(0, rss_bytes() - start_rss)
            self.footprints[name] = entry.footprint
            self._make_room(0, keep=name)  # measured more than estimated: back under budget now, not never
        entry.runs += 1
        return outputs

    def evict(self, name: str) -> None:
        entry = self.resident.pop(name)
        start = time.perf_counter()
        if self.graph_capture and entry.runs:
            entry.session.release_captured_graph()  # the next use must capture again, never replay stale commands
        entry.binding = None
        del entry.session
        gc.collect()
        return_freed_memory()
        self.events.append(PoolEvent("evict", name, time.perf_counter() - start, entry.footprint))

    def close(self) -> None:
        for name in list(self.resident):
            self.evict(name)

    def _acquire(self, name: str) -> _Resident:
        if name not in self.models:
            raise UsageError(f"no model named {name!r} in the pool")
        if name in self.resident:
            self.resident.move_to_end(name)
            self.events.append(PoolEvent("hit", name))
            return self.resident[name]
        self._make_room(self.footprints[name])
        return self._load(name)

    def _make_room(self, incoming: int, keep: str | None = None) -> None:
        """Evict least recently used sessions (never `keep`) until resident + incoming fits the budget."""
        while self.resident_bytes + incoming > self.budget:
            victims = [n for n in self.resident if n != keep]
            if not victims:
                return  # only `keep` (or nothing) left: a single model larger than the budget stays
            self.evict(victims[0])

    def _load(self, name: str) -> _Resident:
        options = sessions.session_options(self.ep, self.dims)
        return_freed_memory()  # freed-but-kept heap would be reused by the session and hide its footprint
        start_rss = rss_bytes()
        timed = sessions.open_session(self.models[name], self.ep, options=options, label=name, failure=f"cannot load on {self.ep.name}")
        session, seconds = timed.session, timed.seconds
        entry = _Resident(session, max(0, rss_bytes() - start_rss))
        self.footprints[name] = entry.footprint
        self.resident[name] = entry
        self.events.append(PoolEvent("reload" if name in self._loaded_before else "load", name, seconds, entry.footprint))
        self._loaded_before.add(name)
        return entry

    def _run_plain(self, name: str, entry: _Resident, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return sessions.run_session(entry.session, feeds, name, self.ep)

    def _run_bound(self, name: str, entry: _Resident, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Graph capture: inputs and outputs live in device values bound once per session."""
        import onnxruntime as ort

        device = DEVICE_FOR_EP[self.ep.name]
        if not entry.binding:
            binding = entry.session.io_binding()
            values = {}
            for arg in entry.session.get_inputs():
                values[arg.name] = ort.OrtValue.ortvalue_from_numpy(feeds[arg.name], device, 0)
                binding.bind_ortvalue_input(arg.name, values[arg.name])
            for arg in entry.session.get_outputs():
                if not all(isinstance(d, int) for d in arg.shape):
                    raise UsageError(f"{name}: output {arg.name} has a symbolic shape; graph capture needs static shapes (--fix-dim)")
                values[arg.name] = ort.OrtValue.ortvalue_from_shape_and_type(arg.shape, _numpy_type(arg.type), device, 0)
                binding.bind_ortvalue_output(arg.name, values[arg.name])
            entry.binding = _Binding(binding, values)
            self.events.append(PoolEvent("capture", name))
        else:
            for input_name, array in feeds.items():
                entry.binding.values[input_name].update_inplace(array)
        entry.session.run_with_iobinding(entry.binding.io)
        return {o.name: entry.binding.values[o.name].numpy() for o in entry.session.get_outputs()}


def _numpy_type(ort_type: str) -> Any:
    return numpy_dtype(ort_type)
