"""Event-loop lag monitor: proves that nothing blocks an actor's asyncio loop.

An async Ray actor serves every call on one event loop. One blocking call inside it (a
``ray.get``, a synchronous engine call, ``time.sleep``) freezes all other calls of that actor,
which is how the reference implementation hung. The monitor ticks every ``interval_s`` and
records the longest wall-clock gap between two ticks; a healthy loop shows gaps close to the
interval, a blocked one shows the length of the block.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class LoopLag:
    """What a :class:`LoopLagMonitor` measured since its last reset."""

    interval_s: float
    """Tick interval asked for (seconds)."""
    max_gap_s: float
    """Longest wall time between two consecutive ticks (seconds); about ``interval_s`` when healthy."""
    ticks: int
    """Ticks seen (count)."""
    window_s: float
    """Wall time covered since the reset (seconds)."""


class LoopLagMonitor:
    """Tick on the running loop every ``interval_s`` seconds and keep the worst gap (wall clock)."""

    def __init__(self, interval_s: float = 0.01) -> None:
        """Create a stopped monitor ticking every ``interval_s`` seconds once started."""
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0 seconds")
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._max_gap = 0.0
        self._ticks = 0
        # Wall clock on purpose: this profiles the loop itself and never feeds a decision.
        self._since = self._last = time.perf_counter()

    def start(self) -> None:
        """Start ticking on the running loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="dynres-loop-lag")

    async def stop(self) -> None:
        """Stop ticking."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def reset(self) -> None:
        """Forget what was measured so far."""
        self._max_gap = 0.0
        self._ticks = 0
        # A gap that began before the reset is not counted against the new window.
        self._since = self._last = time.perf_counter()

    def snapshot(self, reset: bool = False) -> LoopLag:
        """Return the measurements (and optionally reset them)."""
        lag = LoopLag(self.interval_s, self._max_gap, self._ticks, time.perf_counter() - self._since)
        if reset:
            self.reset()
        return lag

    async def _run(self) -> None:
        self._last = time.perf_counter()
        while True:
            await asyncio.sleep(self.interval_s)
            now = time.perf_counter()
            self._max_gap = max(self._max_gap, now - self._last)
            self._ticks += 1
            self._last = now
