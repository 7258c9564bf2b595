"""Load balancer: least in-flight routing, sticky sessions, runtime add/remove, abort-and-retry.

Routing picks the replica with the fewest requests in flight, breaking ties at random with a
seeded RNG. Replicas are kept in buckets indexed by their in-flight count, with a pointer to the
lowest non-empty bucket, so a routing decision and a release are O(1) amortized whatever the
number of requests in flight (the pointer only moves by one on a route; removing a replica may
scan the buckets, which is rare).

A request whose id was routed before goes back to the same replica while that replica stays
registered (sticky session, so a resumed request finds its prefix cache). Sticky entries live
in a bounded LRU; an entry names the replica's *registration epoch*, so removing a replica
invalidates all of its entries at once without scanning them.

:meth:`LoadBalancer.generate` is the retry loop: when a replica returns ``finish_reason="abort"``
(deactivation, rebalance) or raises anything at all (a ``BackendError``, a ``RuntimeError``, a Ray
actor error passed through a proxy unchanged), the request is routed again and, with partial
rollout on, continues from the tokens it already has; with partial rollout off it restarts from
scratch. A replica that raised is taken out of routing first. A request is never running on two
replicas at once and completes exactly once.

**Batched aborts.** A replica that implements :class:`~dynres.runtime.protocols.BatchedReplica`
(``submit`` + ``abort_batch``) runs each attempt as a future the balancer watches through one
callback, and :meth:`LoadBalancer.abort_batch` takes all of a replica's aborted requests back in
one reply. The results are then handed to their requests at most ``retry_batch`` per loop
iteration (then retried, again at most ``retry_batch`` per iteration), so a deactivation of
hundreds of replicas with tens of thousands of requests in flight never puts more than a few
dozen request wake-ups into one loop iteration, and the replicas can sleep as soon as they have
answered. A result is handed only to the attempt it belongs to: one that started on that replica
before the abort and is still waiting. Other replicas are awaited as before.

A replica removed while requests still run on it may be added again before they return (a
replica back from probation): its count starts at those requests, so each one's release still
balances; :meth:`LoadBalancer.release` of a request that is not running is a no-op.

**No big table in one piece.** Everything kept per request (the running attempt, the request's
current partial output, its sticky entry, the completed ids) lives in ``_SHARDS`` dicts picked by
the id's hash, never in one dict of all requests. CPython grows or compacts a dict in one step,
copying every entry (a dict whose keys come and go, like these, is compacted once per its size
in inserts): at 100,000 requests in flight one such step took 5-25 ms, and a sticky-session
``OrderedDict`` twice that, all inside one loop iteration. A shard holds a ``1/_SHARDS`` share,
so its rebuild is as short. What :meth:`LoadBalancer.generate` keeps about a running attempt
(its task and futures) is one :class:`_Attempt` record instead of parallel dicts; ``route`` and
``release`` themselves store only strings and ints, which the garbage collector does not track.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, KeysView, Sequence
from dataclasses import dataclass
from itertools import islice

from dynres.core.errors import ReplicaUnavailableError, RuntimeStateError
from dynres.runtime.loop.gcpolicy import defer_full_collections, resume_full_collections
from dynres.runtime.protocols import GenerationRequest, GenerationResult, Replica, pass_outcome, takes_batched_path

logger = logging.getLogger("dynres.runtime.loop.balancer")

_SHARDS = 64  # per-request tables are split this many ways (a power of two; see the module doc)
_MASK = _SHARDS - 1
_STICKY_SHARD_MIN = 1024  # fewer sticky shards when they would hold less (small capacities stay exact LRU)


class _Attempt:
    """What generate() keeps about one attempt running on a replica (from route to release)."""

    __slots__ = ("fut", "replica_id", "serial", "task", "waiter")

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self.task: asyncio.Task[object] | None = None  # the generate() task awaiting it (evict cancels it)
        self.fut: asyncio.Future[GenerationResult] | None = None  # a batched replica's future
        self.waiter: asyncio.Future[GenerationResult] | None = None  # what the task awaits instead
        self.serial = 0  # abort serial when it started: a batch abort answers only older attempts


@dataclass
class BalancerCounters:
    """What happened to requests in the balancer (counts since creation)."""

    routed: int = 0
    """Routing decisions made (first attempts and retries)."""
    completed: int = 0
    """Requests that finished (stop or length) and were returned to their caller."""
    aborted: int = 0
    """Attempts that ended with an abort and were retried (or parked when draining)."""
    resumed: int = 0
    """Retries that continued from partial output (partial rollout on, partial output > 0)."""
    restarted: int = 0
    """Retries that started from scratch (partial rollout off, or nothing generated yet)."""
    evicted: int = 0
    """Attempts cancelled because their replica stopped answering (retried elsewhere)."""
    replica_failures: int = 0
    """Attempts that failed because their replica raised (any exception; retried elsewhere)."""
    parked: int = 0
    """Requests returned unfinished (with partial output) because the balancer was draining."""
    duplicates: int = 0
    """Requests that completed more than once (must stay 0)."""
    rebalanced: int = 0
    """Requests moved by rebalances."""


class LoadBalancer:
    """Routes generation requests to registered replicas; retries aborted requests elsewhere."""

    def __init__(
        self,
        *,
        seed: int = 0,
        sticky_capacity: int = 100_000,
        partial_rollout: bool = True,
        max_failed_attempts: int = 8,
        retry_batch: int = 8,
        completed_window: int = 100_000,
        on_change: Callable[[], None] | None = None,
        on_replica_failure: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        """Create an empty balancer.

        :param seed: seed of the tie-break RNG (same seed, same routing).
        :param sticky_capacity: most sticky entries kept (count). Above 2,048 the entries are
            split over up to 64 shards by request id, each an LRU of its share, so the least
            recently used of a shard go first (below that, exactly the least recently used).
        :param partial_rollout: resume aborted requests from their partial output.
        :param max_failed_attempts: replica failures one request may hit before its error is
            raised to the caller (count; aborts do not count).
        :param retry_batch: most retries routed, and most batch-aborted results handed back, per
            event-loop iteration (count); a deactivation that aborts thousands of requests at
            once is spread over iterations so the loop stays responsive.
        :param completed_window: completed request ids remembered to catch a request completing
            twice (count); between ``completed_window`` and twice that many are kept, the oldest
            go first, so memory stays bounded however long the run.
        :param on_change: called after every change of membership: once per :meth:`add_replicas` /
            :meth:`remove_replicas` batch, once per single add/remove (the rollouter recomputes its capacity).
        :param on_replica_failure: called with (replica_id, error) whenever a replica raises during
            generation; the balancer has already removed it from routing.
        """
        if sticky_capacity < 0:
            raise ValueError(f"sticky_capacity must be >= 0, got {sticky_capacity}")
        self.partial_rollout = partial_rollout
        """Resume aborted requests from their partial output (else restart from scratch)."""
        self.sticky_capacity = sticky_capacity
        """Most sticky entries kept (count)."""
        self.max_failed_attempts = max_failed_attempts
        """Replica failures one request may hit before the error reaches the caller (count)."""
        self.retry_batch = max(1, retry_batch)
        """Most retries routed per event-loop iteration (count)."""
        self.counters = BalancerCounters()
        """Requests aborted, resumed, restarted, evicted and duplicated so far (counts, for the report)."""
        self._on_change = on_change
        self._on_replica_failure = on_replica_failure
        self._rng = random.Random(seed)
        self._replicas: dict[str, Replica] = {}
        self._epoch: dict[str, int] = {}
        self._next_epoch = 0
        self._count: dict[str, int] = {}
        # _buckets[c] lists the replicas with c requests in flight; _pos[r] is r's index in it.
        self._buckets: list[list[str]] = [[]]
        self._pos: dict[str, int] = {}
        self._min = 0
        # Shard hash(request id) & _MASK: request id -> replica id, for every attempt running now
        # (removed replicas included).
        self._running: list[dict[str, str]] = [{} for _ in range(_SHARDS)]
        self._n_running = 0
        # replica id -> its running request ids -> their routing sequence numbers, oldest first
        # (dict keeps insertion order; rebalance plans name attempts by ranges of these numbers).
        self._by_replica: dict[str, dict[str, int]] = {}
        # Shard hash(request id) & _MASK: request id -> its attempt's record, for attempts that
        # generate() runs (plain route()/release() callers have none).
        self._attempts: list[dict[str, _Attempt]] = [{} for _ in range(_SHARDS)]
        self._seq = 0
        # replica id -> [lo, hi) ranges of attempt seqs a rebalance picked there (see plan_rebalance).
        self._moved: dict[str, list[tuple[int, int]]] = {}
        # Shard hash(request id) & _MASK: request id -> the request of its current attempt
        # (partial output of earlier attempts), from generate() until it returns.
        self._current: list[dict[str, GenerationRequest]] = [{} for _ in range(_SHARDS)]
        n = 1
        while n < _SHARDS and sticky_capacity // (2 * n) >= _STICKY_SHARD_MIN:
            n *= 2
        self._sticky_mask = n - 1
        self._sticky_shard_capacity = sticky_capacity // n
        # Shard hash(request id) & _sticky_mask: request id -> (replica id, its epoch), an LRU each.
        self._sticky: list[OrderedDict[str, tuple[str, int]]] = [OrderedDict() for _ in range(n)]
        self._evicting: set[str] = set()
        # Ids of completed requests in two generations (each sharded): lookups check both; when
        # the newer one fills up it becomes the older one and the old one is dropped (O(1),
        # bounded memory).
        self.completed_window = max(1, completed_window)
        """Completed request ids remembered for duplicate detection (count, at least)."""
        self._completed: list[set[str]] = [set() for _ in range(_SHARDS)]
        self._completed_old: list[set[str]] = [set() for _ in range(_SHARDS)]
        self._n_completed = 0
        self._available: asyncio.Event | None = None
        self._idle_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._all_idle_waiters: list[asyncio.Future[None]] = []
        self._draining = False
        self._retry_budget = self.retry_batch
        self._retry_waiters: deque[asyncio.Future[None]] = deque()
        self._retry_pump_scheduled = False
        self._retry_stretch = False
        # Batches of aborted results not yet handed back: [replica id, serial, results, next index].
        self._handback: deque[list] = deque()
        self._handback_pending = 0
        self._abort_serial = 0

    # ---- Membership -------------------------------------------------------------------------

    def add_replica(self, replica: Replica) -> None:
        """Make ``replica`` routable; raise if its id is registered.

        It starts with the attempts of an earlier registration still running on it counted
        (usually 0), so their release keeps the count right. A new registration epoch
        invalidates the sticky entries of the earlier one.
        """
        self.add_replicas((replica,))

    def add_replicas(self, replicas: Iterable[Replica]) -> None:
        """Make every replica of ``replicas`` routable, then call ``on_change`` once.

        An activation of hundreds of hybrid replicas adds them together; ``on_change`` (the
        rollouter's capacity and rollout point) is asked once for the new membership instead
        of once per replica. Nothing is added when one id is registered or listed twice.
        """
        batch = list(replicas)
        seen: set[str] = set()
        for replica in batch:
            rid = replica.replica_id
            if rid in self._replicas:
                raise RuntimeStateError(f"replica {rid!r} is already registered in the load balancer; remove it first")
            if rid in seen:
                raise RuntimeStateError(f"replica {rid!r} is listed twice in one add_replicas call; list it once")
            seen.add(rid)
        for replica in batch:
            rid = replica.replica_id
            running = self._by_replica.setdefault(rid, {})
            c = len(running)
            self._replicas[rid] = replica
            self._next_epoch += 1
            self._epoch[rid] = self._next_epoch
            self._count[rid] = c
            self._bucket_add(rid, c)
            self._min = c if len(self._replicas) == 1 else min(self._min, c)
            logger.debug("replica %s added to routing", rid)
        if batch:
            self._event().set()
            if self._on_change is not None:
                self._on_change()

    def remove_replica(self, replica_id: str) -> KeysView[str]:
        """Stop routing to ``replica_id``; return the ids of requests still running on it.

        The ids are a live view (it shrinks as they end; ``list()`` it to keep them): copying
        them for each of 512 replicas leaving at once took milliseconds of one loop iteration,
        and the controller does not need them. Its sticky entries become invalid at once. The
        running requests are not touched: the caller aborts them (they are then retried
        elsewhere) or calls :meth:`evict`.
        """
        self.remove_replicas((replica_id,))
        return self._by_replica.get(replica_id, {}).keys()

    def remove_replicas(self, replica_ids: Iterable[str]) -> None:
        """Stop routing to every replica of ``replica_ids``, then call ``on_change`` once.

        What :meth:`remove_replica` does for each, with one ``on_change`` for the whole batch: a
        deactivation of 512 hybrid replicas recomputed the rollouter's capacity 512 times in one
        loop iteration. Nothing is removed when one id is not registered or listed twice.
        """
        batch = list(replica_ids)
        seen: set[str] = set()
        for replica_id in batch:
            if replica_id in seen:
                raise RuntimeStateError(
                    f"replica {replica_id!r} is listed twice in one remove_replicas call; list it once"
                )
            if replica_id not in self._replicas:
                raise RuntimeStateError(
                    f"replica {replica_id!r} is not registered in the load balancer; "
                    f"registered: {sorted(self._replicas) or '(none)'}"
                )
            seen.add(replica_id)
        for replica_id in batch:
            c = self._count.pop(replica_id)
            self._bucket_remove(replica_id, c)
            del self._replicas[replica_id]
            del self._epoch[replica_id]
            logger.debug("replica %s removed from routing (%d requests running on it)", replica_id, c)
        if not batch:
            return
        # Removals only raise the lowest load: one scan up from the old pointer covers the batch.
        if not self._replicas:
            self._min = 0
            self._event().clear()
        elif not self._buckets[self._min]:
            self._min = self._lowest_bucket(self._min)
        if self._on_change is not None:
            self._on_change()

    def has_replica(self, replica_id: str) -> bool:
        """True while ``replica_id`` is routable."""
        return replica_id in self._replicas

    @property
    def replica_ids(self) -> list[str]:
        """Ids of the routable replicas."""
        return list(self._replicas)

    @property
    def num_replicas(self) -> int:
        """Routable replicas (count)."""
        return len(self._replicas)

    def replica(self, replica_id: str) -> Replica:
        """The routable replica with this id."""
        return self._replicas[replica_id]

    # ---- Routing (synchronous, O(1) amortized) -------------------------------------------

    def route(self, request_id: str) -> Replica:
        """Pick a replica for ``request_id`` and count the request on it until :meth:`release`.

        Sticky replica first (while registered), else the least loaded with a random tie-break.
        """
        h = hash(request_id)
        running_shard = self._running[h & _MASK]
        if request_id in running_shard:
            raise RuntimeStateError(
                f"request {request_id!r} is already running on replica "
                f"{running_shard[request_id]!r}; release it before routing it again"
            )
        if not self._replicas:
            raise ReplicaUnavailableError(f"no replica is routable for request {request_id!r}; add a replica first")
        rid = None
        sticky_shard = self._sticky[h & self._sticky_mask]
        sticky = sticky_shard.get(request_id)
        if sticky is not None:
            if self._epoch.get(sticky[0]) == sticky[1]:
                rid = sticky[0]
                sticky_shard.move_to_end(request_id)
            else:
                del sticky_shard[request_id]
        if rid is None:
            bucket = self._buckets[self._min]
            rid = bucket[int(self._rng.random() * len(bucket))] if len(bucket) > 1 else bucket[0]
            if self.sticky_capacity:
                sticky_shard[request_id] = (rid, self._epoch[rid])
                if len(sticky_shard) > self._sticky_shard_capacity:
                    sticky_shard.popitem(last=False)
        # The bucket moves of _bucket_remove/_bucket_add, inlined: this runs once per decision.
        count, pos, buckets = self._count, self._pos, self._buckets
        c = count[rid]
        b = buckets[c]
        i = pos[rid]
        last = b.pop()
        if last != rid:
            b[i] = last
            pos[last] = i
        if len(buckets) == c + 1:
            buckets.append([])
        up = buckets[c + 1]
        pos[rid] = len(up)
        up.append(rid)
        count[rid] = c + 1
        if c == self._min and not b:
            self._min = c + 1
        self._seq += 1
        running_shard[request_id] = rid
        self._by_replica[rid][request_id] = self._seq
        self._n_running += 1
        self.counters.routed += 1
        return self._replicas[rid]

    def release(self, request_id: str) -> None:
        """The attempt of ``request_id`` ended: stop counting it on its replica.

        A no-op when ``request_id`` is not running (never routed, or already released).
        """
        h = hash(request_id)
        rid = self._running[h & _MASK].pop(request_id, None)
        if rid is None:
            return
        self._n_running -= 1
        running = self._by_replica.get(rid)
        if running is not None:
            seq = running.pop(request_id, 0)
            if self._moved and self._is_moved(rid, seq):  # its next attempt routes by load (see plan_rebalance)
                self._sticky[h & self._sticky_mask].pop(request_id, None)
            if not running:
                if rid not in self._replicas:
                    del self._by_replica[rid]
                waiters = self._idle_waiters.pop(rid, None)
                if waiters:
                    for fut in waiters:
                        if not fut.done():
                            fut.set_result(None)
        if not self._n_running and self._all_idle_waiters:
            for fut in self._all_idle_waiters:
                if not fut.done():
                    fut.set_result(None)
            self._all_idle_waiters = []
        c = self._count.get(rid)
        if c is None:  # the replica was removed while the request ran
            return
        if c <= 0:
            raise RuntimeStateError(f"in-flight count of replica {rid!r} would go negative")
        count, pos, buckets = self._count, self._pos, self._buckets
        b = buckets[c]
        i = pos[rid]
        last = b.pop()
        if last != rid:
            b[i] = last
            pos[last] = i
        down = buckets[c - 1]
        pos[rid] = len(down)
        down.append(rid)
        count[rid] = c - 1
        if c - 1 < self._min:
            self._min = c - 1

    def in_flight(self, replica_id: str) -> int:
        """Requests running on ``replica_id`` now (count; removed replicas included)."""
        return len(self._by_replica.get(replica_id, ()))

    def in_flight_counts(self) -> dict[str, int]:
        """Routable replica id -> requests counted on it (count)."""
        return dict(self._count)

    @property
    def total_in_flight(self) -> int:
        """Attempts running on any replica now (count)."""
        return self._n_running

    def running_on(self, replica_id: str) -> list[str]:
        """Ids of the requests running on ``replica_id``, oldest first."""
        return list(self._by_replica.get(replica_id, ()))

    async def wait_idle(self, replica_id: str) -> None:
        """Wait until no request attempt is running on ``replica_id`` (e.g. after an abort)."""
        if not self._by_replica.get(replica_id):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle_waiters.setdefault(replica_id, []).append(fut)
        await fut

    async def wait_all_idle(self) -> None:
        """Wait until no request attempt runs on any replica (requests waiting for one don't count)."""
        if not self._n_running:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._all_idle_waiters.append(fut)
        await fut

    def sticky_replica(self, request_id: str) -> str | None:
        """The replica ``request_id`` would stick to, or None (no entry, or its replica left)."""
        h = hash(request_id)
        entry = self._sticky[h & self._sticky_mask].get(request_id)
        if entry is None or self._epoch.get(entry[0]) != entry[1]:
            return None
        rid = self._running[h & _MASK].get(request_id)
        moved = rid is not None and self._is_moved(rid, self._by_replica[rid][request_id])
        return None if moved else entry[0]

    def current_request(self, request_id: str) -> GenerationRequest | None:
        """The request of ``request_id``'s current attempt, with the partial output of earlier
        attempts (None when it is not being generated); checkpoints read it."""
        return self._current[hash(request_id) & _MASK].get(request_id)

    def forget_sticky(self, request_ids: Iterable[str]) -> None:
        """Drop the sticky entries of ``request_ids`` (they route by load next time)."""
        shards, mask = self._sticky, self._sticky_mask
        for r in request_ids:
            shards[hash(r) & mask].pop(r, None)

    # ---- Generation with retry ------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate ``request`` to completion on some replica, retrying aborts elsewhere.

        Waits while no replica is routable. Returns an aborted result (with all partial output)
        only when the balancer is draining (end of run); raises the replica's last error after
        ``max_failed_attempts`` replica failures of this request.
        """
        try:
            return await self._generate(request)
        finally:
            self._current[hash(request.request_id) & _MASK].pop(request.request_id, None)

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        req = request
        failures = 0
        task = asyncio.current_task()
        h = hash(req.request_id) & _MASK
        current, attempts = self._current[h], self._attempts[h]
        while True:
            current[req.request_id] = req
            while not self._replicas and not self._draining:
                await self._event().wait()
            if self._draining:
                self.counters.parked += 1
                return _parked(req)
            replica = self.route(req.request_id)
            att = attempts[req.request_id] = _Attempt(replica.replica_id)
            att.task = task
            try:
                if _batched(replica):
                    result = await self._start_attempt(replica, req, att)
                else:
                    result = await replica.generate(req)
            except asyncio.CancelledError:
                if req.request_id not in self._evicting or task is None or task.cancelling() > 1:
                    raise
                # The controller gave up on this replica: retry with the output we had before.
                task.uncancel()
                self.counters.evicted += 1
                result = _parked(req, replica.replica_id)
            except Exception as exc:  # any error of a replica is a replica failure, not the sample's
                failures += 1
                self.counters.replica_failures += 1
                self._fail_replica(replica.replica_id, exc)
                if failures >= self.max_failed_attempts:
                    raise
                result = _parked(req, replica.replica_id)
            finally:
                if self._evicting:
                    self._evicting.discard(req.request_id)
                if attempts.get(req.request_id) is att:
                    del attempts[req.request_id]
                fut = att.fut
                if fut is not None and not fut.done():
                    fut.cancel()  # evicted, cancelled, or handed back in a batch
                self.release(req.request_id)
            if not result.aborted:
                self._note_completed(req.request_id)
                self.counters.completed += 1
                return result
            self.counters.aborted += 1
            if self._draining:
                self.counters.parked += 1
                return result if len(result.token_ids) >= len(req.partial_token_ids) else _parked(req)
            req = self._retry_request(req, result)
            await self._retry_slot()

    def _note_completed(self, request_id: str) -> None:
        """Remember ``request_id`` as completed; count a duplicate if it completed before."""
        h = hash(request_id) & _MASK
        new = self._completed[h]
        if request_id in new or request_id in self._completed_old[h]:
            self.counters.duplicates += 1
        if request_id not in new:
            new.add(request_id)
            self._n_completed += 1
            if self._n_completed >= self.completed_window:
                self._completed_old = self._completed
                self._completed = [set() for _ in range(_SHARDS)]
                self._n_completed = 0

    @property
    def completed_remembered(self) -> int:
        """Completed request ids kept for duplicate detection now (count; at most twice the window)."""
        return self._n_completed + sum(map(len, self._completed_old))

    async def _retry_slot(self) -> None:
        """Wait for one of the ``retry_batch`` retry slots of the current loop iteration."""
        if self._retry_budget > 0 and not self._retry_waiters:
            self._retry_budget -= 1
            self._schedule_retry_pump()
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._retry_waiters.append(fut)
        self._schedule_retry_pump()
        await fut

    def _schedule_retry_pump(self) -> None:
        if not self._retry_pump_scheduled:
            if not self._retry_stretch:
                # Retries come in bursts (a deactivation or rebalance aborts thousands at once);
                # no full collection until the burst is routed (see loop/gcpolicy.py).
                self._retry_stretch = True
                defer_full_collections()
            self._retry_pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._retry_pump)

    def _retry_pump(self) -> None:
        # Runs once per loop iteration while retries are pending: refills the budget and wakes
        # at most retry_batch waiting retries (they run in the next iteration).
        self._retry_pump_scheduled = False
        self._retry_budget = self.retry_batch
        waiters = self._retry_waiters
        while waiters and self._retry_budget > 0:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                self._retry_budget -= 1
        if self._handback:
            self._hand_back(self.retry_batch)
        if waiters or self._retry_budget < self.retry_batch or self._handback:
            self._schedule_retry_pump()
        elif self._retry_stretch:
            self._retry_stretch = False
            resume_full_collections()

    def _retry_request(self, req: GenerationRequest, result: GenerationResult) -> GenerationRequest:
        if self.partial_rollout and len(result.token_ids) > 0:
            self.counters.resumed += 1
            return req.resumed(result.token_ids, result.logprobs)
        self.counters.restarted += 1
        if len(req.partial_token_ids) == 0:
            return req
        return req.resumed((), ())

    def _start_attempt(
        self, replica: Replica, req: GenerationRequest, att: _Attempt
    ) -> asyncio.Future[GenerationResult]:
        """Submit ``req`` to a batched replica; return the future its request waits on."""
        waiter: asyncio.Future[GenerationResult] = asyncio.get_running_loop().create_future()
        fut = replica.submit(req)  # type: ignore[attr-defined]
        att.fut, att.waiter, att.serial = fut, waiter, self._abort_serial
        fut.add_done_callback(functools.partial(pass_outcome, waiter))
        return waiter

    def can_batch_abort(self, replica: Replica) -> bool:
        """True when ``replica`` answers an abort with all its partial results at once (``abort_batch``)."""
        return _batched(replica)

    async def abort_batch(self, replica: Replica, request_ids: Sequence[str] | None = None) -> bool:
        """Abort requests on a batched replica (None = all) and hand their results back in chunks.

        Returns True when every attempt the balancer counts on the replica was in the reply (it
        may then sleep at once); False when some were not (they end on their own: wait with
        :meth:`wait_idle`). The results reach their requests at most ``retry_batch`` per loop
        iteration after this returns.
        """
        rid = replica.replica_id
        serial = self._abort_serial
        self._abort_serial += 1  # attempts started from now on are not part of this abort
        results = await replica.abort_batch(request_ids)  # type: ignore[attr-defined]
        if len(results):
            self._handback.append([rid, serial, results, 0])
            self._handback_pending += len(results)
            self._schedule_retry_pump()
        return request_ids is None and len(results) >= self.in_flight(rid)

    @property
    def requeue_pending(self) -> int:
        """Aborted requests not yet handed back or not yet routed again (count)."""
        return self._handback_pending + len(self._retry_waiters)

    def _hand_back(self, budget: int) -> None:
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
                att = shards[hash(req_id) & _MASK].get(req_id)
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
            self._handback_pending -= end - i
            if end == len(results):
                queue.popleft()
            else:
                item[3] = end

    def evict(self, replica_id: str) -> int:
        """Cancel the attempts still running on ``replica_id`` (it stopped answering); return how many.

        Each is retried elsewhere from the partial output it had before that attempt. The replica
        must already be out of routing.
        """
        if replica_id in self._replicas:
            raise RuntimeStateError(
                f"evict({replica_id!r}): remove the replica from routing before evicting its requests"
            )
        n = 0
        # The caller may be one of the attempts on this replica (a generate that just failed and
        # reports the failure): it retries on its own, and cancelling it would lose its sample.
        current = asyncio.current_task()
        shards = self._attempts
        for req in list(self._by_replica.get(replica_id, ())):
            att = shards[hash(req) & _MASK].get(req)
            task = att.task if att is not None and att.replica_id == replica_id else None
            if task is not None and task is not current and req not in self._evicting:
                self._evicting.add(req)
                task.cancel()
                n += 1
        return n

    def _fail_replica(self, replica_id: str, exc: BaseException) -> None:
        logger.warning("replica %s failed during generation: %s; removed from routing", replica_id, exc)
        if replica_id in self._replicas:
            self.remove_replica(replica_id)
        # Reported even when the replica already left routing, so every failure is on record.
        if self._on_replica_failure is not None:
            self._on_replica_failure(replica_id, exc)

    # ---- Rebalance and draining ----------------------------------------------------------

    def plan_rebalance(self) -> dict[str, list[str]]:
        """Pick the requests to move so that every routable replica ends near the mean load.

        Returns replica id -> request ids to abort on it. Only replicas above
        ``ceil(total / replicas)`` give requests away, their most recently started first (they
        have the least output to re-prefill). The picked requests lose their sticky entries so
        their retries go to the least loaded replicas (the new ones). The picks are remembered
        as one range of routing sequence numbers per replica (the newest ``c - target`` are
        consecutive in its table) and each entry goes when its attempt ends (:meth:`release`),
        so the plan touches no per-request record: tens of thousands of picks would otherwise
        cost as many writes inside one loop iteration. Nothing else is touched.
        """
        target = self._rebalance_target()
        plan = {rid: self._pick_newest(rid, c - target) for rid, c in list(self._count.items()) if c > target}
        self.counters.rebalanced += sum(len(v) for v in plan.values())
        return plan

    async def plan_rebalance_spread(self, ids_per_iteration: int = 4096) -> dict[str, list[str]]:
        """:meth:`plan_rebalance`, picking at most about ``ids_per_iteration`` request ids per loop iteration.

        Listing 50,000 ids takes milliseconds on its own; the controller plans this way so that
        a rebalance at 100,000 requests in flight does not hold the loop while it lists them.
        One replica's picks are made at once (its newest at that moment); the target is the
        mean load when the call starts.
        """
        target = self._rebalance_target()
        plan: dict[str, list[str]] = {}
        picked = 0
        for rid in list(self._count):
            c = self._count.get(rid)  # None: it left routing while the plan was being made
            if c is not None and c > target:
                plan[rid] = self._pick_newest(rid, c - target)
                picked += c - target
                if picked >= ids_per_iteration:
                    picked = 0
                    await asyncio.sleep(0)
        self.counters.rebalanced += sum(len(v) for v in plan.values())
        return plan

    def _rebalance_target(self) -> int:
        """Most requests a replica keeps in a rebalance (``ceil(total / replicas)``); drops stale plans."""
        hi = self._seq + 1
        for rid, ranges in list(self._moved.items()):
            # Ranges of earlier plans whose attempts have all ended go.
            attempts = self._by_replica.get(rid)
            oldest = next(iter(attempts.values())) if attempts else hi
            kept = [r for r in ranges if r[1] > oldest]
            if kept:
                self._moved[rid] = kept
            else:
                del self._moved[rid]
        n = len(self._replicas)
        return -(-sum(self._count.values()) // n) if n else 0

    def _pick_newest(self, rid: str, k: int) -> list[str]:
        """The ``k`` newest requests on ``rid``, oldest first, marked as moved (see :meth:`plan_rebalance`)."""
        attempts = self._by_replica[rid]
        # Without copying the replica's whole table.
        newest = list(islice(reversed(attempts), k))
        newest.reverse()
        lo = next(islice(reversed(attempts.values()), k - 1, None))
        self._moved.setdefault(rid, []).append((lo, self._seq + 1))  # attempts routed later are not in it
        return newest

    def _is_moved(self, replica_id: str, seq: int) -> bool:
        """True when a rebalance plan picked the attempt with routing number ``seq`` on ``replica_id``."""
        return any(lo <= seq < hi for lo, hi in self._moved.get(replica_id, ()))

    def start_draining(self) -> None:
        """Stop retrying: from now on aborted or waiting requests return with their partial output."""
        self._draining = True
        self._event().set()

    # ---- Internals ------------------------------------------------------------------------

    def _event(self) -> asyncio.Event:
        # Created on first use so that the balancer can be built outside a running loop.
        if self._available is None:
            self._available = asyncio.Event()
            if self._replicas:
                self._available.set()
        return self._available

    def _bucket_add(self, rid: str, c: int) -> None:
        buckets = self._buckets
        while len(buckets) <= c:
            buckets.append([])
        b = buckets[c]
        self._pos[rid] = len(b)
        b.append(rid)

    def _bucket_remove(self, rid: str, c: int) -> None:
        b = self._buckets[c]
        i = self._pos.pop(rid)
        last = b.pop()
        if last != rid:
            b[i] = last
            self._pos[last] = i

    def _lowest_bucket(self, start: int) -> int:
        for c in range(start, len(self._buckets)):
            if self._buckets[c]:
                return c
        return 0

    def check_invariants(self) -> None:
        """Raise AssertionError when the routing structures disagree (used by tests)."""
        assert sum(len(b) for b in self._buckets) == len(self._replicas)
        for rid, c in self._count.items():
            assert c >= 0, f"negative in-flight count on {rid}"
            assert self._buckets[c][self._pos[rid]] == rid
            assert c == len(self._by_replica.get(rid, ())), f"count mismatch on {rid}"
        if self._replicas:
            assert self._buckets[self._min], "min pointer on an empty bucket"
            assert self._min == min(self._count.values())
        assert sum(map(len, self._running)) == self._n_running == sum(len(v) for v in self._by_replica.values())
        for shard in self._running:
            for req, rid in shard.items():
                assert req in self._by_replica[rid], f"{req} not on its replica's table"


_batched = takes_batched_path


def _parked(req: GenerationRequest, replica_id: str = "") -> GenerationResult:
    """An aborted result that carries exactly the request's existing partial output."""
    return GenerationResult(
        request_id=req.request_id,
        token_ids=req.partial_token_ids,
        logprobs=req.partial_logprobs,
        finish_reason="abort",
        replica_id=replica_id,
    )
