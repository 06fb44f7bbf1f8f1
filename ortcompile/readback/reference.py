"""The source's outputs on the CPU EP, the reference a compiled model's outputs are judged against (issue 22).

On the HTP simulator the check is mostly the compiled model's runs; the reference (load and run of the source on
the CPU EP) used to follow them. For a small source it now runs beside them, on a thread of its own: ORT
releases the GIL in session creation and `run`, the simulator keeps about one core busy, and the reference takes
the other. A large source keeps the old order (the compiled session freed first), so a big model is never
held twice.

File descriptors are process-wide: `native_stdout_to_stderr` is not thread-safe (two threads saving and restoring
fd 1 could leave it pointing anywhere), so while both run, the thread that started the reference holds one
redirect for the pair and the reference thread never touches fd 1.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

from ortcompile.native import native_stdout_to_stderr
from ortcompile.readback.feeds import Arrays
from ortcompile.run.sessions import open_session, run_session

Outputs = list[Arrays]
# Beside the simulator, the reference's idle intra-op threads yield instead of spinning: spinning changes no output
# (the same kernels, the same split of the work) but burned 0.4-0.9 CPU s per check of the 2 cores the simulator
# runs on (rxnmap's 3 sets: 1.3-1.9 CPU s spinning, 0.95-0.97 not; the OCR detector's 4: 1.1-1.4 against 0.6).
NO_SPINNING = {"session.intra_op.allow_spinning": "0"}


class SourceReference:
    """The source's outputs for the same feeds: computed beside the compiled model's runs (`concurrent`) or after them."""

    def __init__(self, source: Path, dims: dict[str, int], config: dict[str, str], concurrent: bool) -> None:
        self.source, self.dims, self.config, self.concurrent = source, dims, config, concurrent
        self._future: Future[tuple[Outputs, float, float]] | None = None

    @contextlib.contextmanager
    def beside(self, feeds: list[Arrays]) -> Iterator[None]:
        """Around the compiled model's runs: with `concurrent`, the reference runs meanwhile; waited for on exit
        (also when those runs fail: no session outlives the check)."""
        if not self.concurrent:
            yield
            return
        with native_stdout_to_stderr(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference") as pool:
            self._future = pool.submit(self._compute, feeds, False)
            try:
                yield
            finally:
                wait([self._future])

    def outputs(self, feeds: list[Arrays]) -> tuple[Outputs, float, float]:
        """(outputs per feed, the reference session's load seconds, its run seconds); its errors raise here."""
        if self._future is not None:
            return self._future.result()
        return self._compute(feeds, True)

    def _compute(self, feeds: list[Arrays], redirect: bool) -> tuple[Outputs, float, float]:
        label = f"the source {self.source.name}"
        config = {**self.config, **(NO_SPINNING if self.concurrent else {})}
        reference = open_session(self.source, None, self.dims, config=config, label=f"{label} on the CPU EP", redirect_native=redirect)
        clock = time.perf_counter()
        expected = [run_session(reference.session, f, label, redirect_native=redirect) for f in feeds]
        seconds = time.perf_counter() - clock
        load = reference.seconds
        del reference
        gc.collect()
        return expected, load, seconds
