"""The controller: the hybrid replicas' lifecycle as an async state machine.

States (reported through ``dynres_state_transition``)::

    STANDALONE_ONLY --activate--> ACTIVATING --> HYBRID_ACTIVE --deactivate--> DEACTIVATING
          ^                           |              |     ^                       |
          |                           | (all failed) |     |                       |
          +---------------------------+         REBALANCING+                       |
          +------------------------------------------------------------------------+

**Activate** (after a weight sync, when the policy says so), in this order:

1. the trainer offloads its parameters and optimizer state (frees the GPUs);
2. every hybrid replica wakes up its weights (``wake_up(["weights"])``);
3. each receives the new weights (``update_weights``), so no stale replica is ever routable;
4. each allocates its KV cache (``wake_up(["kv_cache"])``; after the weights so the peak memory
   is lower, as vLLM recommends);
5. the replicas are registered in the load balancer;
6. they are resumed (until then, requests routed to them wait instead of running).

**Deactivate** (before training), in this order:

1. the hybrid replicas are removed from routing (retries can no longer land on them);
2. their in-flight requests are aborted, and the controller waits until every aborted request
   has come back to the balancer, which retries it on a standalone replica with its partial
   output (or later, on the next activation, when there is none). A replica that answers an
   abort with all its partial results at once (``abort_batch``, see
   :class:`~dynres.runtime.protocols.BatchedReplica`) has handed everything back when that call
   returns: it goes on to sleep at once, while the balancer hands the results to their requests
   and retries them a bounded number per loop iteration;
3. they sleep (release KV cache, offload weights);
4. the trainer onloads.

A full garbage collection would stop the loop for as long as it scans every request in flight,
so none runs during a transition (:func:`~dynres.runtime.loop.gc_control.no_full_collection`).

Each step runs on all replicas concurrently with a per-operation timeout. A replica that fails
(any exception from ``generate``, a weight load, a wake-up) or times out is reported, taken out
of routing, its stuck requests are evicted (retried elsewhere), and it is put on *probation*:
after a backoff (``probation_backoff_s``, doubling with each failure of that replica, at most
``probation_max_s``) a standalone replica gets a health probe (``health()``, then the current
weights through pause, update_weights, resume) and rejoins routing; a hybrid replica becomes
eligible for the next activation again, whose own wake-up is its probe. After ``max_probes``
failed probes in a row it is *retired*. A replica whose ``abort`` or ``sleep`` fails or hangs is
retired at once (its requests and memory are in an unknown state), and so is a replica that
reports itself gone for good through a ``lost_reason`` attribute (a Ray replica whose actor died).

A retired replica is *recreated* when the run has a
:data:`~dynres.runtime.protocols.ReplicaRestarter` and the replica's restart budget
(:mod:`~dynres.runtime.loop.restarts`) is not spent: after the budget's backoff the restarter
builds a new one with the same id, it must pass a health probe, it replaces the old one
everywhere, and it is brought to the current weights before it returns: a standalone replica is
paused, loaded and resumed into routing; a hybrid one joins routing the way an activation does
when the hybrid replicas are active now, else it is put to sleep in its slot for the next
activation. A failed attempt is retried (next backoff) while the budget lasts. Otherwise a
retired replica is *quarantined*: never used again in this run. The trainer's own offload
failing cancels the activation; its onload failing is fatal (training cannot go on).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence

import pluggy

from dynres.core.errors import BackendError, RuntimeStateError
from dynres.runtime.loop.controller_state import ControllerState, ReplicaEvent, StateChange
from dynres.runtime.loop.gc_control import no_full_collection
from dynres.runtime.loop.ops import OpRunner
from dynres.runtime.loop.restarts import RestartBudget
from dynres.runtime.loop.routing import LoadBalancer
from dynres.runtime.protocols import Replica, ReplicaRestarter, TrainEngine, WeightUpdate, lost_reason

logger = logging.getLogger("dynres.runtime.loop.controller")


class Controller:
    """Carries out activations, deactivations, rebalances and weight syncs safely."""

    def __init__(
        self,
        *,
        balancer: LoadBalancer,
        train_engine: TrainEngine,
        hybrid: Sequence[Replica],
        standalone: Sequence[Replica] = (),
        ops: OpRunner,
        pm: pluggy.PluginManager | None = None,
        now: Callable[[], float],
        sleep_level: int = 1,
        probation_backoff_s: float = 1.0,
        probation_max_s: float = 60.0,
        max_probes: int = 5,
        restart: ReplicaRestarter | None = None,
        max_restarts: int = 0,
        cycle: Callable[[], int] = lambda: 0,
        on_replaced: Callable[[Replica, Replica], None] | None = None,
    ) -> None:
        """Create a controller in STANDALONE_ONLY (hybrid replicas asleep, not routable).

        :param balancer: the load balancer the hybrid replicas join and leave.
        :param train_engine: the trainer that lends its GPUs.
        :param hybrid: the hybrid replicas.
        :param standalone: the standalone replicas (probed and brought back after a failure).
        :param ops: runs backend operations with timeouts and records them.
        :param pm: plugin manager for ``dynres_state_transition`` (None: no hook calls).
        :param now: run clock (seconds since run start).
        :param sleep_level: level passed to ``Replica.sleep`` (1 offloads weights to CPU).
        :param probation_backoff_s: wait before a failed replica's first probe (seconds).
        :param probation_max_s: longest wait between probes (seconds; the backoff doubles up to it).
        :param max_probes: failed probes in a row after which a replica is retired (count).
        :param restart: recreates a retired replica (None: a retired replica is quarantined).
        :param max_restarts: restart attempts per replica over the run (count; 0 = never restart).
        :param cycle: the sync cycle in progress (1-based), for the restart records.
        :param on_replaced: called with (old, new) when a recreated replica replaces the old one.
        """
        self.balancer = balancer
        """Routing table the hybrid replicas join on activation and leave on deactivation."""
        self.train_engine = train_engine
        """Trainer whose GPUs the hybrid replicas borrow (offloaded before activation, onloaded after)."""
        self.hybrid: list[Replica] = list(hybrid)
        """All hybrid replicas of the cluster."""
        self.ops = ops
        """Runs each replica/trainer operation under the op timeout and records failures."""
        self.sleep_level = sleep_level
        """Level passed to Replica.sleep on deactivation (1: offload weights to CPU)."""
        self.state = ControllerState.STANDALONE_ONLY
        """Where the hybrid replicas are in their activate/deactivate cycle."""
        self.timeline: list[StateChange] = []
        """Every transition, in order."""
        self.active: list[Replica] = []
        """Hybrid replicas that are routable now."""
        self._init_probation(probation_backoff_s, probation_max_s, max_probes)
        self._init_counters()
        self._standalone: list[Replica] = list(standalone)
        self.restarts = RestartBudget(
            max_restarts=max_restarts if restart is not None else 0,
            backoff_s=probation_backoff_s,
            max_backoff_s=probation_max_s,
            now=now,
            cycle=cycle,
        )
        """Restart attempts per replica and the record of every restart (``report.json``)."""
        self._restart = restart
        self._restarting: dict[str, asyncio.Task[None]] = {}
        self._on_replaced = on_replaced
        self._closed = False
        self._pm = pm
        self._now = now
        self._lock = asyncio.Lock()

    def _init_counters(self) -> None:
        """The transition counts and durations the cycle records read."""
        self.last_activate_duration_s = 0.0
        """Duration of the latest activation (seconds; 0 = none yet)."""
        self.last_deactivate_duration_s = 0.0
        """Duration of the latest deactivation, its grace included (seconds; 0 = none yet)."""
        self.last_grace_finished = 0
        """Requests that finished on the hybrids during the latest deactivation's grace instead of
        being aborted (count; 0 without a grace)."""
        self.activations = 0
        """Successful activations (count)."""
        self.abandoned = 0
        """Activations given up part-way (``activate``'s ``give_up``) (count)."""
        self._activation_t0: float | None = None  # run-clock start of the latest activation
        self.last_abandoned_s = 0.0
        """Duration of the latest abandoned activation, the replicas' sleep and the trainer's onload
        included (seconds; 0 = none yet)."""
        self.deactivations = 0
        """Deactivations (count)."""
        self.rebalances = 0
        """Rebalances (count)."""
        self.overhead_s = 0.0
        """Run-clock time of transitions not spent waiting on backend operations (seconds)."""

    def _init_probation(self, backoff_s: float, max_s: float, max_probes: int) -> None:
        """The failed-replica bookkeeping: probation waits, probes and quarantine."""
        self.quarantined: dict[str, str] = {}
        """Replica id -> why it is never used again in this run."""
        self.probation_backoff_s = backoff_s
        """Wait before a failed replica's first probe (seconds)."""
        self.probation_max_s = max_s
        """Longest wait between two probes of one replica (seconds)."""
        self.max_probes = max_probes
        """Failed probes in a row after which a replica is quarantined (count)."""
        self.probation: dict[str, float] = {}
        """Replica id -> run-clock time before which it is not used again (seconds)."""
        self.replica_events: list[ReplicaEvent] = []
        """Every probation, return and quarantine, in order."""
        self._strikes: dict[str, int] = {}
        self._probes: dict[str, asyncio.Task[None]] = {}
        self.last_update: WeightUpdate | None = None
        """The latest weights published to the replicas (a replica back from probation loads them)."""

    # ---- State ---------------------------------------------------------------------------

    def activation_elapsed_s(self) -> float:
        """Run-clock time the activation in progress has run (seconds; 0.0 outside one)."""
        if self.state is not ControllerState.ACTIVATING or self._activation_t0 is None:
            return 0.0
        return max(0.0, self._now() - self._activation_t0)

    @property
    def is_hybrid_active(self) -> bool:
        """True while hybrid replicas are routable (HYBRID_ACTIVE or REBALANCING)."""
        return self.state in (ControllerState.HYBRID_ACTIVE, ControllerState.REBALANCING)

    @property
    def usable_hybrid(self) -> list[Replica]:
        """Hybrid replicas neither quarantined nor on probation now."""
        t = self._now()
        return [
            r
            for r in self.hybrid
            if r.replica_id not in self.quarantined and self.probation.get(r.replica_id, 0.0) <= t
        ]

    @property
    def standalone(self) -> list[Replica]:
        """The standalone replicas now (a recreated one in place of the one it replaced)."""
        return list(self._standalone)

    @property
    def probing(self) -> bool:
        """True while a replica on probation or being recreated may still come back."""
        return any(not t.done() for t in [*self._probes.values(), *self._restarting.values()])

    def _set(self, new: ControllerState) -> None:
        old = self.state
        if old is new:
            return
        self.state = new
        at = self._now()
        self.timeline.append(StateChange(at, old.value, new.value))
        logger.info("controller %s -> %s at %.3f s", old.value, new.value, at)
        if self._pm is not None:
            try:
                self._pm.hook.dynres_state_transition(old_state=old.value, new_state=new.value, now=at)
            except Exception:
                logger.exception("a dynres_state_transition observer failed; ignored")

    def _require(self, *states: ControllerState, action: str) -> None:
        if self.state not in states:
            raise RuntimeStateError(
                f"cannot {action} in controller state {self.state.value}; allowed in "
                f"{', '.join(s.value for s in states)}"
            )

    # ---- Replica failures ----------------------------------------------------------------

    def quarantine(self, replica: Replica | str, reason: str) -> None:
        """Take a replica out of routing for good and retry its stuck requests elsewhere."""
        rid = replica if isinstance(replica, str) else replica.replica_id
        if rid not in self.quarantined:
            logger.warning("replica %s quarantined for the rest of the run: %s", rid, reason)
            self.quarantined[rid] = reason
            self.replica_events.append(ReplicaEvent(self._now(), rid, "quarantined", reason))
        self.probation.pop(rid, None)
        self.restarts.given_up(rid)
        for tasks in (self._probes, self._restarting):
            task = tasks.pop(rid, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if self.balancer.has_replica(rid):
            self.balancer.remove_replica(rid)
        self.balancer.evict(rid)
        self.active = [r for r in self.active if r.replica_id != rid]

    def suspend(self, replica: Replica | str, reason: str) -> None:
        """Take a failed replica out of routing, retry its stuck requests elsewhere, and put it
        on probation (see the module doc); a quarantined one stays quarantined."""
        rid = replica if isinstance(replica, str) else replica.replica_id
        if rid in self.quarantined or rid in self._restarting:
            return
        lost = lost_reason(self._find(rid))
        if lost:  # e.g. a Ray actor that died: it can never pass a probe
            self.retire(rid, f"{reason}; the replica is lost ({lost})")
            return
        if self.balancer.has_replica(rid):
            self.balancer.remove_replica(rid)
        self.balancer.evict(rid)
        strikes = self._strikes[rid] = self._strikes.get(rid, 0) + 1
        backoff = min(self.probation_max_s, self.probation_backoff_s * 2 ** (strikes - 1))
        self.probation[rid] = self._now() + backoff
        logger.warning("replica %s on probation for %.3g s: %s", rid, backoff, reason)
        self.replica_events.append(ReplicaEvent(self._now(), rid, "probation", reason))
        standalone = next((r for r in self._standalone if r.replica_id == rid), None)
        if standalone is not None and rid not in self._probes:
            self._probes[rid] = asyncio.get_running_loop().create_task(
                self._probe(standalone, backoff), name=f"dynres-probe-{rid}"
            )
        # A hybrid replica stays in ``active``: the next deactivation still aborts and sleeps it.

    async def _probe(self, replica: Replica, backoff: float) -> None:
        """Probe a standalone replica on probation until it passes (it rejoins) or is quarantined."""
        rid = replica.replica_id
        out_at = self._now()
        failed = 0
        while True:
            await asyncio.sleep(max(0.0, self.probation.get(rid, self._now() + backoff) - self._now()))
            try:
                health = await self.ops.one("health", rid, replica.health)
                if not health.healthy:
                    raise RuntimeError(f"health probe says unhealthy: {health.detail or 'no detail'}")
                await self.ops.one("pause", rid, replica.pause)
                await self._load_current(replica)
                await self.ops.one("resume", rid, replica.resume)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failed += 1
                if failed >= self.max_probes:
                    self._probes.pop(rid, None)
                    self.retire(rid, f"{failed} health probes failed, last: {exc}")
                    return
                backoff = min(self.probation_max_s, backoff * 2)
                self.probation[rid] = self._now() + backoff
                continue
            self._probes.pop(rid, None)
            self.probation.pop(rid, None)
            self.replica_events.append(ReplicaEvent(self._now(), rid, "back", f"out for {self._now() - out_at:.3f} s"))
            logger.info("replica %s passed its probe; routable again", rid)
            self.balancer.add_replica(replica)
            return

    async def _load_current(self, replica: Replica) -> None:
        """Load the newest published weights into ``replica``; a sync meanwhile means loading again."""
        while True:
            update = self.last_update
            if update is not None:
                call = functools.partial(replica.update_weights, update)
                await self.ops.one("update_weights", replica.replica_id, call)
            if update is self.last_update:
                return

    # ---- Restarts ------------------------------------------------------------------------

    def _find(self, rid: str) -> Replica | None:
        """The replica with id ``rid`` now (standalone or hybrid), or None."""
        return next((r for r in [*self._standalone, *self.hybrid] if r.replica_id == rid), None)

    def retire(self, replica: Replica | str, reason: str) -> None:
        """Take a replica out for good: recreate it when its restart budget allows, else quarantine it."""
        rid = replica if isinstance(replica, str) else replica.replica_id
        if rid in self.quarantined or rid in self._restarting:
            return
        old = self._find(rid)
        if old is None or self._closed or self._restart is None or self.restarts.left(rid) == 0:
            if self.restarts.max_restarts > 0 and not self._closed and self.restarts.left(rid) == 0:
                reason += f"; its restart budget ({self.restarts.max_restarts}) is spent"
            self.quarantine(rid, reason)
            return
        # Out of everything at once, so no late failure of its old requests reaches the new one.
        if self.balancer.has_replica(rid):
            self.balancer.remove_replica(rid)
        self.balancer.evict(rid)
        self.active = [r for r in self.active if r.replica_id != rid]
        self.probation[rid] = float("inf")  # not a candidate for activation while it is rebuilt
        probe = self._probes.pop(rid, None)
        if probe is not None and probe is not asyncio.current_task():
            probe.cancel()
        logger.warning("replica %s is gone (%s); recreating it", rid, reason)
        self.replica_events.append(ReplicaEvent(self._now(), rid, "restart", reason))
        self.restarts.begin(rid, reason)
        self._restarting[rid] = asyncio.get_running_loop().create_task(
            self._recreate(old, reason, self._restart), name=f"dynres-restart-{rid}"
        )

    async def _recreate(self, old: Replica, reason: str, restart: ReplicaRestarter) -> None:
        """Rebuild ``old`` until one passes its probe and returns, or the budget is spent."""
        rid = old.replica_id
        last = reason
        while self.restarts.left(rid) > 0:
            await asyncio.sleep(self.restarts.next_wait(rid))
            try:
                started = self._now()
                new = await self.ops.one("restart", rid, functools.partial(restart, old))
                rebuild_s = self._now() - started
                if new.replica_id != rid or new.kind != old.kind:
                    raise BackendError(f"the restarter returned {new.replica_id!r} ({new.kind}) for {rid!r}")
                health = await self.ops.one("health", rid, new.health)
                if not health.healthy:
                    raise BackendError(f"health probe says unhealthy: {health.detail or 'no detail'}")
                self._replace(old, new)
                old = new
                await self._bring_back(new, sleeping=health.sleeping)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                last = f"{type(exc).__name__}: {exc}"
                logger.warning("restart of replica %s failed: %s", rid, last)
                continue
            self._restarting.pop(rid, None)
            self.probation.pop(rid, None)
            seconds = self.restarts.returned(rid, rebuild_s)
            self.replica_events.append(
                ReplicaEvent(self._now(), rid, "back", f"recreated after {seconds:.3f} s (rebuild {rebuild_s:.3f} s)")
            )
            logger.warning("replica %s recreated and back after %.1f s (rebuild %.1f s)", rid, seconds, rebuild_s)
            return
        self._restarting.pop(rid, None)
        self.quarantine(rid, f"{reason}; its restart budget ({self.restarts.max_restarts}) is spent, last: {last}")

    def _replace(self, old: Replica, new: Replica) -> None:
        """Put ``new`` in place of ``old`` in the replica lists and tell ``on_replaced``."""
        self._standalone = [new if r is old else r for r in self._standalone]
        self.hybrid = [new if r is old else r for r in self.hybrid]
        if self._on_replaced is not None:
            self._on_replaced(old, new)

    async def _bring_back(self, new: Replica, *, sleeping: bool) -> None:
        """Bring a recreated replica (``sleeping``: it started asleep) to the current weights and
        back: into routing (standalone, or hybrid while the hybrid replicas are active), or asleep
        in its hybrid slot."""
        if new in self._standalone:
            await self._join(new, sleeping=sleeping)
            return
        async with self._lock:  # no activation or deactivation meanwhile
            if self.state is ControllerState.HYBRID_ACTIVE:
                await self._join(new, sleeping=sleeping)
                self.active.append(new)
            elif not sleeping:  # the trainer holds the slot's memory: give the engine's back
                await self.ops.one("sleep", new.replica_id, functools.partial(new.sleep, self.sleep_level))

    async def _join(self, new: Replica, *, sleeping: bool) -> None:
        """Load the current weights into ``new`` (woken the way an activation wakes a replica when
        it started asleep) and route to it."""
        rid = new.replica_id
        if sleeping:
            await self.ops.one("wake_up", rid, functools.partial(new.wake_up, ["weights"]))
            await self._load_current(new)
            await self.ops.one("wake_up", rid, functools.partial(new.wake_up, ["kv_cache"]))
        else:
            await self.ops.one("pause", rid, new.pause)
            await self._load_current(new)
        await self.ops.one("resume", rid, new.resume)
        self.balancer.add_replica(new)

    async def close(self) -> None:
        """Stop the probes and restarts of replicas that are out (end of run; none starts after)."""
        self._closed = True
        tasks = [*self._probes.values(), *self._restarting.values()]
        self._probes.clear()
        self._restarting.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def on_replica_failure(self, replica_id: str, exc: BaseException) -> None:
        """Balancer callback: a replica raised during generation (already out of routing)."""
        self.ops.record_failure("generate", replica_id, f"{type(exc).__name__}: {exc}", timeout=False)
        if replica_id in self.probation or replica_id in self.quarantined or replica_id in self._restarting:
            return  # another request saw the same failure first
        self.suspend(replica_id, f"generate failed: {type(exc).__name__}: {exc}")

    # ---- Transitions ---------------------------------------------------------------------

    async def activate(self, update: WeightUpdate, give_up: Callable[[], Awaitable[bool]] | None = None) -> bool:
        """Wake the hybrid replicas with ``update`` and make them routable; True if any joined.

        ``give_up`` is awaited between the phases (after the trainer's offload, the weights'
        wake-up and the weight load); once it returns True the activation stops there: the
        woken replicas sleep again, the trainer is onloaded, ``abandoned`` counts it, and the
        result is False.
        """
        async with self._lock, no_full_collection():
            self._require(ControllerState.STANDALONE_ONLY, action="activate")
            candidates = self.usable_hybrid
            if not candidates:
                return False
            t0 = self._activation_t0 = self._now()
            waited = 0.0
            self._set(ControllerState.ACTIVATING)

            async def phase(op: str, targets: list[Replica], call: Callable) -> list[Replica]:
                nonlocal waited
                ts = self._now()
                ok, bad = await self.ops.many(op, targets, call)
                waited += self._now() - ts
                for r in bad:
                    self.suspend(r, f"{op} failed during activation")
                return ok

            try:
                ts = self._now()
                await self.ops.one("offload", "trainer", self.train_engine.offload)
                waited += self._now() - ts
            except BackendError:
                self._set(ControllerState.STANDALONE_ONLY)
                return False
            steps: list[tuple[str, Callable]] = [
                ("wake_up", lambda r: r.wake_up(["weights"])),
                ("update_weights", lambda r: r.update_weights(update)),
                ("wake_up", lambda r: r.wake_up(["kv_cache"])),
            ]
            ok, woken = list(candidates), list[Replica]()
            for op, call in steps:
                if give_up is not None and await give_up():
                    await self._give_back(woken, t0, waited)
                    return False
                ok = woken = await phase(op, ok, call)
            self.balancer.add_replicas(ok)  # one capacity change for all of them
            self.active = list(ok)
            ok = await phase("resume", ok, lambda r: r.resume())
            failed = [r for r in candidates if r not in ok]
            if failed:
                # Give back whatever memory the failed replicas took; they stay on probation.
                ts = self._now()
                _, bad_sleep = await self.ops.many("sleep", failed, lambda r: r.sleep(self.sleep_level))
                waited += self._now() - ts
                for r in bad_sleep:
                    self.retire(r, "sleep failed after a failed activation")
            if not ok:
                ts = self._now()
                await self.ops.one("onload", "trainer", self.train_engine.onload)
                waited += self._now() - ts
                self._set(ControllerState.STANDALONE_ONLY)
                self.overhead_s += max(0.0, self._now() - t0 - waited)
                return False
            self.active = list(ok)
            for r in ok:
                self.probation.pop(r.replica_id, None)  # the wake-up was its probe
            self.last_update = update
            self.activations += 1
            self.last_activate_duration_s = self._now() - t0
            self.overhead_s += max(0.0, self.last_activate_duration_s - waited)
            self._set(ControllerState.HYBRID_ACTIVE)
            return True

    async def _give_back(self, woken: list[Replica], t0: float, waited: float) -> None:
        """End an activation given up after its phases woke ``woken``: they sleep again and the
        trainer is onloaded (``t0``: its start; ``waited``: its seconds in engine operations so far)."""
        ts = self._now()
        _, bad_sleep = await self.ops.many("sleep", woken, lambda r: r.sleep(self.sleep_level))
        for r in bad_sleep:
            self.retire(r, "sleep failed after an abandoned activation")
        await self.ops.one("onload", "trainer", self.train_engine.onload)
        waited += self._now() - ts
        self.abandoned += 1
        self.last_abandoned_s = self._now() - t0
        self.overhead_s += max(0.0, self.last_abandoned_s - waited)
        self._set(ControllerState.STANDALONE_ONLY)

    async def deactivate(self, grace_s: float = 0.0) -> None:
        """Hand the GPUs back: cut routing, let the running requests finish for up to ``grace_s``
        seconds (the policy's ``deactivate_grace_s``), abort and drain the rest, sleep, onload the trainer."""
        async with self._lock, no_full_collection():
            self._require(ControllerState.HYBRID_ACTIVE, action="deactivate")
            t0 = self._now()
            waited = 0.0
            self._set(ControllerState.DEACTIVATING)
            replicas = list(self.active)
            # One capacity change for all of them, not one per replica.
            self.balancer.remove_replicas([r.replica_id for r in replicas if self.balancer.has_replica(r.replica_id)])
            if grace_s > 0:
                ts = self._now()
                self.last_grace_finished = await self._grace(replicas, grace_s)
                waited += self._now() - ts
            else:
                self.last_grace_finished = 0

            async def abort_and_drain(r: Replica) -> None:
                if self.balancer.can_batch_abort(r):
                    if await self.balancer.abort_batch(r):
                        return  # every request is back; the re-queue goes on in the balancer
                else:
                    await r.abort(None)
                await self.balancer.wait_idle(r.replica_id)

            ts = self._now()
            _, bad = await self.ops.many("abort", replicas, abort_and_drain)
            for r in bad:
                # Its requests' state is unknown and each deactivation would wait op_timeout_s
                # on it again: recreate it, or never use it again.
                self.retire(r, "abort failed or hung during deactivation")
            replicas = [r for r in replicas if r not in bad]
            _, bad_sleep = await self.ops.many("sleep", replicas, lambda r: r.sleep(self.sleep_level))
            waited += self._now() - ts
            for r in bad_sleep:
                self.retire(r, "sleep failed during deactivation")
            self.active = []
            ts = self._now()
            try:
                await self.ops.one("onload", "trainer", self.train_engine.onload)
            finally:
                waited += self._now() - ts
                self.deactivations += 1
                self.last_deactivate_duration_s = self._now() - t0
                self.overhead_s += max(0.0, self.last_deactivate_duration_s - waited)
                self._set(ControllerState.STANDALONE_ONLY)

    async def _grace(self, replicas: list[Replica], grace_s: float) -> int:
        """Wait up to ``grace_s`` seconds for the requests running on ``replicas`` (out of routing)
        to finish on their own; return how many did. Those still running are aborted next."""
        before = sum(self.balancer.in_flight(r.replica_id) for r in replicas)
        if not before:
            return 0
        idle = asyncio.gather(*(self.balancer.wait_idle(r.replica_id) for r in replicas))
        try:
            await asyncio.wait_for(idle, grace_s)
        except TimeoutError:
            pass  # the tail that did not finish in time is aborted as without a grace
        return before - sum(self.balancer.in_flight(r.replica_id) for r in replicas)

    async def rebalance(self) -> int:
        """Move just enough in-flight requests onto the least loaded replicas; return how many."""
        async with self._lock, no_full_collection():
            self._require(ControllerState.HYBRID_ACTIVE, action="rebalance")
            t0 = self._now()
            self._set(ControllerState.REBALANCING)
            plan = await self.balancer.plan_rebalance_spread()
            targets = [self.balancer.replica(rid) for rid in plan if plan[rid]]
            ts = self._now()
            _, bad = await self.ops.many("abort", targets, lambda r: self._abort_some(r, plan[r.replica_id]))
            waited = self._now() - ts
            for r in bad:
                self.retire(r, "abort failed during rebalance")
            self.rebalances += 1
            self.overhead_s += max(0.0, self._now() - t0 - waited)
            self._set(ControllerState.HYBRID_ACTIVE)
            moved = sum(len(v) for v in plan.values())
            logger.info("rebalance moved %d requests", moved)
            return moved

    async def _abort_some(self, replica: Replica, request_ids: list[str]) -> None:
        """Abort ``request_ids`` on a routable replica; they are retried through the balancer."""
        if self.balancer.can_batch_abort(replica):
            await self.balancer.abort_batch(replica, request_ids)
        else:
            await replica.abort(request_ids)

    async def sync_weights(self, replicas: Sequence[Replica], update: WeightUpdate) -> list[Replica]:
        """Pause, load ``update`` and resume each replica concurrently; return those that failed.

        In-flight requests are kept across the pause and continue with the new weights (partial
        rollout). A replica that fails is quarantined and its requests retried elsewhere.
        """

        async def one(r: Replica) -> None:
            rid = r.replica_id
            await self.ops.one("pause", rid, r.pause)
            await self.ops.one("update_weights", rid, lambda: r.update_weights(update))
            await self.ops.one("resume", rid, r.resume)

        self.last_update = update
        results = await asyncio.gather(*(one(r) for r in replicas), return_exceptions=True)
        failed = []
        for r, res in zip(replicas, results, strict=True):
            if isinstance(res, asyncio.CancelledError):
                raise res
            if isinstance(res, BaseException):
                failed.append(r)
                self.suspend(r, f"weight sync failed: {res}")
        return failed

    async def abort_everywhere(self) -> None:
        """Abort every request on every routable replica (end of run; the balancer is draining)."""
        targets = [self.balancer.replica(rid) for rid in self.balancer.replica_ids]

        async def abort_and_drain(r: Replica) -> None:
            await r.abort(None)
            await self.balancer.wait_idle(r.replica_id)

        _, bad = await self.ops.many("abort", targets, abort_and_drain)
        for r in bad:
            self.quarantine(r, "abort failed or hung at the end of the run")
