"""The replica choice of one routing decision: the sticky replica while valid, else the least loaded.

This is the one place that decides which replica a request goes to; the balancer around it
checks that the request may be routed, counts it on the chosen replica and runs the retries. A
request routed before goes back to its sticky replica while that registration stays routable
(:mod:`.sticky`); any other goes to a replica with the fewest requests in flight
(:mod:`.inflight`), ties broken at random with a seeded RNG, so the same seed and the same calls
give the same routing. The RNG is drawn once (``random()``, scaled to the bucket's length) per
choice among two or more tied replicas and never otherwise; keep it so, or a seed's routing
(and every simulated run) changes.
"""

from __future__ import annotations

import random

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

    def choose(self, request_id: str, h: int) -> str:
        """The replica id for ``request_id`` (``h`` its hash); at least one replica must be routable.

        A new choice becomes the request's sticky replica; the caller counts the request on it.
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
        index = self._index
        bucket = index.buckets[index.lowest]
        rid = bucket[int(self._rng.random() * len(bucket))] if len(bucket) > 1 else bucket[0]
        if sticky.capacity:
            shard[request_id] = sticky.epoch[rid]
            if len(shard) > sticky.shard_capacity:
                shard.popitem(last=False)  # the shard's least recently used
        return rid
