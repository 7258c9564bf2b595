"""Retry pacing: retries, and batch-aborted results handed back, at most ``retry_batch`` per loop iteration.

Retries come in bursts: a deactivation or a rebalance aborts thousands of requests at once. Each
retry first takes one of the ``retry_batch`` slots of the current loop iteration
(:meth:`RetryPacer.slot`); a pump scheduled with ``call_soon`` runs once per iteration while
retries are pending, refills the slots and wakes at most ``retry_batch`` waiting retries (they
run in the next iteration). Full garbage collections are deferred until the burst is routed
(see loop/gc_control.py).

**Batched aborts.** A replica that implements :class:`~dynres.runtime.protocols.BatchedReplica`
(``submit`` + ``abort_batch``) runs each attempt as a future the balancer watches through one
callback (:meth:`Attempt.submit <dynres.runtime.loop.routing.attempt.Attempt.submit>`), and
``LoadBalancer.abort_batch`` takes all of a replica's aborted requests back in one reply. The
pump hands those results to their requests at most ``retry_batch`` per iteration (then they are
retried, again at most ``retry_batch`` per iteration), so a deactivation of hundreds of replicas
with tens of thousands of requests in flight never puts more than a few dozen request wake-ups
into one loop iteration, and the replicas can sleep as soon as they have answered. A result is
handed only to the attempt it belongs to: one that started on that replica before the abort and
is still waiting. Other replicas are awaited as before.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from dynres.runtime.loop.gc_control import defer_full_collections, resume_full_collections
from dynres.runtime.loop.routing.attempt import Attempt
from dynres.runtime.loop.routing.shards import MASK
from dynres.runtime.protocols import GenerationResult


class RetryPacer:
    """Retry slots per loop iteration and the paced hand-back of batch-aborted results."""

    __slots__ = (
        "_attempts",
        "_budget",
        "_handback",
        "_pending",
        "_pump_scheduled",
        "_stretch",
        "_waiters",
        "abort_serial",
        "retry_batch",
    )

    def __init__(self, retry_batch: int, attempts: list[dict[str, Attempt]]) -> None:
        """Pace ``retry_batch`` per iteration (count, at least 1) over the balancer's sharded ``attempts``."""
        self.retry_batch = max(1, retry_batch)
        """Most retries woken, and most batch-aborted results handed back, per loop iteration (count)."""
        self.abort_serial = 0
        """Serial of the next batch abort (count of batch aborts started)."""
        self._attempts = attempts
        self._budget = self.retry_batch
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._pump_scheduled = False
        self._stretch = False  # full collections deferred (a burst is being routed)
        # Batches of aborted results not yet handed back: [replica id, serial, results, next index].
        self._handback: deque[list] = deque()
        self._pending = 0

    @property
    def pending(self) -> int:
        """Aborted requests not yet handed back or not yet woken to be routed again (count)."""
        return self._pending + len(self._waiters)

    async def slot(self) -> None:
        """Wait for one of the ``retry_batch`` retry slots of the current loop iteration."""
        if self._budget > 0 and not self._waiters:
            self._budget -= 1
            self._schedule()
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._schedule()
        await fut

    def new_abort(self) -> int:
        """The serial of a batch abort starting now; attempts started from now on are not part of it."""
        serial = self.abort_serial
        self.abort_serial += 1
        return serial

    def hand_back(self, replica_id: str, serial: int, results: Sequence[GenerationResult]) -> None:
        """Queue the ``results`` of batch abort ``serial`` on ``replica_id`` for their attempts (paced)."""
        if len(results):
            self._handback.append([replica_id, serial, results, 0])
            self._pending += len(results)
            self._schedule()

    def _schedule(self) -> None:
        if not self._pump_scheduled:
            if not self._stretch:
                self._stretch = True
                defer_full_collections()
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        # Runs once per loop iteration while retries are pending: refills the budget and wakes
        # at most retry_batch waiting retries (they run in the next iteration).
        self._pump_scheduled = False
        self._budget = self.retry_batch
        waiters = self._waiters
        while waiters and self._budget > 0:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                self._budget -= 1
        if self._handback:
            self._deliver(self.retry_batch)
        if waiters or self._budget < self.retry_batch or self._handback:
            self._schedule()
        elif self._stretch:
            self._stretch = False
            resume_full_collections()

    def _deliver(self, budget: int) -> None:
        """Deliver up to ``budget`` batch-aborted results to the attempts still waiting for them."""
        queue = self._handback
        while budget > 0 and queue:
            item = queue[0]
            rid, serial, results, i = item
            end = min(len(results), i + budget)
            shards = self._attempts
            for k in range(i, end):
                res = results[k]
                req_id = res.request_id
                att = shards[hash(req_id) & MASK].get(req_id)
                # Only the attempt the result belongs to: on this replica, started before the
                # abort, still waiting (not evicted, cancelled or retried meanwhile).
                if (
                    att is not None
                    and att.replica_id == rid
                    and att.waiter is not None
                    and att.serial <= serial
                    and not att.waiter.done()
                ):
                    att.waiter.set_result(res)
            budget -= end - i
            self._pending -= end - i
            if end == len(results):
                queue.popleft()
            else:
                item[3] = end
