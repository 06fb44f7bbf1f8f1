"""EPs this process registered from a library path (--ep-library), remembered once one loaded (loading.py), so
discovery's lookups find them by name (never in place of a packaged EP). Read on the --if-changed path: no imports."""

from __future__ import annotations

from ortcompile.eps.catalog import EpInfo

_BY_NAME: dict[str, EpInfo] = {}


def remember(info: EpInfo) -> None:
    _BY_NAME[info.ep_name] = info


def library_eps() -> list[EpInfo]:
    """In the order they were registered."""
    return list(_BY_NAME.values())
