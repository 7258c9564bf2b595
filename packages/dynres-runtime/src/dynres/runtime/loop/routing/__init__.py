"""Request routing: which replica runs each request, and the retry loop around that choice.

One job per module:

- ``router.py``: the replica choice (sticky while valid, else least in flight, seeded tie-break);
- ``inflight.py``: the in-flight-count bucket index (the least loaded in O(1));
- ``sticky.py``: the sharded, epoch-checked sticky-session LRU;
- ``completed.py``: the two-generation completed-id set (duplicate detection);
- ``pacing.py``: retry slots per loop iteration and the batched-abort hand-back;
- ``rebalance.py``: rebalance planning (target, newest picks, the moved ranges);
- ``attempt.py``: the record of one running attempt;
- ``shards.py``: how the per-request tables are split;
- ``balancer.py``: :class:`LoadBalancer`, which composes them (membership, the generate() retry
  loop, eviction, draining, waiters).
"""

from dynres.runtime.loop.routing.balancer import BalancerCounters, LoadBalancer

__all__ = ["BalancerCounters", "LoadBalancer"]
