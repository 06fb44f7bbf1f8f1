"""How the library reports progress: a small protocol, a silent default, and a tqdm one for terminals."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Protocol


class Reporter(Protocol):
    def stage(self, name: str) -> None: ...

    def detail(self, message: str) -> None: ...

    def bytes_bar(self, description: str, total: int) -> Callable[[int], None]: ...

    def close(self) -> None: ...


class SilentReporter:
    """The library default: says nothing."""

    def stage(self, name: str) -> None:
        pass

    def detail(self, message: str) -> None:
        pass

    def bytes_bar(self, description: str, total: int) -> Callable[[int], None]:
        return lambda n: None

    def close(self) -> None:
        pass


class TerminalReporter:
    """Stages and a byte bar on stderr via tqdm (only when it is a terminal), -v details as lines."""

    def __init__(self, show_progress: bool, verbose: bool) -> None:
        self.show_progress = show_progress and sys.stderr.isatty()
        self.verbose = verbose
        self._bars: list[object] = []

    def stage(self, name: str) -> None:
        if self.verbose:
            self._write(f"ortcompile: {name}")
        elif self.show_progress:
            self._write(f"ortcompile: {name} ...")

    def detail(self, message: str) -> None:
        if self.verbose:
            self._write(f"ortcompile: {message}")

    def bytes_bar(self, description: str, total: int) -> Callable[[int], None]:
        if not self.show_progress:
            return lambda n: None
        from tqdm import tqdm

        bar = tqdm(total=total, desc=description, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr, leave=False)
        self._bars.append(bar)
        return bar.update

    def close(self) -> None:
        for bar in self._bars:
            bar.close()  # type: ignore[attr-defined]
        self._bars.clear()

    def _write(self, line: str) -> None:
        if self._bars:
            from tqdm import tqdm

            tqdm.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)
