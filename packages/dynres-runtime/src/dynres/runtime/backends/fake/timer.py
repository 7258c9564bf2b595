"""What keeps hundreds of fake replicas cheap on the coordinator's loop: one timer, one budget.

A fake replica stands in for an engine in another process, but its work runs on the caller's
event loop. Two pieces keep that work from showing up as the runtime's own cost at 512 + 512
replicas with 100,000 requests in flight (measured in docs/scaling.md with
``benchmarks/scale_bench.py``):

* :class:`WakeupTimer`: the wake-ups of one replica's requests in a heap of its own behind one
  loop timer, instead of one loop timer per request;
* :class:`TakeOutBudget`: the request ids all fakes on a loop may take out in ``abort_batch``
  per loop iteration, so a rebalance over many replicas cannot hold an iteration.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import weakref
from collections import deque
from typing import ClassVar, Protocol


class Wakeable(Protocol):
    """Something a :class:`WakeupTimer` wakes: a request in flight on a fake replica."""

    def wake(self) -> None:
        """Re-evaluate now (a wake-up may come early or stale; the item checks its own state)."""


class WakeupTimer:
    """The wake-ups of one replica's requests: a heap of (loop time, order, item) behind one loop timer.

    A loop timer per request would put every request in flight into the coordinator loop's own
    timer heap, whose every push and pop (the runtime's timeouts and sleeps included) then costs
    about log2(requests) Python-level comparisons with cache misses. This heap holds only one
    replica's requests, and the loop's heap one entry per replica.
    """

    __slots__ = ("_at", "_handle", "_heap", "_order")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Wakeable]] = []
        self._order = 0  # ties on time wake in the order they were asked for; items are never compared
        self._handle: asyncio.TimerHandle | None = None
        self._at = math.inf

    def wake_at(self, loop: asyncio.AbstractEventLoop, when: float, item: Wakeable) -> None:
        """Wake ``item`` at loop time ``when``."""
        self._order += 1
        heapq.heappush(self._heap, (when, self._order, item))
        if when < self._at:
            if self._handle is not None:
                self._handle.cancel()
            self._at = when
            self._handle = loop.call_at(when, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        due = max(loop.time(), self._at)  # the loop runs a timer up to a clock tick early
        self._handle, self._at = None, math.inf
        heap = self._heap
        while heap and heap[0][0] <= due:
            heapq.heappop(heap)[2].wake()
        # A woken item may have asked for a new wake-up, and so set the timer already.
        if heap and self._handle is None:
            self._at = heap[0][0]
            self._handle = loop.call_at(self._at, self._fire, loop)


class TakeOutBudget:
    """Request ids that all fake replicas on one loop take out in ``abort_batch(ids)`` per iteration.

    Taking a request out is the engine's work, done in its own process by a real engine; a fake
    does it on the caller's loop. A budget per replica does not bound an iteration: with many
    replicas each yielding after a small chunk, hundreds of abort tasks step in every iteration
    of a rebalance, and a few replicas taking large chunks at once hold single iterations. One
    budget for the loop bounds an iteration whatever the number of replicas, and a replica
    waiting for its share is woken only when it gets one (FIFO).
    """

    PER_ITERATION = 1024
    """Ids taken out per loop iteration by all fakes together (count). Each id costs the fake
    its token count too; a larger budget held consecutive iterations long enough to show as the
    coordinator's loop lag (docs/scaling.md)."""

    _by_loop: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, TakeOutBudget]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._left = self.PER_ITERATION
        self._waiters: deque[tuple[int, asyncio.Future[int]]] = deque()
        self._refill_scheduled = False

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> TakeOutBudget:
        """The budget of ``loop`` (created on first use)."""
        budget = cls._by_loop.get(loop)
        if budget is None:
            budget = cls._by_loop[loop] = cls(loop)
        return budget

    async def take(self, want: int) -> int:
        """How many of ``want`` ids (>= 1) the caller may take out now; waits for a later iteration if none."""
        if self._left > 0 and not self._waiters:
            n = min(want, self._left)
            self._left -= n
            self._schedule_refill()
            return n
        fut: asyncio.Future[int] = self._loop.create_future()
        self._waiters.append((want, fut))
        self._schedule_refill()
        return await fut

    def _schedule_refill(self) -> None:
        if not self._refill_scheduled:
            self._refill_scheduled = True
            self._loop.call_soon(self._refill)

    def _refill(self) -> None:
        # Next iteration: a fresh budget, granted to the waiters in order.
        self._refill_scheduled = False
        self._left = self.PER_ITERATION
        waiters = self._waiters
        while waiters and self._left > 0:
            want, fut = waiters.popleft()
            if fut.done():  # its abort was cancelled
                continue
            n = min(want, self._left)
            self._left -= n
            fut.set_result(n)
        if waiters or self._left < self.PER_ITERATION:
            self._schedule_refill()
