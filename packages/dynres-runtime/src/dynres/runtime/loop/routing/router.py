"""The replica choice of one routing decision: the sticky replica while valid, else the least loaded.

This is the one place that decides which replica a request goes to; the balancer around it
checks that the request may be routed, counts it on the chosen replica and runs the retries. A
request routed before goes back to its sticky replica while that registration stays routable
(:mod:`.sticky`); any other goes where the policy's request decision says (:mod:`.decider`, only
when the policy makes one), else to a replica with the fewest requests in flight
(:mod:`.inflight`), ties broken at random with a seeded RNG, so the same seed and the same calls
give the same routing. The RNG is drawn once (``random()``, scaled to the bucket's length) per
choice among two or more tied replicas and never otherwise; keep it so, or a seed's routing
(and every simulated run) changes. A policy's choice (``pick``) draws nothing either.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from dynres.runtime.loop.routing.inflight import InflightIndex
from dynres.runtime.loop.routing.sticky import StickyTable


class Router:
    """Chooses a replica per request: sticky while valid, else least in flight with a seeded tie-break."""

    __slots__ = ("_index", "_rng", "_sticky")

    def __init__(self, index: InflightIndex, sticky: StickyTable, seed: int) -> None:
        """Choose among the replicas of ``index``, sticking through ``sticky``; ``seed`` seeds the tie-break."""
        self._index = index
        self._sticky = sticky
        self._rng = random.Random(seed)

    def choose(self, request_id: str, h: int, pick: Callable[[], str | None] | None = None) -> str:
        """The replica id for ``request_id`` (``h`` its hash); at least one replica must be routable.

        Without a valid sticky entry, ``pick`` (the policy's choice, :mod:`.decider`) is asked
        first; its None, or no ``pick``, leaves the choice to the least-in-flight rule. A new
        choice becomes the request's sticky replica; the caller counts the request on it.
        """
        # The sticky table's lookup and insert, made on its shard here (see sticky.py for why).
        sticky = self._sticky
        shard = sticky.shards[h & sticky.mask]
        epoch = shard.get(request_id)
        if epoch is not None:
            rid = sticky.registration.get(epoch)
            if rid is not None:
                shard.move_to_end(request_id)  # most recently used
                return rid
            del shard[request_id]  # its registration ended
        rid = pick() if pick is not None else None
        if rid is None:
            index = self._index
            bucket = index.buckets[index.lowest]
            rid = bucket[int(self._rng.random() * len(bucket))] if len(bucket) > 1 else bucket[0]
        if sticky.capacity:
            shard[request_id] = sticky.epoch[rid]
            if len(shard) > sticky.shard_capacity:
                shard.popitem(last=False)  # the shard's least recently used
        return rid
