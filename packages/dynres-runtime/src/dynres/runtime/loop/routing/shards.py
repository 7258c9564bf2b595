"""How the routing package splits its per-request tables: ``SHARDS`` ways by the request id's hash.

Everything the balancer keeps per request (the running attempt, the request's current partial
output, its sticky entry, the completed ids) lives in ``SHARDS`` dicts or sets picked by
``hash(request_id) & MASK``, never in one table of all requests. CPython grows or compacts a dict
in one step, copying every entry (a dict whose keys come and go, like these, is compacted once
per its size in inserts), so one table of all requests in flight would hold a whole loop
iteration while it is rebuilt, and a sticky-session ``OrderedDict`` longer still (the measured
pauses are in docs/scaling.md). A shard holds a ``1 / SHARDS`` share, so its rebuild is as short.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

SHARDS = 64
"""Ways every per-request table is split (count; a power of two)."""
MASK = SHARDS - 1
"""``hash(request_id) & MASK`` is the index of the request's shard."""

_T = TypeVar("_T")


def new_shards(factory: Callable[[], _T]) -> list[_T]:
    """``SHARDS`` empty tables made by ``factory`` (``dict``, ``set``), one per shard."""
    return [factory() for _ in range(SHARDS)]
