"""The load balancer: membership, the retry loop of generate(), eviction, draining and waiters.

It composes the routing parts: the replica choice (:mod:`.router`, over the in-flight index of
:mod:`.inflight` and the sticky sessions of :mod:`.sticky`), retry pacing and the batched-abort
hand-back (:mod:`.pacing`), the duplicate check (:mod:`.completed`) and rebalance planning
(:mod:`.rebalance`).

:meth:`LoadBalancer.generate` is the retry loop: when a replica returns ``finish_reason="abort"``
(deactivation, rebalance) or raises anything at all (a ``BackendError``, a ``RuntimeError``, a Ray
actor error passed through a proxy unchanged), the request is routed again and, with partial
rollout on, continues from the tokens it already has; with partial rollout off it restarts from
scratch. A replica that raised is taken out of routing first. A request is never running on two
replicas at once and completes exactly once.

A replica removed while requests still run on it may be added again before they return (a
replica back from probation): its count starts at those requests, so each one's release still
balances; :meth:`LoadBalancer.release` of a request that is not running is a no-op.

Everything kept per request lives in sharded tables (:mod:`.shards`). What generate() keeps about
a running attempt (its task and futures) is one :class:`~.attempt.Attempt` record instead of
parallel dicts; ``route`` and ``release`` themselves store only strings and ints, which the
garbage collector does not track.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, KeysView, Sequence
from dataclasses import dataclass
from functools import partial

from dynres.core.errors import ReplicaUnavailableError, RuntimeStateError
from dynres.runtime.loop.routing.attempt import Attempt
from dynres.runtime.loop.routing.completed import CompletedIds
from dynres.runtime.loop.routing.decider import RequestDecider
from dynres.runtime.loop.routing.inflight import InflightIndex
from dynres.runtime.loop.routing.pacing import RetryPacer
from dynres.runtime.loop.routing.rebalance import RebalancePlanner
from dynres.runtime.loop.routing.router import Router
from dynres.runtime.loop.routing.shards import MASK, new_shards
from dynres.runtime.loop.routing.sticky import StickyTable
from dynres.runtime.protocols import GenerationRequest, GenerationResult, Replica, takes_batched_path

logger = logging.getLogger("dynres.runtime.loop.routing")


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
        decider: RequestDecider | None = None,
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
        :param decider: the policy's request decisions (length prediction, routing), asked for
            each request without a valid sticky replica; None: the built-in rule alone.
        """
        self.partial_rollout = partial_rollout
        """Resume aborted requests from their partial output (else restart from scratch)."""
        self.max_failed_attempts = max_failed_attempts
        """Replica failures one request may hit before the error reaches the caller (count)."""
        self.counters = BalancerCounters()
        """Requests aborted, resumed, restarted, evicted and duplicated so far (counts, for the report)."""
        self.decider = decider
        """The policy's request decisions, or None when the policy makes none."""
        self._on_change = on_change
        self._on_replica_failure = on_replica_failure
        self._replicas: dict[str, Replica] = {}
        self._index = InflightIndex()
        self._sticky = StickyTable(sticky_capacity)
        self._router = Router(self._index, self._sticky, seed)
        # Shard hash(request id) & MASK: request id -> replica id, for every attempt running now
        # (removed replicas included).
        self._running: list[dict[str, str]] = new_shards(dict)
        self._n_running = 0
        # replica id -> its running request ids -> their routing sequence numbers, oldest first
        # (dict keeps insertion order; rebalance plans name attempts by ranges of these numbers).
        self._by_replica: dict[str, dict[str, int]] = {}
        self._seq = 0
        # Shard hash(request id) & MASK: request id -> its attempt's record, for attempts that
        # generate() runs (plain route()/release() callers have none).
        self._attempts: list[dict[str, Attempt]] = new_shards(dict)
        # Shard hash(request id) & MASK: request id -> the request of its current attempt
        # (partial output of earlier attempts), from generate() until it returns.
        self._current: list[dict[str, GenerationRequest]] = new_shards(dict)
        self._planner = RebalancePlanner(self._index, self._by_replica)
        self._moved = self._planner.moved  # the same dict: release() tests it before calling the planner
        self._completed = CompletedIds(completed_window)
        self._pacer = RetryPacer(retry_batch, self._attempts)
        self._evicting: set[str] = set()
        self._available: asyncio.Event | None = None
        self._idle_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._all_idle_waiters: list[asyncio.Future[None]] = []
        self._draining = False

    @property
    def sticky_capacity(self) -> int:
        """Most sticky entries kept (count)."""
        return self._sticky.capacity

    @sticky_capacity.setter
    def sticky_capacity(self, value: int) -> None:
        self._sticky.capacity = value

    @property
    def retry_batch(self) -> int:
        """Most retries routed per event-loop iteration (count)."""
        return self._pacer.retry_batch

    @retry_batch.setter
    def retry_batch(self, value: int) -> None:
        self._pacer.retry_batch = value

    @property
    def completed_window(self) -> int:
        """Completed request ids remembered for duplicate detection (count, at least)."""
        return self._completed.window

    @completed_window.setter
    def completed_window(self, value: int) -> None:
        self._completed.window = value

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
            self._replicas[rid] = replica
            self._sticky.register(rid)
            self._index.add(rid, len(running))
            logger.debug("replica %s added to routing", rid)
        if batch:
            self._event().set()
            if self._on_change is not None:
                self._on_change()

    def remove_replica(self, replica_id: str) -> KeysView[str]:
        """Stop routing to ``replica_id``; return the ids of requests still running on it.

        The ids are a live view (it shrinks as they end; ``list()`` it to keep them): copying
        them for each of hundreds of replicas leaving at once would hold one loop iteration
        (docs/scaling.md), and the controller does not need them. Its sticky entries become
        invalid at once. The running requests are not touched: the caller aborts them (they are
        then retried elsewhere) or calls :meth:`evict`.
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
            c = self._index.remove(replica_id)
            del self._replicas[replica_id]
            self._sticky.unregister(replica_id)
            logger.debug("replica %s removed from routing (%d requests running on it)", replica_id, c)
        if not batch:
            return
        self._index.refresh_lowest()
        if not self._replicas:
            self._event().clear()
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

    def route(self, request_id: str, pick: Callable[[], str | None] | None = None) -> Replica:
        """Pick a replica for ``request_id`` and count the request on it until :meth:`release`.

        Sticky replica first (while registered), else ``pick``'s answer (the policy's request
        decision) when given and not None, else the least loaded with a random tie-break
        (:class:`~.router.Router` decides).
        """
        h = hash(request_id)
        running_shard = self._running[h & MASK]
        if request_id in running_shard:
            raise RuntimeStateError(
                f"request {request_id!r} is already running on replica "
                f"{running_shard[request_id]!r}; release it before routing it again"
            )
        if not self._replicas:
            raise ReplicaUnavailableError(f"no replica is routable for request {request_id!r}; add a replica first")
        rid = self._router.choose(request_id, h, pick)
        self._index.up(rid)
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
        rid = self._running[h & MASK].pop(request_id, None)
        if rid is None:
            return
        self._n_running -= 1
        running = self._by_replica.get(rid)
        if running is not None:
            seq = running.pop(request_id, 0)
            if self._moved and self._planner.is_moved(rid, seq):  # its next attempt routes by load
                self._sticky.forget(request_id, h)
            if not running:
                if rid not in self._replicas:
                    del self._by_replica[rid]
                waiters = self._idle_waiters.pop(rid, None)
                if waiters:
                    _wake(waiters)
        if not self._n_running and self._all_idle_waiters:
            _wake(self._all_idle_waiters)
            self._all_idle_waiters = []
        self._index.down(rid)

    def in_flight(self, replica_id: str) -> int:
        """Requests running on ``replica_id`` now (count; removed replicas included)."""
        return len(self._by_replica.get(replica_id, ()))

    def in_flight_counts(self) -> dict[str, int]:
        """Routable replica id -> requests counted on it (count)."""
        return dict(self._index.count)

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
        """The replica ``request_id`` would stick to, or None (no entry, its replica left, or a rebalance moves it)."""
        h = hash(request_id)
        stuck = self._sticky.replica_of(request_id, h)
        if stuck is None:
            return None
        rid = self._running[h & MASK].get(request_id)
        moved = rid is not None and self._planner.is_moved(rid, self._by_replica[rid][request_id])
        return None if moved else stuck

    def current_request(self, request_id: str) -> GenerationRequest | None:
        """The request of ``request_id``'s current attempt, with the partial output of earlier
        attempts (None when it is not being generated); checkpoints read it."""
        return self._current[hash(request_id) & MASK].get(request_id)

    def forget_sticky(self, request_ids: Iterable[str]) -> None:
        """Drop the sticky entries of ``request_ids`` (they route by load next time)."""
        self._sticky.forget_many(request_ids)

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
            self._current[hash(request.request_id) & MASK].pop(request.request_id, None)

    async def _generate(self, request: GenerationRequest) -> GenerationResult:  # noqa: C901  # one retry loop: its finally sees every exit
        req = request
        failures = 0
        attempt = -1
        task = asyncio.current_task()
        h = hash(req.request_id) & MASK
        current, attempts = self._current[h], self._attempts[h]
        decider = self.decider
        while True:
            attempt += 1
            current[req.request_id] = req
            while not self._replicas and not self._draining:
                await self._event().wait()
            if self._draining:
                self.counters.parked += 1
                return _parked(req)
            if decider is None:
                replica = self.route(req.request_id)
            else:
                replica = self.route(
                    req.request_id,
                    partial(decider.choose, req, attempt, self._replicas, self._index.count, self.partial_rollout),
                )
            att = attempts[req.request_id] = Attempt(replica.replica_id, task)
            try:
                if takes_batched_path(replica):
                    result = await att.submit(replica, req, self._pacer.abort_serial)
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
                if self._completed.add(req.request_id):
                    self.counters.duplicates += 1
                self.counters.completed += 1
                if decider is not None:
                    decider.finished(req.sample_id, len(result.token_ids), req.prompt_id)
                return result
            self.counters.aborted += 1
            if self._draining:
                self.counters.parked += 1
                return result if len(result.token_ids) >= len(req.partial_token_ids) else _parked(req)
            req = self._retry_request(req, result)
            await self._pacer.slot()

    @property
    def completed_remembered(self) -> int:
        """Completed request ids kept for duplicate detection now (count; at most twice the window)."""
        return self._completed.remembered

    def _retry_request(self, req: GenerationRequest, result: GenerationResult) -> GenerationRequest:
        if self.partial_rollout and len(result.token_ids) > 0:
            self.counters.resumed += 1
            return req.resumed(result.token_ids, result.logprobs)
        self.counters.restarted += 1
        if len(req.partial_token_ids) == 0:
            return req
        return req.resumed((), ())

    def can_batch_abort(self, replica: Replica) -> bool:
        """True when ``replica`` answers an abort with all its partial results at once (``abort_batch``)."""
        return takes_batched_path(replica)

    async def abort_batch(self, replica: Replica, request_ids: Sequence[str] | None = None) -> bool:
        """Abort requests on a batched replica (None = all) and hand their results back in chunks.

        Returns True when every attempt the balancer counts on the replica was in the reply (it
        may then sleep at once); False when some were not (they end on their own: wait with
        :meth:`wait_idle`). The results reach their requests at most ``retry_batch`` per loop
        iteration after this returns.
        """
        rid = replica.replica_id
        serial = self._pacer.new_abort()
        results = await replica.abort_batch(request_ids)  # type: ignore[attr-defined]  # callers check can_batch_abort
        self._pacer.hand_back(rid, serial, results)
        return request_ids is None and len(results) >= self.in_flight(rid)

    @property
    def requeue_pending(self) -> int:
        """Aborted requests not yet handed back or not yet routed again (count)."""
        return self._pacer.pending

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
            att = shards[hash(req) & MASK].get(req)
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

        Returns replica id -> request ids to abort on it: the newest above
        ``ceil(total / replicas)`` of each replica (see :mod:`.rebalance`). The picked requests
        lose their sticky entries when their attempts end, so their retries go to the least
        loaded replicas (the new ones). Nothing else is touched.
        """
        plan = self._planner.plan(self._seq + 1)
        self.counters.rebalanced += sum(len(v) for v in plan.values())
        return plan

    async def plan_rebalance_spread(self, ids_per_iteration: int = 4096) -> dict[str, list[str]]:
        """:meth:`plan_rebalance`, picking at most about ``ids_per_iteration`` request ids per loop iteration.

        The controller plans this way so that a rebalance with tens of thousands of requests to
        move does not hold the loop while it lists them. One replica's picks are made at once
        (its newest at that moment); the target is the mean load when the call starts.
        """
        plan = await self._planner.plan_spread(lambda: self._seq + 1, ids_per_iteration)
        self.counters.rebalanced += sum(len(v) for v in plan.values())
        return plan

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

    def check_invariants(self) -> None:
        """Raise AssertionError when the routing structures disagree (used by tests)."""
        counts = self._index.count
        self._index.check()
        assert counts.keys() == self._replicas.keys(), "in-flight index and routable replicas differ"
        for rid, c in counts.items():
            assert c == len(self._by_replica.get(rid, ())), f"count mismatch on {rid}"
        assert sum(map(len, self._running)) == self._n_running == sum(len(v) for v in self._by_replica.values())
        for shard in self._running:
            for req, rid in shard.items():
                assert req in self._by_replica[rid], f"{req} not on its replica's table"


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_result(None)


def _parked(req: GenerationRequest, replica_id: str = "") -> GenerationResult:
    """An aborted result that carries exactly the request's existing partial output."""
    return GenerationResult(
        request_id=req.request_id,
        token_ids=req.partial_token_ids,
        logprobs=req.partial_logprobs,
        finish_reason="abort",
        replica_id=replica_id,
    )
