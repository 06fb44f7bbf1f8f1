"""What ortcompile knows about execution providers, as data: names, packages, options, precision.

Nothing here imports onnxruntime or a plugin package: `--if-changed` decides "up to date" from this
module in milliseconds. EPs that are installed but not listed here are found by `discovery` and get
the defaults of :func:`EpInfo.unknown`.

Short names: an EP's short name is its ONNX Runtime name without the ``ExecutionProvider`` suffix,
lower-cased, keeping only letters and digits (``QNNExecutionProvider`` → ``qnn``,
``NvTensorRTRTXExecutionProvider`` → ``nvtensorrtrtx``). Known EPs add aliases (``nvtrtrtx``).
"""

from __future__ import annotations

import difflib
import functools
import re
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

from ortcompile.errors import InvalidModel, OrtCompileWarning, UsageError, shorten

CPU_EP = "CPUExecutionProvider"
EP_SUFFIX = "ExecutionProvider"


def short_name_for(ep_name: str) -> str:
    """The documented rule: drop the ``ExecutionProvider`` suffix, lower-case, keep letters and digits."""
    base = ep_name[: -len(EP_SUFFIX)] if ep_name.endswith(EP_SUFFIX) and ep_name != EP_SUFFIX else ep_name
    return re.sub(r"[^a-z0-9]", "", base.lower()) or ep_name.lower()


@dataclass(frozen=True)
class EpInfo:
    """What ortcompile knows about an EP before anything is loaded."""

    short_name: str
    ep_name: str
    compiles: bool  # produces EPContext nodes (unknown EPs: assumed, see `known`)
    module: str | None = None  # plugin Python package (None: built into onnxruntime, or a bare library)
    pip_name: str | None = None  # what to `pip install` (a meta-package where there is one)
    injected_options: tuple[tuple[str, str], ...] = ()  # (option, module function giving its value)
    option_keys: frozenset[str] = frozenset()  # documented provider options (empty: not checked)
    aliases: tuple[str, ...] = ()
    static_shapes: bool = False  # compiles only static shapes (dynamic dims must be pinned)
    precision: str = "fp32"  # what the EP computes float models in (QNN HTP: fp16)
    runtime_only_keys: frozenset[str] = frozenset()  # options that never change the compiled output
    replaces: tuple[tuple[str, str], ...] = ()  # (user option, injected option it replaces)
    exclusive: tuple[tuple[str, str], ...] = ()  # option pairs that cannot be given together
    target_kind: str = "device"  # "option": targets are provider options; "device": EP devices (maybe virtual)
    distributions: tuple[str, ...] = ()  # wheels that provide `module` (first installed one is reported)
    cuda_major: dict[str, int] = field(default_factory=dict)  # distribution -> CUDA major it is built for
    known: bool = True  # False: found by discovery, defaults assumed
    library: str | None = None  # registered from this path (--ep-library) instead of a package
    note: str = ""

    @property
    def distribution(self) -> str:
        """The installed wheel providing the EP (cheap: package metadata only)."""
        if self.module is None and self.library is None:
            return "onnxruntime"
        return installed_distribution(self) or self.pip_name or self.module or "unknown"

    def names(self) -> tuple[str, ...]:
        return (self.short_name, *self.aliases, self.ep_name.lower())

    def with_library(self, path: str) -> EpInfo:
        return replace(self, library=path, module=None, distributions=(), pip_name=None)

    @classmethod
    def unknown(cls, ep_name: str, module: str | None = None, pip_name: str | None = None, library: str | None = None) -> EpInfo:
        """Defaults for an EP we have no data on: it may compile (so 'compiled nothing' is an error unless
        --allow-partial), no option checks, no injected options."""
        return cls(short_name_for(ep_name), ep_name, compiles=True, module=module, pip_name=pip_name, known=False, library=library,
                   distributions=(pip_name,) if pip_name else (),
                   note="not in ortcompile's catalog: assumed to produce EPContext, options passed on unchecked")


# Provider option keys the QNN EP documents (onnxruntime-qnn docs, QNN-ExecutionProvider.md). Keys not listed
# are passed on with a warning (a newer EP may know them); a key one typo away from a listed one is an error.
QNN_OPTION_KEYS = frozenset({
    "backend_type", "backend_path", "profiling_level", "profiling_file_path", "rpc_control_latency", "vtcm_mb",
    "htp_performance_mode", "qnn_saver_path", "qnn_context_priority", "htp_graph_finalization_optimization_mode",
    "soc_model", "htp_arch", "device_id", "enable_htp_fp16_precision", "offload_graph_io_quantization",
    "enable_htp_spill_fill_buffer", "enable_htp_shared_memory_allocator", "dump_json_qnn_graph", "json_qnn_graph_dir",
    "op_packages", "skip_qnn_version_check", "enable_vtcm_backup_buffer_sharing", "extended_udma",
    "genie_log_level", "enable_block_quant_weight_optimization", "dump_qnn_ir_dlc", "dump_qnn_ir_dlc_dir",
    "qnn_ir_backend_path", "num_graph_prepare_threads", "htp_share_resource_optimization", "disable_file_mapped_weights",
    "htp_bf16_enable", "enable_htp_prepare_only", "enable_framework_op_trace", "framework_op_trace_dir",
    "op_affinity",  # a JSON file {"op_type": {OP: BACKEND}}; read by onnxruntime-qnn 2.7.0 (compile/epfixes.py writes one)
})

# Options that only matter when a session runs (a power vote, RPC latency): measured to leave the compiled
# model and blob byte-identical (tests/test_eps_validate.py), so passing them to `compile` does nothing.
# (qnn_context_priority is not one of them: it changes the context binary.)
QNN_RUNTIME_ONLY = frozenset({"htp_performance_mode", "rpc_control_latency"})

# nv_* keys of onnxruntime-ep-nv-tensorrt-rtx 0.5.0 (its bundled tensorrt_rtx_provider_options.h).
TRT_RTX_OPTION_KEYS = frozenset({
    "has_user_compute_stream", "user_compute_stream", "user_aux_stream_array", "nv_max_workspace_size",
    "nv_max_shared_mem_size", "nv_length_aux_stream_array", "nv_dump_subgraphs", "nv_detailed_build_log",
    "nv_profile_min_shapes", "nv_profile_max_shapes", "nv_profile_opt_shapes", "enable_cuda_graph",
    "nv_multi_profile_enable", "nv_use_external_data_initializer", "nv_runtime_cache_path",
    "VkExternalComputeQueueDataParamsNV_data", "nv_weight_streaming_budget", "nv_op_types_to_exclude",
    "nv_enable_profiling", "nv_profiling_output_file", "nv_use_sync_gpu_allocator", "nv_persistent_context_memory",
    "nv_multi_rotary_cache_concat_offset", "nv_weight_stripped_engine_enable_experimental", "nv_target_sm",
})

KNOWN_EPS: dict[str, EpInfo] = {
    "qnn": EpInfo(
        "qnn", "QNNExecutionProvider", True, "onnxruntime_qnn", "onnxruntime-qnn",
        injected_options=(("backend_path", "get_qnn_htp_path"),),  # without it the EP fails at session creation
        option_keys=QNN_OPTION_KEYS, static_shapes=True, precision="fp16", runtime_only_keys=QNN_RUNTIME_ONLY,
        replaces=(("backend_type", "backend_path"),), exclusive=(("backend_type", "backend_path"),),
        target_kind="option", distributions=("onnxruntime-qnn",),
        note="HTP backend; on x86_64 it compiles through the HTP simulator",
    ),
    "openvino": EpInfo(
        "openvino", "OpenVINOExecutionProvider", True, "onnxruntime_ep_openvino", "onnxruntime-ep-openvino",
        aliases=("ov",), distributions=("onnxruntime-ep-openvino",),
        note="virtual NPU targets need Intel's NPU compiler (libopenvino_intel_npu_compiler_loader.so, from the NPU driver)",
    ),
    "webgpu": EpInfo("webgpu", "WebGpuExecutionProvider", False, "onnxruntime_ep_webgpu", "onnxruntime-ep-webgpu",
                     distributions=("onnxruntime-ep-webgpu",)),
    "nvtensorrtrtx": EpInfo(
        "nvtensorrtrtx", "NvTensorRTRTXExecutionProvider", True, "onnxruntime_ep_nv_tensorrt_rtx", "onnxruntime-ep-nv-tensorrt-rtx",
        aliases=("nvtrtrtx", "trtrtx", "tensorrt-rtx"), option_keys=TRT_RTX_OPTION_KEYS, precision="fp16",
        target_kind="option",
        distributions=("onnxruntime-ep-nv-tensorrt-rtx-cu13", "onnxruntime-ep-nv-tensorrt-rtx-cu12", "onnxruntime-ep-nv-tensorrt-rtx"),
        cuda_major={"onnxruntime-ep-nv-tensorrt-rtx-cu13": 13, "onnxruntime-ep-nv-tensorrt-rtx-cu12": 12},
        note="needs the NVIDIA driver (libcuda.so.1) to load, and an RTX GPU (sm86/89/120/121) to offer a device",
    ),
    "cpu": EpInfo("cpu", CPU_EP, False),
}

# Default (rtol, atol) for comparing an EP's outputs with the CPU EP, by the precision the EP computes float
# models in. fp16: QNN's HTP (and the simulator, compiling for a named SoC) differs from the CPU EP by up to
# 1.6e-3 on the fixtures (outputs up to 2.9): 5e-3 leaves ~3x headroom; order-1 errors (a wrong weight) still fail.
PRECISION_TOLERANCE: dict[str, tuple[float, float]] = {"fp32": (1e-3, 1e-4), "fp16": (5e-3, 5e-3)}

# EPs that can be told to keep nodes off them (QNN's op_affinity provider option): --cpu-nodes, --fallback auto.
CPU_PINNING_EPS = frozenset({"QNNExecutionProvider"})

# `--ep auto` tries these in order and takes the first that claims a device here.
AUTO_ORDER = ("qnn", "openvino", "cpu")

# Shared libraries an EP may fail to load or compile without, and where each comes from (one-line errors).
MISSING_COMPONENTS: dict[str, str] = {
    "libcuda.so.1": "the NVIDIA GPU driver, not with any Python package (and the EP offers a device only for an RTX GPU, "
                    "also to cross-compile)",
    "libopenvino_intel_npu_compiler_loader.so": "Intel's NPU compiler, which ships with the Intel NPU driver "
                                                "(linux-npu-driver / Windows NPU driver), not with onnxruntime-ep-openvino",
    "libcudart.so.12": "the CUDA 12 runtime (the -cu12 wheel of the EP, or the CUDA 12 toolkit)",
    "libcudart.so.13": "the CUDA 13 runtime (the -cu13 wheel of the EP, or the CUDA 13 toolkit)",
    "libQnnCpu.so": "the QNN CPU backend, which onnxruntime-qnn does not ship for this platform",
    "libQnnGpu.so": "an Adreno GPU and its driver",
    "libcdsprpc.so": "a Qualcomm device's FastRPC library (only on Snapdragon hardware)",
}


# Provider options that make an EP load a shared library (dlopen: its code runs in the process). QNN: its backend,
# the QnnSaver and QNN IR backends, and custom op packages ("OpType:path/lib.so:Interface,..."). ortcompile takes
# these only from the caller, never from a file it finds or reads (docs/security.md).
LIBRARY_OPTION_KEYS = frozenset({"backend_path", "qnn_saver_path", "qnn_ir_backend_path", "op_packages"})
_LIBRARY_FILE = re.compile(r"\.(?:so(?:\.\d+)*|dll|dylib)$", re.IGNORECASE)


def loads_library(key: str, value: str) -> bool:
    """Whether a provider option names a shared library the EP would load: a key known to (LIBRARY_OPTION_KEYS),
    or, for EPs we have no data on, a value with a part that names a library file (`/x/libfoo.so`, `a.dll`)."""
    return key in LIBRARY_OPTION_KEYS or any(_LIBRARY_FILE.search(part.strip()) for part in re.split(r"[,;:|]", value))


def library_options(options: dict[str, str]) -> dict[str, str]:
    """The options of `options` that load a library (see loads_library)."""
    return {key: value for key, value in options.items() if loads_library(key, str(value))}


def recorded_options(recorded: Any, where: str, given: dict[str, str] | None = None) -> dict[str, str]:
    """Provider options read from an output's files (a manifest, a parts plan), minus those that load a library:
    they are left out with a warning unless the caller gives that option itself (`given`), so whoever can edit
    an output cannot choose code for the process that reads it. InvalidModel when they are not a table."""
    recorded = recorded or {}
    if not isinstance(recorded, dict) or not all(isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in recorded.items()):
        raise InvalidModel(f"{where}: its recorded ep_options are not a table of provider options")
    options = {key: str(value) for key, value in recorded.items()}
    ignored = {key: value for key, value in library_options(options).items() if key not in (given or {})}
    if ignored:
        named = shorten(", ".join(f"{key}={value!r}" for key, value in ignored.items()), 200)
        warnings.warn(f"{where}: ignoring the recorded ep_options {named}: ortcompile loads no library that an output's files "
                      "name (the EP's own is used; pass the option yourself to use another)", OrtCompileWarning, stacklevel=3)
    return {key: value for key, value in options.items() if key not in ignored}


def check_option_keys(info: EpInfo, options: dict[str, str]) -> list[str]:
    """Refuse likely typos of known provider options; return warnings for keys we do not know."""
    known = info.option_keys
    if not known:
        return []
    found = []
    for key in options:
        if key in known:
            continue
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.8)
        if close:
            raise UsageError(f"unknown --ep-option {key!r} for {info.short_name}; did you mean {close[0]!r}?")
        found.append(f"{info.short_name}: --ep-option {key!r} is not a documented {info.ep_name} option; passing it on")
    return found


def parse_ep_options(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Parse repeated KEY=VALUE provider options."""
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"bad --ep-option {pair!r}: expected KEY=VALUE, e.g. htp_graph_finalization_optimization_mode=3")
        options[key.strip()] = value.strip()
    return options


@functools.cache
def distribution_of_module(module: str) -> str | None:
    import importlib.metadata

    try:
        dists = importlib.metadata.packages_distributions().get(module, [])
    except Exception:  # broken metadata of an unrelated package must not break discovery
        return None
    return dists[0] if dists else None


def installed_distribution(info: EpInfo) -> str | None:
    """The first of the EP's wheels that is installed (TensorRT RTX: -cu13, -cu12 or the meta-package)."""
    import importlib.metadata

    for dist in info.distributions:
        try:
            importlib.metadata.version(dist)
            return dist
        except importlib.metadata.PackageNotFoundError:
            continue
    return distribution_of_module(info.module) if info.module else None
