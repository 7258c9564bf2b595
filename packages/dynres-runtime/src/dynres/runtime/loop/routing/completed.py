"""Completed request ids for duplicate detection, in two sharded generations (bounded memory).

A request that completes twice is a bug the run counts (``BalancerCounters.duplicates``). The ids
are kept in two generations, each split over ``SHARDS`` sets by the id's hash (see
:mod:`.shards`): a lookup checks both; when the newer one holds ``window`` ids it becomes the
older one and the old one is dropped, in O(1). The last ``window`` completions are therefore
always remembered, and never more than twice that many, however long the run.
"""

from __future__ import annotations

from dynres.runtime.loop.routing.shards import MASK, new_shards


class CompletedIds:
    """Ids of completed requests: the newest ``window`` at least, ``2 x window`` at most."""

    __slots__ = ("_n_new", "_new", "_old", "window")

    def __init__(self, window: int) -> None:
        """Create an empty set that remembers at least ``window`` ids (count; at least 1)."""
        self.window = max(1, window)
        """Completed ids always remembered (count); the newer generation turns old at this size."""
        self._new: list[set[str]] = new_shards(set)
        self._old: list[set[str]] = new_shards(set)
        self._n_new = 0

    def add(self, request_id: str) -> bool:
        """Remember ``request_id`` as completed; True when it was remembered already (a duplicate)."""
        h = hash(request_id) & MASK
        new = self._new[h]
        in_new = request_id in new
        seen = in_new or request_id in self._old[h]
        if not in_new:
            new.add(request_id)
            self._n_new += 1
            if self._n_new >= self.window:
                self._old = self._new
                self._new = new_shards(set)
                self._n_new = 0
        return seen

    @property
    def remembered(self) -> int:
        """Ids kept now (count; at most twice the window)."""
        return self._n_new + sum(map(len, self._old))
