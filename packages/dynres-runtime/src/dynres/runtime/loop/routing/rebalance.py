"""Rebalance planning: which running requests to move so every routable replica ends near the mean load.

Only replicas above the target ``ceil(total / replicas)`` give requests away, their most recently
started first (they have the least output to re-prefill). The picks are remembered as one range
of routing sequence numbers per replica (a replica's newest ``c - target`` attempts are
consecutive in its table, which lists them in routing order), not per request: tens of
thousands of picks would otherwise cost as many writes inside one loop iteration. The balancer
asks :meth:`RebalancePlanner.is_moved` when an attempt ends, and a moved request loses its sticky
entry there, so its retry goes to the least loaded replicas (the new ones). Ranges whose
attempts have all ended are dropped by the next plan.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from itertools import islice

from dynres.runtime.loop.routing.inflight import InflightIndex


class RebalancePlanner:
    """Plans rebalances over the balancer's counts and running tables; remembers what each plan picked."""

    __slots__ = ("_by_replica", "_index", "moved")

    def __init__(self, index: InflightIndex, by_replica: dict[str, dict[str, int]]) -> None:
        """Plan over ``index`` (routable replicas) and ``by_replica`` (replica -> running ids -> routing numbers)."""
        self._index = index
        self._by_replica = by_replica
        self.moved: dict[str, list[tuple[int, int]]] = {}
        """Replica id -> ``[lo, hi)`` ranges of routing numbers a plan picked there (changed in place only)."""

    def plan(self, next_seq: int) -> dict[str, list[str]]:
        """Replica id -> the request ids to move off it; ``next_seq``: the next attempt's routing number."""
        target = self.target(next_seq)
        return {
            rid: self.pick_newest(rid, c - target, next_seq) for rid, c in list(self._index.count.items()) if c > target
        }

    async def plan_spread(self, next_seq: Callable[[], int], ids_per_iteration: int) -> dict[str, list[str]]:
        """:meth:`plan`, picking at most about ``ids_per_iteration`` request ids per loop iteration.

        Listing tens of thousands of ids holds the loop for milliseconds on its own. One
        replica's picks are made at once (its newest at that moment); the target is the mean
        load when the call starts. ``next_seq`` reads the next routing number (it advances
        while the plan waits).
        """
        target = self.target(next_seq())
        counts = self._index.count
        plan: dict[str, list[str]] = {}
        picked = 0
        for rid in list(counts):
            c = counts.get(rid)  # None: it left routing while the plan was being made
            if c is not None and c > target:
                plan[rid] = self.pick_newest(rid, c - target, next_seq())
                picked += c - target
                if picked >= ids_per_iteration:
                    picked = 0
                    await asyncio.sleep(0)
        return plan

    def target(self, next_seq: int) -> int:
        """Most requests a replica keeps (``ceil(total / replicas)``); drops the ranges of ended plans."""
        moved = self.moved
        for rid, ranges in list(moved.items()):
            attempts = self._by_replica.get(rid)
            oldest = next(iter(attempts.values())) if attempts else next_seq
            kept = [r for r in ranges if r[1] > oldest]
            if kept:
                moved[rid] = kept
            else:
                del moved[rid]
        counts = self._index.count
        n = len(counts)
        return -(-sum(counts.values()) // n) if n else 0

    def pick_newest(self, rid: str, k: int, next_seq: int) -> list[str]:
        """The ``k`` newest requests on ``rid``, oldest first, remembered as moved."""
        attempts = self._by_replica[rid]
        # Without copying the replica's whole table.
        newest = list(islice(reversed(attempts), k))
        newest.reverse()
        lo = next(islice(reversed(attempts.values()), k - 1, None))
        self.moved.setdefault(rid, []).append((lo, next_seq))  # attempts routed later are not in it
        return newest

    def is_moved(self, replica_id: str, seq: int) -> bool:
        """True when a plan picked the attempt with routing number ``seq`` on ``replica_id``."""
        return any(lo <= seq < hi for lo, hi in self.moved.get(replica_id, ()))
