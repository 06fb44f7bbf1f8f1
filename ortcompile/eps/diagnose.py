"""One-line explanations for EP failures caused by something missing from this machine.

The EP's own text ("libcuda.so.1: cannot open shared object file", "VCL compiler loading failed ...")
names a library; the catalog says where that library comes from. No stand-in libraries are ever loaded:
the CUDA driver is only asked for its version when it is really there.
"""

from __future__ import annotations

import ctypes

from ortcompile import ortmarkers
from ortcompile.eps.catalog import MISSING_COMPONENTS, EpInfo


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


def cuda_driver_version() -> int | None:
    """The CUDA version the installed NVIDIA driver supports (e.g. 12080), or None without a driver."""
    for name in ("libcuda.so.1", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        version = ctypes.c_int(0)
        try:
            if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
                return version.value
        except AttributeError:
            return None
    return None


def cuda_mismatch(info: EpInfo, distribution: str, driver_version: int | None) -> str | None:
    """An EP wheel built for a newer CUDA major than the driver supports: what to install instead."""
    major = info.cuda_major.get(distribution)
    if major is None or driver_version is None:
        return None
    driver_major, driver_minor = driver_version // 1000, (driver_version % 1000) // 10
    if major <= driver_major:
        return None
    others = [d for d, m in info.cuda_major.items() if m <= driver_major]
    fix = f"install {others[-1]} instead, or update the NVIDIA driver" if others else "update the NVIDIA driver"
    return (f"{info.short_name}: {distribution} is built for CUDA {major}, but this NVIDIA driver supports CUDA up to "
            f"{driver_major}.{driver_minor}: {fix}")


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

