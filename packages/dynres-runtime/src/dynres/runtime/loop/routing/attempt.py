"""The record of one attempt of a request on a replica, from its route to its release.

``LoadBalancer.generate`` keeps one :class:`Attempt` per running attempt (in a sharded table, see
:mod:`.shards`) instead of parallel dicts of tasks and futures: eviction finds the task to
cancel in it, and the batched-abort hand-back (:mod:`.pacing`) the future to complete.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from dynres.runtime.protocols import GenerationRequest, GenerationResult, Replica, pass_outcome


class Attempt:
    """What generate() keeps about one attempt running on a replica (from route to release)."""

    __slots__ = ("fut", "replica_id", "serial", "task", "waiter")

    def __init__(self, replica_id: str, task: asyncio.Task[Any] | None) -> None:
        """An attempt on ``replica_id`` run by the generate() ``task``."""
        self.replica_id = replica_id
        """The replica it runs on."""
        self.task = task
        """The generate() task awaiting it (eviction cancels it)."""
        self.fut: asyncio.Future[GenerationResult] | None = None
        """A batched replica's future of the result."""
        self.waiter: asyncio.Future[GenerationResult] | None = None
        """What the task awaits instead of ``fut`` (a batch abort's hand-back completes it)."""
        self.serial = 0
        """Batch-abort serial when it started: only aborts with this serial or later answer it."""

    def submit(self, replica: Replica, request: GenerationRequest, serial: int) -> asyncio.Future[GenerationResult]:
        """Submit ``request`` to a batched ``replica``; return the future the request waits on.

        ``serial`` is the batch-abort serial at the start (see :meth:`RetryPacer.new_abort`).
        """
        waiter: asyncio.Future[GenerationResult] = asyncio.get_running_loop().create_future()
        fut = replica.submit(request)  # type: ignore[attr-defined]  # a BatchedReplica: takes_batched_path said so
        self.fut, self.waiter, self.serial = fut, waiter, serial
        fut.add_done_callback(functools.partial(pass_outcome, waiter))
        return waiter
