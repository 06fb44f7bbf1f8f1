"""How the library reports progress: a small protocol, a silent default, and a terminal one.

On a terminal, a long stage shows its elapsed time (a QNN compile can take minutes with no other sign
of life) and the data pass a byte bar. When stderr is not a terminal (CI logs, make, pipes) each stage is
one plain line, with no bars or carriage returns (as pip does), so a long compile does not look hung. The
line is written once the stage is under way (the first wait for the worker child, its byte count, or the next
stage), so a command refused while planning prints its one error line alone. With -v every stage and detail
is a plain line as it happens; with -q (or --json) no progress is printed, only errors and warnings.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Protocol

SPINNER_AFTER = 1.0  # seconds a stage runs before its elapsed time is shown
SPINNER_EVERY = 0.5


class Reporter(Protocol):
    def stage(self, name: str) -> None: ...

    def detail(self, message: str) -> None: ...

    def bytes_bar(self, description: str, total: int) -> Callable[[int], None]: ...

    def tick(self) -> None: ...

    def close(self) -> None: ...


class SilentReporter:
    """The library default: says nothing."""

    def stage(self, name: str) -> None:
        pass

    def detail(self, message: str) -> None:
        pass

    def bytes_bar(self, description: str, total: int) -> Callable[[int], None]:
        return lambda n: None

    def tick(self) -> None:
        pass

    def close(self) -> None:
        pass


class TerminalReporter:
    """Stages on stderr: with elapsed time and a byte bar via tqdm on a terminal, plain lines elsewhere; -v details as lines."""

    def __init__(self, show_progress: bool, verbose: bool) -> None:
        self.show_progress = show_progress
        self.interactive = show_progress and sys.stderr.isatty()  # spinner and bars; else one line per stage
        self.verbose = verbose
        self._bars: list[object] = []
        self._stage = ""
        self._stage_started = 0.0
        self._last_tick = 0.0
        self._spinning = False
        self._pending = ""  # not a terminal: the current stage's line, written once the stage is under way

    def stage(self, name: str) -> None:
        self._end_spinner()
        self._flush_pending()  # the previous stage got as far as the next one
        self._stage, self._stage_started = name, time.monotonic()
        if self.verbose:
            self._write(f"ortcompile: {name}")
        elif self.show_progress and not self.interactive:
            self._pending = name
        elif self.show_progress:
            self._write(f"ortcompile: {name} ...")

    def _flush_pending(self) -> None:
        if self._pending:
            self._write(f"ortcompile: {self._pending}")
            self._pending = ""

    def detail(self, message: str) -> None:
        if self.verbose:
            self._end_spinner()
            self._write(f"ortcompile: {message}")

    def tick(self) -> None:
        """Called while waiting: after a second, keep the current stage's elapsed time on one updating line."""
        self._flush_pending()
        if not self.interactive or self.verbose or self._bars or not self._stage:
            return
        now = time.monotonic()
        if now - self._stage_started < SPINNER_AFTER or now - self._last_tick < SPINNER_EVERY:
            return
        self._last_tick, self._spinning = now, True
        sys.stderr.write(f"\rortcompile: {self._stage} ... {now - self._stage_started:.0f}s")
        sys.stderr.flush()

    def bytes_bar(self, description: str, total: int) -> Callable[[int], None]:
        self._flush_pending()
        if not self.interactive:
            return lambda n: None
        from tqdm import tqdm

        self._end_spinner()
        bar = tqdm(total=total, desc=description, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr, leave=False)
        self._bars.append(bar)
        return bar.update

    def close(self) -> None:
        self._end_spinner()
        for bar in self._bars:
            bar.close()  # type: ignore[attr-defined]
        self._bars.clear()

    def _end_spinner(self) -> None:
        if self._spinning:
            sys.stderr.write("\n")
            self._spinning = False

    def _write(self, line: str) -> None:
        if self._bars:
            from tqdm import tqdm

            tqdm.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)
