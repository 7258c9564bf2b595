"""In-flight-count index of the routable replicas: the least loaded in O(1), counts moved in O(1).

Replicas are kept in buckets indexed by their in-flight count, with a pointer to the lowest
non-empty bucket, so a routing decision and a release are O(1) amortized whatever the number of
requests in flight: a route moves one replica up one bucket (the pointer moves up by at most
one), a release moves one down (the pointer moves down to it at most). Only removing replicas may
scan the buckets for the new lowest, and one scan up from the old pointer covers a whole batch of
removals (removals only raise the lowest load); they are rare.
"""

from __future__ import annotations

from dynres.core.errors import RuntimeStateError


class InflightIndex:
    """Routable replica ids bucketed by their requests in flight, with the lowest non-empty bucket."""

    __slots__ = ("buckets", "count", "lowest", "pos")

    def __init__(self) -> None:
        """Create an empty index."""
        self.count: dict[str, int] = {}
        """Routable replica id -> requests counted on it (count)."""
        self.buckets: list[list[str]] = [[]]
        """``buckets[c]``: the replicas with ``c`` requests in flight, in no particular order."""
        self.pos: dict[str, int] = {}
        """Replica id -> its index in its bucket (a removal swaps the bucket's last id into its place)."""
        self.lowest = 0
        """Smallest in-flight count of a routable replica (count; 0 when there is none)."""

    def add(self, replica_id: str, c: int) -> None:
        """Index ``replica_id`` with ``c`` requests in flight (attempts of an earlier registration)."""
        self.count[replica_id] = c
        self._put(replica_id, c)
        self.lowest = c if len(self.count) == 1 else min(self.lowest, c)

    def remove(self, replica_id: str) -> int:
        """Take ``replica_id`` out and return its count; call :meth:`refresh_lowest` after the batch."""
        c = self.count.pop(replica_id)
        self._take(replica_id, c)
        return c

    def refresh_lowest(self) -> None:
        """Point at the lowest non-empty bucket again after removals (one scan up from the old one)."""
        if not self.count:
            self.lowest = 0
            return
        buckets = self.buckets
        if not buckets[self.lowest]:
            self.lowest = next((c for c in range(self.lowest, len(buckets)) if buckets[c]), 0)

    # up() and down() inline the moves of _take and _put: one of each runs per routing decision
    # (route + release), where two more method calls each would cost a few percent of it.

    def up(self, replica_id: str) -> None:
        """Count one more request on the routable ``replica_id``."""
        count, pos, buckets = self.count, self.pos, self.buckets
        c = count[replica_id]
        b = buckets[c]
        i = pos[replica_id]
        last = b.pop()
        if last != replica_id:
            b[i] = last
            pos[last] = i
        if len(buckets) == c + 1:
            buckets.append([])
        above = buckets[c + 1]
        pos[replica_id] = len(above)
        above.append(replica_id)
        count[replica_id] = c + 1
        if c == self.lowest and not b:
            self.lowest = c + 1

    def down(self, replica_id: str) -> None:
        """Count one request less on ``replica_id``; nothing when it is not routable (removed meanwhile)."""
        count = self.count
        c = count.get(replica_id)
        if c is None:
            return
        if c <= 0:
            raise RuntimeStateError(f"in-flight count of replica {replica_id!r} would go negative")
        pos, buckets = self.pos, self.buckets
        b = buckets[c]
        i = pos[replica_id]
        last = b.pop()
        if last != replica_id:
            b[i] = last
            pos[last] = i
        below = buckets[c - 1]
        pos[replica_id] = len(below)
        below.append(replica_id)
        count[replica_id] = c - 1
        if c - 1 < self.lowest:
            self.lowest = c - 1

    def _put(self, replica_id: str, c: int) -> None:
        buckets = self.buckets
        while len(buckets) <= c:
            buckets.append([])
        b = buckets[c]
        self.pos[replica_id] = len(b)
        b.append(replica_id)

    def _take(self, replica_id: str, c: int) -> None:
        b = self.buckets[c]
        i = self.pos.pop(replica_id)
        last = b.pop()
        if last != replica_id:
            b[i] = last
            self.pos[last] = i

    def check(self) -> None:
        """Raise AssertionError when counts, buckets, positions and the lowest pointer disagree."""
        assert sum(len(b) for b in self.buckets) == len(self.count) == len(self.pos)
        for rid, c in self.count.items():
            assert c >= 0, f"negative in-flight count on {rid}"
            assert self.buckets[c][self.pos[rid]] == rid, f"{rid} is not in bucket {c} at its position"
        if self.count:
            assert self.buckets[self.lowest], "lowest pointer on an empty bucket"
            assert self.lowest == min(self.count.values())
