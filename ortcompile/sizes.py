"""Sizes as users write them (4096, 4K, 64MiB, 2G): the command line's and the config file's one parser."""

from __future__ import annotations

import re
from typing import Any

# K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024; KB/MB/GB/TB powers of 1000.
SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6, "mib": 1 << 20,
              "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40, "tb": 10**12, "tib": 1 << 40}


def parse_size(value: Any) -> int | None:
    """A size (an int, or a string such as "64MiB"); None when it is not one."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", value) if isinstance(value, str) else None
    if not match or match.group(2).lower() not in SIZE_UNITS:
        return None
    return int(match.group(1)) * SIZE_UNITS[match.group(2).lower()]


def format_size(size: int) -> str:
    """'512 B', '768.0 KiB', '1.5 MiB', '2.0 GiB': never '0 MiB' for a size under a MiB."""
    value = float(size)
    for unit in ("B", "KiB", "MiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
