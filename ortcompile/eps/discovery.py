"""Finding installed plugin EP packages without importing them, and mapping names to EpInfo.

The convention (ONNX Runtime's plugin EP packaging guidance, followed by onnxruntime-qnn,
onnxruntime-ep-openvino, -webgpu and -nv-tensorrt-rtx): a top-level Python module whose ``__init__.py``
defines ``get_library_path()`` and ``get_ep_names()``. ortcompile looks at top-level modules named
``onnxruntime_*`` plus every module in its catalog, and reads their source with ``ast``: importing a plugin
package can be expensive (TensorRT RTX preloads 240 MB of libraries and imports onnxruntime), and an
up-to-date check must not import onnxruntime at all. EP names come from the string constants of the module
(``"...ExecutionProvider"``); the module is imported only when its EP is used (loading.py).
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ortcompile.eps.catalog import AUTO_ORDER, CPU_EP, KNOWN_EPS, EpInfo, distribution_of_module, short_name_for
from ortcompile.eps.libraries import library_eps
from ortcompile.eps.targets import find_target, static_targets
from ortcompile.errors import UsageError

PLUGIN_PREFIX = "onnxruntime_"
_EP_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]*ExecutionProvider$")


@dataclass(frozen=True)
class PluginPackage:
    """A module that follows the plugin EP convention, as read from its source."""

    module: str
    init_file: str
    ep_names: tuple[str, ...]  # from string constants; empty if the module computes them


def _init_file(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return spec.origin


def read_plugin_source(module: str, init_file: str) -> PluginPackage | None:
    """The convention check, on the source: both functions defined at module level."""
    try:
        tree = ast.parse(Path(init_file).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None
    functions = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if not {"get_library_path", "get_ep_names"} <= functions:
        return None
    docstrings = {id(body[0].value) for body in (getattr(n, "body", None) for n in ast.walk(tree))
                  if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)}
    names = [node.value for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
             and _EP_NAME.match(node.value) and node.value != CPU_EP]
    return PluginPackage(module, init_file, tuple(dict.fromkeys(names)))


@functools.lru_cache(maxsize=1)
def installed_plugins() -> tuple[PluginPackage, ...]:
    """Every plugin EP package importable in this interpreter (cached for the process)."""
    candidates = {info.module for info in KNOWN_EPS.values() if info.module}
    for directory in sys.path:  # a directory listing per path entry: pkgutil.iter_modules costs 10x more
        try:
            with os.scandir(directory or ".") as entries:
                candidates.update(e.name for e in entries if e.name.startswith(PLUGIN_PREFIX) and e.name.isidentifier() and e.is_dir())
        except OSError:
            continue
    found = []
    for module in sorted(candidates):
        init_file = _init_file(module)
        package = read_plugin_source(module, init_file) if init_file else None
        if package is not None:
            found.append(package)
    return tuple(found)


def _known_by_ep_name() -> dict[str, EpInfo]:
    return {info.ep_name: info for info in KNOWN_EPS.values()}


def all_eps() -> list[EpInfo]:
    """The catalog, plus every installed plugin's EPs (defaults for those not in the catalog), plus --ep-library ones
    this process registered (libraries.py)."""
    by_name = _known_by_ep_name()
    result = {info.ep_name: info for info in KNOWN_EPS.values()}
    for package in installed_plugins():
        for ep_name in package.ep_names:
            if ep_name in by_name:
                continue
            result.setdefault(ep_name, EpInfo.unknown(ep_name, module=package.module, pip_name=distribution_of_module(package.module)))
        if not package.ep_names and not any(info.module == package.module for info in result.values()):
            fallback = package.module.removeprefix(PLUGIN_PREFIX).removeprefix("ep_")
            result.setdefault(f"?{package.module}", EpInfo(fallback, "", True, package.module, distribution_of_module(package.module),
                                                         known=False, note="EP name known only after import"))
    for info in library_eps():  # never in place of a packaged EP: `--ep qnn` keeps meaning the package
        result.setdefault(info.ep_name, info)
    return list(result.values())


def library_info(name: str, path: str) -> EpInfo:
    """--ep-library PATH --ep EPNAME: the catalog's data when EPNAME is an EP we know, defaults otherwise (no import)."""
    if not os.path.isfile(path):
        raise UsageError(f"--ep-library {path!r}: no such file")
    key = name.strip()
    if not key or key.lower() == "auto":
        raise UsageError("--ep-library needs --ep with the EP name the library registers, e.g. --ep WebGpuExecutionProvider")
    known = next((i for i in KNOWN_EPS.values() if key.lower() in i.names()), None)
    return known.with_library(os.path.abspath(path)) if known else EpInfo.unknown(key, library=os.path.abspath(path))


def lookup(name: str) -> EpInfo:
    """Map a short name, an alias or a full ONNX Runtime EP name to what we know about it (no onnxruntime import)."""
    key = name.strip().lower()
    eps = all_eps()
    for info in eps:
        if key in info.names() or (info.ep_name and key == short_name_for(info.ep_name)):
            return info
    for info in eps:  # a package whose EP names were not readable from its source: import it now
        if not info.ep_name and info.module and key == info.short_name:
            return _imported(info)
    known = ", ".join([*dict.fromkeys(i.short_name for i in eps if i.ep_name), "auto"])
    raise UsageError(f"unknown execution provider {name!r}{did_you_mean(key, eps)}; use one of: {known}, or a full EP name listed "
                     "by 'ortcompile eps' (an unpackaged plugin: --ep-library PATH --ep EPNAME)")


def did_you_mean(key: str, eps: list[EpInfo]) -> str:
    """' (did you mean 'qnn'?)' for a typo of a known EP name (short, alias or full), as click does for options."""
    spelled = {n: (i.ep_name if n == i.ep_name.lower() else n) for i in eps if i.ep_name for n in i.names()}
    close = difflib.get_close_matches(key, [*spelled, "auto"], n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(spelled.get(c, c)) for c in close)}?)" if close else ""


@dataclass(frozen=True)
class EpChoice:
    """`--ep NAME` (with --ep-library PATH) read from the tables alone, importing nothing: the EP it names, or for
    `auto` the EPs of AUTO_ORDER, the first of which that is available is used. The one place `auto` is read for
    --ep: the resolve that registers the EP, the typo check before it and the --if-changed check all ask here."""

    named: EpInfo | None  # None: `--ep auto`

    @property
    def candidates(self) -> tuple[EpInfo, ...]:
        """The EPs to try, in order (resolution.resolve_choice takes the first that registers and has a device)."""
        return (self.named,) if self.named is not None else tuple(KNOWN_EPS[short] for short in AUTO_ORDER)

    def expected(self) -> EpInfo | None:
        """The EP a compile would use, told without loading onnxruntime: the one named, else auto's first installed
        one (None: none is)."""
        return self.named or next((info for info in self.candidates if is_installed(info)), None)


def choose_ep(name: str, library: str | None = None) -> EpChoice:
    if library:
        return EpChoice(library_info(name, library))
    return EpChoice(None if name.strip().lower() == "auto" else lookup(name))


def check_names(name: str, target: str | None = None, library: str | None = None) -> None:
    """The EP name, the library path and an option target (QNN's SoC table), from the tables alone: a typo is a usage
    error before onnx or onnxruntime is imported (seconds). Device targets need the EP's devices: resolve checks them."""
    info = choose_ep(name, library).named
    if info is not None and target and info.target_kind == "option" and static_targets(info):
        find_target(target, static_targets(info), info)


def _imported(info: EpInfo) -> EpInfo:
    module = importlib.import_module(info.module or "")
    names = list(module.get_ep_names())
    if not names:
        raise UsageError(f"{info.module}: get_ep_names() returned no EP name")
    return KNOWN_EPS.get(short_name_for(names[0])) or EpInfo.unknown(names[0], module=info.module, pip_name=info.pip_name)


def is_installed(info: EpInfo) -> bool:
    """Cheap: the module can be found (not imported)."""
    if info.library is not None or info.module is None:
        return True
    try:
        return importlib.util.find_spec(info.module) is not None
    except (ImportError, ValueError):
        return False
