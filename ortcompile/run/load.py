"""`load_session`: a compiled model as an `onnxruntime.InferenceSession` on the EP it was compiled for.

The obvious `InferenceSession(path, providers=["QNNExecutionProvider"])` fails: a plugin EP must be registered
(`register_execution_provider_library`) and added for its devices with its options (QNN needs `backend_path`).
The manifest beside the model says which EP, options and target it was compiled with; without one, the
EPContext nodes' `source` attribute names the EP. A recorded option that would load a library is ignored
(docs/security.md): whoever can edit an output's files must not choose code for the caller's process. The
model is checked by the path-safety rule compiles use (plan/source.py) before ONNX Runtime opens it.
Nothing here imports onnxruntime until it is called.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortcompile import eps
from ortcompile.eps import lookup, recorded_options
from ortcompile.eps.compat import read_compatibility_info
from ortcompile.eps.request import EpRequest
from ortcompile.errors import InvalidModel, UsageError
from ortcompile.native import redirected
from ortcompile.output.manifest import Manifest, ManifestError
from ortcompile.plan.source import read_source
from ortcompile.run.sessions import open_session
from ortcompile.run.sessions import session_options as default_options

if TYPE_CHECKING:
    from ortcompile.output.manifest import Manifest


def load_session(path: str | os.PathLike[str], *, ep: str | None = None, ep_options: dict[str, str] | None = None,
                 target: str | None = None, ep_library: str | None = None, session_options: Any = None) -> Any:
    """An `onnxruntime.InferenceSession` over the compiled model at `path`, on the EP it was compiled for.

    `ep`, `ep_options` and `target` override what the manifest recorded (`ep_options` are added to the recorded
    ones); `ep_library` registers an unpackaged plugin library under `ep`. `session_options` (an
    `onnxruntime.SessionOptions`) is used as given, with the EP added to it. ONNX Runtime's silent fallback to
    the CPU EP is refused: an EP that cannot take the model raises instead of running it somewhere else
    (`CompilationFailed`, or `EpUnavailable` when the EP is missing; `InvalidModel` for a missing, unreadable or
    unsafe model: one whose data or EP context paths lead outside its directory). Provider options that load a
    library are taken from `ep_options` only, never from the manifest.
    """
    model = Path(path)
    if not model.is_file():
        raise InvalidModel(f"{model}: no such file")
    read_source(model)  # refuses what compile, verify and inspect refuse: paths outside the model's directory
    request = model_ep(model, ep, ep_options, target, ep_library)
    resolved = eps.resolve(request.name, request.options, target=request.target, library=request.library)
    options = default_options(resolved) if session_options is None else _with_ep(session_options, resolved)
    with _banners_to_stderr():
        return open_session(model, resolved, options=options, label=str(model), failure="cannot load it", redirect_native=False).session


@contextlib.contextmanager
def _banners_to_stderr() -> Iterator[None]:
    """File descriptor 1 points at stderr while the EP loads: the QNN SDK prints a banner with printf, and an
    application's stdout may be its data. Nothing is dropped (ONNX Runtime's own log stays on stderr)."""
    with redirected(stdout=2):
        yield


def _with_ep(options: Any, resolved: Any) -> Any:
    resolved.configure(options)
    return options


def model_ep(model: Path, ep: str | None = None, ep_options: dict[str, str] | None = None, target: str | None = None,
             ep_library: str | None = None) -> EpRequest:
    """The EP, options and target to open a compiled model with: the manifest's, with the caller's on top."""
    try:
        manifest = Manifest.beside(model)
    except ManifestError as exc:
        raise InvalidModel(f"{model}: {exc}; remove the manifest or pass the EP to use", detail=str(exc)) from None
    recorded = manifest is not None and bool(manifest.ep) and (ep is None or _same_ep(ep, manifest.ep))
    name = ep or (manifest.ep if recorded and manifest is not None else ep_from_graph(model))
    options, chosen = {}, target
    if recorded and manifest is not None:
        options = recorded_ep_options(manifest, model, given=ep_options or {})
        chosen = target or (manifest.target or {}).get("name")
    return EpRequest(name, {**options, **(ep_options or {})}, chosen, ep_library)


def recorded_ep_options(manifest: Manifest, model: Path, given: dict[str, str] | None = None) -> dict[str, str]:
    """The provider options the manifest recorded, except those that load a library (QNN's backend_path, any
    value naming a .so/.dll): left out with a warning, unless the caller gives that option itself."""
    return recorded_options(manifest.options.get("ep_options"), f"{model}: its manifest", given)


def _same_ep(given: str, recorded: str) -> bool:
    try:
        return lookup(given).ep_name == lookup(recorded).ep_name
    except UsageError:
        return given == recorded


def ep_from_graph(model: Path) -> str:
    """The EP the EPContext nodes name in their `source` attribute; the CPU EP for a model without any."""
    sources = sorted(read_compatibility_info(model)[1])
    if not sources:
        return "cpu"
    if len(sources) > 1 or sources[0] == "unknown":
        named = ", ".join(s for s in sources if s != "unknown") or "no EP"
        raise UsageError(f"{model}: its EPContext nodes name {named} as their source and there is no manifest beside it; say which EP to use (ep=...)")
    return sources[0]
