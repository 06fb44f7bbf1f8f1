"""Resolving an EP: the pipeline from the EP chosen by name (discovery.EpChoice) to a ResolvedEp.

Each stage lives in its own module, is entered once, and hands a small record down:

1. ask.ask_for               what is asked, from the catalog alone: option keys, options that exclude each other (EpAsk)
2. validate.probe_library    a library given by path is loaded in a child process first
3. loading.load              the library registered, the devices listed (Loaded)
4. matching.match_target   the target among the tables or the devices, the devices that fit it, the options (Matched)
5. validate.validate_options (compiles) the option values checked by the EP itself, in a child process

A failure to load (2, 3) is told by stage 4, after an option target was looked up: a mistyped --target is a usage
error whatever the state of the EP. `--ep auto` runs the pipeline for each candidate in turn.
"""

from __future__ import annotations

import warnings

from ortcompile.eps.ask import ask_for
from ortcompile.eps.catalog import EpInfo
from ortcompile.eps.discovery import EpChoice
from ortcompile.eps.loading import Loaded, load
from ortcompile.eps.matching import match_target
from ortcompile.eps.resolved import ResolvedEp
from ortcompile.eps.validate import probe_library, validate_options
from ortcompile.errors import ComponentMissing, EpUnavailable, OrtCompileWarning, UsageError


def resolve_choice(choice: EpChoice, options: dict[str, str], target: str | None, validate: bool) -> ResolvedEp:
    """The first of the choice's candidates that resolves: the EP named, or for `auto` the first that is available
    (and, given a target, owns it)."""
    refusals = []
    for info in choice.candidates:
        try:
            return _resolve_one(info, options, target, validate)
        except EpUnavailable:
            if choice.named is not None:
                raise
        except UsageError as exc:  # a target name another EP may own
            if choice.named is not None or target is None:
                raise
            refusals.append(exc.message)
    raise UsageError(f"no available execution provider has target {target!r}; " + "; ".join(refusals) if refusals
                     else "no execution provider is available")


def _resolve_one(info: EpInfo, options: dict[str, str], target: str | None, validate: bool) -> ResolvedEp:
    """The pipeline for one EP; its warnings are told once, in order: option keys, the EP's package, the target."""
    ask = ask_for(info, options, target)
    try:
        probe_library(info)
        loaded = load(ask)
    except (EpUnavailable, ComponentMissing) as failure:  # kept: match_target raises it after an option target
        loaded = Loaded(info, failure=failure)
    matched = match_target(ask, loaded)
    resolved = ResolvedEp(info, matched.devices[:1], matched.options, loaded.version, matched.target, matched.overridden,
                          defaults=matched.defaults)
    notes = [*ask.notes, *loaded.notes, *matched.notes]
    if validate and (options or target is not None):
        notes.extend(validate_options(resolved, options, explicit_target=target is not None))
    for note in notes:
        warnings.warn(note, OrtCompileWarning, stacklevel=4)  # at the caller of registry.resolve
    resolved.warnings = notes
    return resolved
