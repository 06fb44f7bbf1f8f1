"""The one place an `onnxruntime.SessionOptions` is built: for every session, compile, probe and check.

Logging as configured (native.py: quiet unless -v), the EP's devices and provider options (none: the CPU EP alone;
never a fallback to another EP), pinned dims and config entries. onnxruntime is imported when called.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ortcompile.child import note_ep_ran_here
from ortcompile.eps.catalog import CPU_EP
from ortcompile.native import configure_session_logging

if TYPE_CHECKING:
    from ortcompile.eps.resolved import ResolvedEp


def session_options(ep: ResolvedEp | None, dims: Mapping[str, int] | None = None, config: Mapping[str, str] | None = None, *,
                    provider_options: Mapping[str, str] | None = None, graph_optimization_level: Any = None,
                    log_severity: int | None = None) -> Any:
    """SessionOptions for `ep` (None: the CPU EP) with symbolic dims pinned and config entries set.

    `provider_options`: other options for the EP than its resolved ones (a probe of the user's values);
    `log_severity`: a level of its own (a probe reads the EP's warnings), else the configured one."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if log_severity is not None:
        options.log_severity_level = log_severity
    else:
        configure_session_logging(options)
    if graph_optimization_level is not None:
        options.graph_optimization_level = graph_optimization_level
    if ep is not None:
        ep.configure(options, provider_options)
        if ep.name != CPU_EP:
            note_ep_ran_here()  # about to compile or run with it here: no fork of this process asks the EP anything
    for name, value in (dims or {}).items():
        options.add_free_dimension_override_by_name(name, value)
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    return options
