"""Sticky sessions: a request routed before goes back to the same replica while it stays registered.

A resumed request then finds its prefix cache on that replica. Entries live in a bounded LRU.
Every registration of a replica gets a new *epoch* (a number never given out again) and an entry
names only that epoch, so removing a replica invalidates all of its entries at once without
scanning them: an entry whose epoch is no longer registered is stale, and the lookup that finds
it drops it. An entry is one int shared with the registry, so no object is allocated per request.

Above ``2 x _SHARD_MIN`` entries of capacity the LRU is split over up to ``SHARDS`` shards by
request id (see :mod:`.shards` for why), each an exact LRU of its share, so the least recently
used of a shard go first; smaller capacities keep one exact LRU.

The lookup and the insert of a routing decision are made by :class:`~.router.Router` on
:attr:`StickyTable.shards` directly, following the rules above: two more method calls in every
routing decision would cost a few percent of its time (``benchmarks/runtime_bench.py``
measures the rate).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from dynres.core.errors import ConfigError
from dynres.runtime.loop.routing.shards import SHARDS

_SHARD_MIN = 1024  # fewer shards when they would hold less (small capacities stay an exact LRU)


class StickyTable:
    """Request id -> registration epoch of its replica: a bounded LRU split over shards by the id's hash."""

    __slots__ = ("_next_epoch", "capacity", "epoch", "mask", "registration", "shard_capacity", "shards")

    def __init__(self, capacity: int) -> None:
        """Create an empty table that keeps at most ``capacity`` entries (count; 0 keeps none)."""
        if capacity < 0:
            raise ConfigError(f"sticky_capacity must be >= 0 (0 turns sticky sessions off), got {capacity}")
        n = 1
        while n < SHARDS and capacity // (2 * n) >= _SHARD_MIN:
            n *= 2
        self.capacity = capacity
        """Most entries kept (count; 0: none are kept)."""
        self.shards: list[OrderedDict[str, int]] = [OrderedDict() for _ in range(n)]
        """Request id -> epoch, least recently used first; a request's shard is ``shards[hash(id) & mask]``."""
        self.mask = n - 1
        """``hash(request_id) & mask`` is the index of the request's shard."""
        self.shard_capacity = capacity // n
        """Most entries of one shard (count); an insert beyond it drops the shard's least recently used."""
        self.epoch: dict[str, int] = {}
        """Registered replica id -> the epoch of its registration."""
        self.registration: dict[int, str] = {}
        """Epoch of a registration still on -> its replica id."""
        self._next_epoch = 0

    def register(self, replica_id: str) -> None:
        """``replica_id`` became routable: a new epoch (entries of an earlier registration stay stale)."""
        self._next_epoch += 1
        self.epoch[replica_id] = self._next_epoch
        self.registration[self._next_epoch] = replica_id

    def unregister(self, replica_id: str) -> None:
        """``replica_id`` left routing: every entry naming it is stale from now on."""
        del self.registration[self.epoch.pop(replica_id)]

    def replica_of(self, request_id: str, h: int) -> str | None:
        """The replica ``request_id`` (hash ``h``) sticks to, or None; the LRU order is left as it is."""
        epoch = self.shards[h & self.mask].get(request_id)
        return None if epoch is None else self.registration.get(epoch)

    def forget(self, request_id: str, h: int) -> None:
        """Drop the entry of ``request_id`` (hash ``h``), if any."""
        self.shards[h & self.mask].pop(request_id, None)

    def forget_many(self, request_ids: Iterable[str]) -> None:
        """Drop the entries of ``request_ids``, if any."""
        shards, mask = self.shards, self.mask
        for r in request_ids:
            shards[hash(r) & mask].pop(r, None)
