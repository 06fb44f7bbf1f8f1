"""One-line explanations for EP failures caused by something missing from this machine.

The EP's own text ("libcuda.so.1: cannot open shared object file", "VCL compiler loading failed ...")
names a library; the catalog says where that library comes from. What to do when an EP loads but claims no
device fits here too.
"""

from __future__ import annotations

import os

from ortcompile import ortmarkers
from ortcompile.eps.catalog import MISSING_COMPONENTS, EpInfo
from ortcompile.errors import ComponentMissing, EpUnavailable, OrtCompileError, first_line


def missing_libraries(text: str) -> list[str]:
    """Shared libraries an error text says could not be opened, in order, without duplicates."""
    found = ortmarkers.CANNOT_OPEN_LIBRARY.findall(text) + ortmarkers.DLL_NOT_FOUND.findall(text)
    return list(dict.fromkeys(found))


def missing_component(info: EpInfo, text: str) -> str | None:
    """'<lib> is not on this machine; it comes with <where>' for the library an error text could not open."""
    libraries = missing_libraries(text)
    known = [lib for lib in libraries if lib in MISSING_COMPONENTS]
    if known:
        lib = known[-1]  # the innermost: the loader names the plugin first, then what the plugin lacked
        return f"{lib} is not on this machine; it comes with {MISSING_COMPONENTS[lib]}"
    if libraries and info.library is None and info.module is not None:
        return f"{libraries[-1]} is not on this machine (needed by {info.distribution}); reinstall that package"
    return None


def explain_missing(info: EpInfo, text: str, doing: str) -> str | None:
    """'<ep>: cannot <doing>: <lib> is not on this machine; it comes with <where>', or None if nothing known is missing."""
    missing = missing_component(info, text)
    return f"{info.short_name}: cannot {doing}: {missing}" if missing else None


def load_failure(info: EpInfo, refused: Exception) -> OrtCompileError:
    """ONNX Runtime refused to register the EP's library: ComponentMissing (exit 1) when the text names a library this
    machine lacks, EpUnavailable (exit 2) otherwise."""
    text = str(refused)
    missing = explain_missing(info, text, "load the EP")
    if missing:
        return ComponentMissing(missing, detail=text)
    return EpUnavailable(f"{info.short_name}: could not load {info.library or info.distribution}: {first_line(refused)}", detail=text)


def installed_twice(info: EpInfo) -> str | None:
    """Two wheels of the same EP for different CUDA majors share one module: the last installed overwrote the other."""
    import importlib.metadata

    present = []
    for dist in info.cuda_major:
        try:
            importlib.metadata.version(dist)
            present.append(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    if len(present) > 1:
        return (f"{info.short_name}: both {' and '.join(present)} are installed and share the module {info.module}; "
                f"uninstall the one that does not match your CUDA driver")
    return None


def compile_failure_hint(info: EpInfo, text: str) -> str | None:
    """For ortstep: a compile error caused by a missing component, as one line (None: not that kind)."""
    return explain_missing(info, text, "compile")



def no_device_hint(info: EpInfo) -> str:
    """What to do when an EP is installed and loads but claims no device (fit for the target) here."""
    if info.library is not None:
        import onnxruntime as ort

        names = sorted({d.ep_name for d in ort.get_ep_devices() if dict(d.ep_metadata).get("library_path") == info.library} - {info.ep_name})
        if names:
            return f"the library registers {', '.join(names)}: use --ep {names[0]}"
    if info.short_name == "webgpu" and not os.environ.get("ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER"):
        return "without a GPU, set ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 to use a software (Vulkan) adapter"
    if info.short_name == "nvtensorrtrtx":
        return "it offers a device only for an NVIDIA RTX GPU (sm86, sm89, sm120, sm121), also to cross-compile with --target"
    return "run 'ortcompile eps --targets' to see what is available"
