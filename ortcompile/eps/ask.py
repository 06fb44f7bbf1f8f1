"""What is asked of one EP, read from the catalog alone: the resolve pipeline's first stage (resolution.py).

Pure: nothing is loaded, so a mistyped option key or two options that choose the same thing are usage errors before
onnxruntime or a plugin is touched. Kept out of catalog.py: the catalog is read on the --help and --if-changed paths,
which never resolve an EP.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortcompile.eps.catalog import EpInfo, check_option_keys
from ortcompile.errors import UsageError


@dataclass(frozen=True)
class EpAsk:
    """What is asked of one EP, read from the catalog alone (the resolve pipeline's first stage): the user's provider
    options, checked; the target named (found by the targets stage); warnings to tell."""

    info: EpInfo
    options: dict[str, str]  # the user's --ep-option values
    target: str | None  # --target as given
    notes: tuple[str, ...] = ()  # undocumented option keys, passed on
    replaced: frozenset[str] = frozenset()  # injected options the user's options replace (QNN: backend_type for backend_path)

    @property
    def lists_virtual(self) -> bool:
        """A device target is named: the EP's virtual devices are listed too (they may be the target)."""
        return self.info.target_kind == "device" and self.target is not None


def ask_for(info: EpInfo, options: dict[str, str], target: str | None) -> EpAsk:
    """Check the user's options against the catalog: a likely typo or two options that choose the same thing are
    usage errors before anything is loaded."""
    notes = check_option_keys(info, options)
    for first, second in info.exclusive:
        if first in options and second in options:
            raise UsageError(f"{info.short_name}: --ep-option {first} and {second} choose the same thing; give only one "
                             f"({first} is enough: ortcompile then leaves out its own {second})")
    replaced = frozenset(injected for user_key, injected in info.replaces if user_key in options)
    return EpAsk(info, dict(options), target, tuple(notes), replaced)
