"""The run's clock: event-loop time only, so the same code runs on a virtual-time loop.

Runtime code reads time exclusively through :func:`now` (or a :class:`RunClock`) and waits only
through ``asyncio`` primitives. The simulator installs a virtual-time event loop, so every
duration measured here is virtual there and real in a real run. :func:`wall` is the one
exception: it measures how much real CPU time dynres itself spends (controller overhead) and is
reported separately, never fed into a decision.
"""

from __future__ import annotations

import asyncio
import time


def now() -> float:
    """Current time of the running event loop (seconds; virtual under the simulator)."""
    return asyncio.get_running_loop().time()


def wall() -> float:
    """Real elapsed time for profiling dynres's own overhead (seconds; never used in decisions)."""
    return time.perf_counter()


class RunClock:
    """Seconds since a run started, on the event loop's clock (all report timestamps use it).

    Built before the loop runs; it reads 0 until :meth:`begin` is called inside the loop.
    """

    def __init__(self) -> None:
        """A clock that has not started yet."""
        self.start: float | None = None
        """Loop time at which the run started (seconds); None before :meth:`begin`."""

    def begin(self) -> None:
        """Start counting now (loop seconds); needs a running event loop."""
        self.start = now()

    def elapsed(self) -> float:
        """Seconds since the run started (>= 0; 0 before :meth:`begin`)."""
        if self.start is None:
            return 0.0
        return max(0.0, now() - self.start)
