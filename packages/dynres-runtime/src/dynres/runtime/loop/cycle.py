"""The trainer loop: sync cycles of collections, weight syncs, and the policy calls between them.

One sync cycle, in order (``g`` = global_steps before the cycle):

1. ``should_deactivate(ctx)`` (only asked while hybrid replicas are active). If yes:
   ``deactivate_wait_samples(ctx)`` and ``deactivate_grace_s(ctx)`` (both clamped by
   :mod:`~dynres.runtime.loop.decisions`); wait until the queue holds that many samples
   (``wait_for_enough_samples``), then deactivate, letting the hybrids' running requests finish
   for up to the grace before the rest are aborted.
2. ``trigger_parameter_sync_step`` collections. Each waits for ``required_samples`` fresh
   samples (recording the wait time and ``max(0, required - queue size when the wait began)``)
   and runs one ``train_step``. Training needs the trainer's GPUs, so if the hybrid replicas are
   still active at that point (the policy kept them), they are deactivated first.
3. Weight sync: the trainer exports weights (version ``g + 1``), the standalone replicas load
   them (pause, update, resume; requests in flight continue with the new weights), the
   rollouter's staleness budget is reset, the rollout window closes; ``global_steps = g + 1``.
4. ``should_activate_after_step(ctx)``; if yes, activate (the hybrid replicas get the same
   weights during activation); an only-hybrid cluster always activates (the decisions module
   clamps the answer: nothing else could generate). After an activation, if
   ``dynamic_schedule_enable_rebalance`` is on, ``should_rebalance(ctx)`` and a rebalance if yes.
   After the run's final sync nothing is activated (nothing will be generated any more) and
   the policy is not asked. Then ``admit_extra_samples(ctx)`` (clamped to
   ``[0, step_required_samples]``): how many samples the new weight version may admit beyond
   the staleness budget (not asked after the final sync either).
5. ``update_after_step(ctx)`` with the same context as step 4.
6. The cycle's metrics (:func:`dynres.core.metrics.cycle_metrics`) are emitted through
   ``dynres_metrics_emitted``.

Between steps 3 and 4 the run may write a checkpoint (``LoopWiring.checkpoint``): the trainer
is idle and holds the weights just published, every train step of the cycle is in the ledger,
and the policy has not yet been asked about the cycle, so a run resumed from it asks exactly
the questions the original run asked next. The checkpoint also holds the cycle's metrics record as
it stands then (before its decisions), which a resumed run writes when the killed process had not.

Before the first cycle an initial weight sync (the same method, without a new version) publishes
version 0 (or a checkpoint's) and steps 4-5 run once with ``global_steps = 0``, so an
only-hybrid cluster can start generating. :meth:`TrainerLoop.cycle` runs the steps as short
methods in this order: deactivate, collect, sync, decide, report.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pluggy

from dynres.core.errors import BackendError
from dynres.core.metrics import MicroStep, cycle_metrics, train_compute_time
from dynres.runtime.loop.controller import Controller
from dynres.runtime.loop.decisions import DecisionGuard, DecisionRecord
from dynres.runtime.loop.ledger import LedgerWriter
from dynres.runtime.loop.ops import OpRunner
from dynres.runtime.loop.queue import MessageQueue
from dynres.runtime.loop.report import CycleReport, batch_stats
from dynres.runtime.loop.rollouter import Rollouter
from dynres.runtime.loop.routing import LoadBalancer
from dynres.runtime.loop.tracker import CycleMeasurements, RunTracker
from dynres.runtime.protocols import Replica, TrainEngine, WeightUpdate

logger = logging.getLogger("dynres.runtime.loop.cycle")


class StopRun(Exception):
    """Internal: the run cannot continue (no more samples); carries the reason."""


@dataclass(frozen=True)
class LoopWiring:
    """The run's live components the trainer loop drives (built once by run.FullyAsyncRun)."""

    train_engine: TrainEngine
    """Trains on each collection and exports the weights at each sync."""
    standalone: Sequence[Replica]
    """Replicas on dedicated rollout GPUs; each weight sync reaches those still routable."""
    balancer: LoadBalancer
    """Routing table: tells which replicas are routable (hence which receive weights)."""
    controller: Controller
    """Carries out activation, deactivation, rebalance and weight loading."""
    guard: DecisionGuard
    """Asks the policy, with timeout, type check, fallback and clamps."""
    tracker: RunTracker
    """Step bookkeeping; builds each decision's ScheduleContext."""
    queue: MessageQueue
    """Finished samples waiting for the trainer."""
    rollouter: Rollouter
    """Admits samples to the replicas; owns the staleness budget and rollout windows."""
    ops: OpRunner
    """Runs and times the trainer's backend calls (export_weights, train_step)."""
    pm: pluggy.PluginManager
    """Plugin manager that receives ``dynres_metrics_emitted``."""
    now: Callable[[], float]
    """Run clock (seconds since the run started)."""
    ledger: LedgerWriter | None = None
    """Gets one line per trained sample after each train step (None: no ledger file)."""
    checkpoint: Callable[[int, Callable[[], dict[str, Any]]], Awaitable[None]] | None = None
    """Called with global_steps and the cycle's metrics record as it stands (a callable, built only
    when wanted) after each cycle's weight sync, before the policy's decisions (the run writes a
    checkpoint when one is due); None: never."""


@dataclass
class _Collection:
    """What one collection (one train_step) measured."""

    started_s: float
    """Run-clock time the collection's allocated time starts (the cycle's start for the first)."""
    wait_s: float
    """Seconds the trainer waited for its samples."""
    wait_samples: int
    """max(0, required - queue size when the wait began) (samples)."""
    counted_wait_s: float
    """Wait that counts in the MicroStep: the deactivation wait (first collection) plus any wait
    during which hybrid replicas generated (seconds)."""
    phase_times: dict[str, float]
    """The train step's phase durations (seconds)."""
    queue_size_after: int
    """Queue size right after the train step (samples)."""
    ended_s: float
    """Run-clock time the train step returned."""


@dataclass
class _Cycle:
    """One sync cycle's measurements, filled in by the steps in order."""

    start_s: float
    hybrid_at_start: bool
    deactivations_before: int
    dropped_before: int
    generated_before: int
    decisions: list[DecisionRecord] = field(default_factory=list)
    wait_target: int | None = None
    deactivate_wait_s: float = 0.0
    deactivate_s: float = 0.0
    grace_finished: int = 0
    collections: list[_Collection] = field(default_factory=list)
    train_call_s: float = 0.0
    train_metrics: dict[str, float] = field(default_factory=dict)
    activated: bool = False
    abandoned_s: float = 0.0
    rebalanced: bool = False
    moved: int = 0
    sync_s: float = 0.0
    queue_size_end: int = 0
    train_step_times: list[float] = field(default_factory=list)
    trained: list[Any] = field(default_factory=list)


class TrainerLoop:
    """Drives sync cycles: policy calls, collections, fit steps, weight syncs, metrics."""

    def __init__(
        self,
        wiring: LoopWiring,
        *,
        enable_rebalance: bool,
        partial_rollout: bool,
        hybrid_gpus: int,
        standalone_gpus: int,
    ) -> None:
        """Drive ``wiring``'s components; the flags come from async_training, the GPUs are the metric's a and b."""
        self.wiring = wiring
        """The run's components this loop drives (engine, replicas, controller, guard, queue, ...)."""
        self.enable_rebalance = enable_rebalance
        """Ask should_rebalance after each activation (dynamic_schedule_enable_rebalance)."""
        self.partial_rollout = partial_rollout
        """False: drain running samples before new weights arrive (one version per response)."""
        self.hybrid_gpus = hybrid_gpus
        """GPUs shared by trainer and hybrid replicas, the metric's a (count)."""
        self.standalone_gpus = standalone_gpus
        """GPUs of the standalone replicas, the metric's b (count)."""
        self.version = 0
        """Weight version last published (count of syncs)."""
        self.last_update: WeightUpdate | None = None
        """The latest exported weights (hybrid replicas get them when activated)."""

    # ---- Helpers ----------------------------------------------------------------------------

    def _no_producer(self) -> bool:
        """True when nothing can generate until the trainer itself acts."""
        w = self.wiring
        return w.rollouter.finished() or (
            w.balancer.num_replicas == 0 and not w.controller.is_hybrid_active and not w.controller.probing
        )

    async def _wait_batch(self) -> list[Any]:
        """Wait for one collection, activating hybrid replicas if nothing else could produce it."""
        w = self.wiring
        required = w.tracker.required_samples
        while True:
            batch = await w.queue.get_batch(required, w.tracker.global_steps, exhausted=self._no_producer)
            if batch is not None:
                return batch
            if w.rollouter.finished():
                raise StopRun(
                    f"the prompt source ran out: {w.queue.size} samples queued, "
                    f"{required} needed for the next collection"
                )
            # No replica is routable and the hybrid replicas are asleep (standalone replicas
            # died, or stale drops emptied an only-hybrid cycle): lend the trainer's GPUs.
            if not w.controller.usable_hybrid or self.last_update is None:
                raise StopRun(
                    "no replica can generate: every standalone replica failed and no hybrid replica is usable"
                )
            logger.warning("no replica can generate the next collection; activating hybrid replicas")
            if not await w.controller.activate(self.last_update):
                raise StopRun("no replica can generate: activating the hybrid replicas failed")
            w.tracker.hybrid_started()

    # ---- The steps, in order ----------------------------------------------------------------

    async def _deactivate(self, c: _Cycle) -> None:
        """Step 1: if hybrid replicas are active and the policy says so, wait, then deactivate."""
        w = self.wiring
        if not w.controller.is_hybrid_active:
            return
        ctx = w.tracker.context()
        rec = await w.guard.decide("should_deactivate", ctx)
        c.decisions.append(rec)
        if not rec.value:
            return
        wrec = await w.guard.decide("deactivate_wait_samples", ctx)
        c.decisions.append(wrec)
        grec = await w.guard.decide("deactivate_grace_s", ctx)
        c.decisions.append(grec)
        target = c.wait_target = int(wrec.value)
        t0 = w.now()
        # Near the end of a run the queue may never reach the target: stop waiting once it
        # holds all the run still needs.
        await w.queue.wait_until(
            lambda: w.queue.size >= target or w.rollouter.finished() or w.rollouter.demand_queued()
        )
        c.deactivate_wait_s = w.now() - t0
        w.tracker.hybrid_stopping()
        await w.controller.deactivate(float(grec.value))
        c.deactivate_s = w.controller.last_deactivate_duration_s
        c.grace_finished = w.controller.last_grace_finished

    async def _collect(self, c: _Cycle) -> None:
        """Step 2: trigger_parameter_sync_step collections, one train_step each."""
        for i in range(self.wiring.tracker.trigger_parameter_sync_step):
            await self._collect_one(c, i)

    async def _collect_one(self, c: _Cycle, i: int) -> None:
        """Collection ``i`` of the cycle: wait for its samples, then one train_step.

        Training needs the trainer's GPUs, so hybrid replicas still active then are handed back
        first (:meth:`_hand_back_for_training`).
        """
        w = self.wiring
        required = w.tracker.required_samples
        started = c.start_s if i == 0 else w.now()
        w.queue.purge_stale(w.tracker.global_steps)
        wait_samples = max(0, required - w.queue.size)
        tw = w.now()
        batch = await self._wait_batch()
        waited = w.now() - tw
        hybrid_wait = 0.0
        if w.controller.is_hybrid_active:
            # The policy kept the hybrid replicas generating (or nothing else could), but
            # training needs the GPUs. The hybrid replicas generated during this wait, so
            # it counts as hybrid rollout time (the x of resource_utilization).
            hybrid_wait = waited
            await self._hand_back_for_training(c)
        ts = w.now()
        result = await self._train(batch)
        c.train_call_s += w.now() - ts
        c.train_step_times.append(w.now() - ts)
        c.trained.extend(batch)
        if w.ledger is not None:
            w.ledger.record(batch, w.tracker.global_steps + 1)
        c.train_metrics = dict(result.metrics)
        c.collections.append(
            _Collection(
                started_s=started,
                wait_s=waited,
                wait_samples=wait_samples,
                counted_wait_s=(c.deactivate_wait_s if i == 0 else 0.0) + hybrid_wait,
                phase_times=dict(result.phase_times),
                queue_size_after=w.queue.size,
                ended_s=w.now(),
            )
        )

    async def _hand_back_for_training(self, c: _Cycle) -> None:
        """Deactivate the hybrid replicas a train step finds active (their GPUs are the trainer's)."""
        w = self.wiring
        w.tracker.hybrid_stopping()
        await w.controller.deactivate()
        c.deactivate_s = w.controller.last_deactivate_duration_s

    async def _train(self, batch: list[Any]) -> Any:
        """One train_step on ``batch``; retried once when the engine marks its error retryable.

        When it fails for good (raises, or hangs past op_timeout_s) the batch goes back to the
        front of the queue, so a checkpoint still holds it, and the error is raised.
        """
        w = self.wiring
        step = functools.partial(w.train_engine.train_step, batch)
        try:
            try:
                return await w.ops.one("train_step", "trainer", step)
            except BackendError as exc:
                if not _retryable(exc):
                    raise
                logger.warning("train_step failed with a retryable error (%s); retrying it once", exc)
                return await w.ops.one("train_step", "trainer", step)
        except BaseException:
            w.queue.requeue(batch)
            raise

    async def _sync(self, *, new_version: bool = True, reset: bool = True) -> WeightUpdate:
        """Step 3: export weights (a new version unless startup) and load them into the routable
        standalone replicas; reset the staleness budget (unless ``reset`` is False: verl's
        trainer resets it after the hybrid activation, see :meth:`_reset_staleness`)."""
        w = self.wiring
        if new_version:
            self.version += 1
        exported = await w.ops.one("export_weights", "trainer", w.train_engine.export_weights)
        update = dataclasses.replace(exported, version=self.version)
        if new_version and not self.partial_rollout:
            # Without partial rollout a response must come from one weight version: let the
            # running samples finish before the new weights arrive.
            w.rollouter.pause_admission()
            await w.rollouter.drain()
        targets = [r for r in w.controller.standalone if w.balancer.has_replica(r.replica_id)]
        await w.controller.sync_weights(targets, update)
        self.last_update = update
        if reset:
            self._reset_staleness()
        return update

    def _reset_staleness(self) -> None:
        """A new weight version is out: a fresh staleness budget, admission resumed."""
        self.wiring.rollouter.reset_staleness(self.version)
        self.wiring.rollouter.resume_admission()

    def _end_cycle(self, c: _Cycle) -> tuple[list[Any], float]:
        """Close the rollout window and count the cycle in global_steps; return the window."""
        w = self.wiring
        window = w.rollouter.take_window()
        w.tracker.end_cycle(
            CycleMeasurements(
                wait_times=tuple(k.wait_s for k in c.collections),
                wait_samples=tuple(k.wait_samples for k in c.collections),
                cycle_time_s=w.now() - c.start_s,
                train_time_s=sum(train_compute_time(k.phase_times) for k in c.collections),
                train_call_s=c.train_call_s,
                consumed=w.tracker.step_required_samples,
                generated=w.rollouter.generated - c.generated_before,
                sync_s=c.sync_s,
            )
        )
        # Read before any end-of-cycle activation: its rebalance and the hybrid replicas'
        # output would otherwise count towards this cycle's queue (above the staleness cap).
        c.queue_size_end = w.queue.size
        return window

    async def _decide(self, update: WeightUpdate, decisions: list[DecisionRecord]) -> tuple[bool, bool, int]:
        """Steps 4-5: activation, rebalance, policy update; return (activated, rebalanced, moved)."""
        w = self.wiring
        ctx = w.tracker.context()
        activated = rebalanced = False
        moved = 0
        if w.tracker.total_steps and w.tracker.global_steps >= w.tracker.total_steps:
            # The run's final sync: nothing will be generated any more, so an activation would
            # only cost its switch (the policy still learns from the cycle).
            decisions.append(await w.guard.decide("update_after_step", ctx))
            return activated, rebalanced, moved
        rec = await w.guard.decide("should_activate_after_step", ctx)
        decisions.append(rec)
        if rec.value and not w.controller.is_hybrid_active and w.controller.usable_hybrid:
            activated = await w.controller.activate(update, self._abandon_asker(decisions))
            if activated:
                w.tracker.hybrid_started()
            if activated and self.enable_rebalance:
                rrec = await w.guard.decide("should_rebalance", w.tracker.context())
                decisions.append(rrec)
                if rrec.value:
                    moved = await w.controller.rebalance()
                    rebalanced = True
        erec = await w.guard.decide("admit_extra_samples", ctx)
        decisions.append(erec)
        w.rollouter.admit_extra(erec.value)
        decisions.append(await w.guard.decide("update_after_step", ctx))
        return activated, rebalanced, moved

    def _abandon_asker(self, decisions: list[DecisionRecord]) -> Callable[[], Awaitable[bool]] | None:
        """What the controller awaits between an activation's phases: once the next collection's
        samples are queued, the policy's ``should_abandon_activation``, asked once (None when the
        policy writes no such decision, so nothing is asked)."""
        w = self.wiring
        if not w.guard.policy.decides("should_abandon_activation"):
            return None
        asked = False

        async def give_up() -> bool:
            nonlocal asked
            if asked or w.queue.size < w.tracker.required_samples:
                return False
            asked = True
            rec = await w.guard.decide("should_abandon_activation", w.tracker.context())
            decisions.append(rec)
            return bool(rec.value)

        return give_up

    def _report(self, c: _Cycle, window: tuple[list[Any], float], decided_s: float) -> CycleReport:
        """Step 6: the cycle's metrics and report; emit ``dynres_metrics_emitted``."""
        report = self._cycle_report(c, window, decided_s)
        try:
            self.wiring.pm.hook.dynres_metrics_emitted(step=report.step, metrics=dict(report.metrics))
        except Exception:
            logger.exception("a dynres_metrics_emitted observer failed; ignored")
        return report

    def _cycle_report(self, c: _Cycle, window: tuple[list[Any], float], decided_s: float) -> CycleReport:
        """The cycle's metrics and report as they stand at ``decided_s`` (run clock); emits nothing."""
        w = self.wiring
        last = len(c.collections) - 1
        micro = []
        for n, k in enumerate(c.collections):
            # The last collection's allocated time runs on through the sync and the decisions.
            allocated = (decided_s if n == last else k.ended_s) - k.started_s
            micro.append(
                MicroStep(
                    phase_times=k.phase_times,
                    allocated_s=allocated,
                    wait_s=k.counted_wait_s,
                    step_s=allocated,
                    queue_size_after=k.queue_size_after,
                )
            )
        points, window_end = window
        metrics = cycle_metrics(
            micro, points, window_end, hybrid_gpus=self.hybrid_gpus, standalone_gpus=self.standalone_gpus
        )
        t_end = w.now()
        return CycleReport(
            step=w.tracker.global_steps,
            start_s=c.start_s,
            end_s=t_end,
            duration_s=t_end - c.start_s,
            metrics=metrics,
            hybrid_active_at_start=c.hybrid_at_start,
            deactivated=w.controller.deactivations > c.deactivations_before,
            activated=c.activated,
            rebalanced=c.rebalanced,
            rebalanced_requests=c.moved,
            deactivate_wait_samples=c.wait_target,
            wait_for_enough_samples_s=sum(m.wait_s for m in micro),
            step_wait_times=[k.wait_s for k in c.collections],
            step_wait_samples=[k.wait_samples for k in c.collections],
            samples_generated=w.rollouter.generated - c.generated_before,
            samples_consumed=w.tracker.step_required_samples,
            samples_dropped_stale=w.queue.dropped_stale - c.dropped_before,
            queue_size_end=c.queue_size_end,
            weight_version=self.version,
            activate_duration_s=w.controller.last_activate_duration_s if c.activated else 0.0,
            deactivate_duration_s=c.deactivate_s,
            grace_finished_requests=c.grace_finished,
            activation_abandoned_s=c.abandoned_s,
            train_metrics=c.train_metrics,
            decisions=c.decisions,
            weight_sync_s=c.sync_s,
            train_step_times=list(c.train_step_times),
            batch=batch_stats(c.trained),
        )

    # ---- Public steps -----------------------------------------------------------------------

    async def startup(self) -> list[DecisionRecord]:
        """Initial weight sync (the current version: 0, or a checkpoint's) and the activation
        decisions before the first cycle."""
        update = await self._sync(new_version=False)
        decisions: list[DecisionRecord] = []
        await self._decide(update, decisions)
        return decisions

    async def cycle(self) -> CycleReport:
        """Run one sync cycle and return its report (raises StopRun when samples run out)."""
        w = self.wiring
        c = _Cycle(
            start_s=w.now(),
            hybrid_at_start=w.controller.is_hybrid_active,
            deactivations_before=w.controller.deactivations,
            dropped_before=w.queue.dropped_stale,
            generated_before=w.rollouter.generated,
        )
        await self._deactivate(c)
        await self._collect(c)
        t_sync = w.now()
        update = await self._sync()
        c.sync_s = w.now() - t_sync
        window = self._end_cycle(c)
        if w.checkpoint is not None:
            # The record as it stands goes into a checkpoint: a process killed before the cycle's
            # record is written (after the decisions) gets it back on resume.
            await w.checkpoint(w.tracker.global_steps, lambda: self._cycle_report(c, window, w.now()).to_record())
        abandoned = w.controller.abandoned
        c.activated, c.rebalanced, c.moved = await self._decide(update, c.decisions)
        c.abandoned_s = w.controller.last_abandoned_s if w.controller.abandoned > abandoned else 0.0
        return self._report(c, window, decided_s=w.now())


def _retryable(exc: BaseException) -> bool:
    """True when the error (or the engine error it wraps) has a true ``retryable`` attribute."""
    return bool(getattr(exc, "retryable", False) or getattr(exc.__cause__, "retryable", False))


async def maybe_await(value: Any) -> None:
    """Await ``value`` when it is awaitable (progress callbacks may be sync or async)."""
    if isinstance(value, Awaitable):
        await value
