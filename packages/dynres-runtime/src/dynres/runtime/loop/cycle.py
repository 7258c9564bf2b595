"""The trainer loop: sync cycles of collections, weight syncs, and the policy calls between them.

One sync cycle, in order (``g`` = global_steps before the cycle):

1. ``should_deactivate(ctx)`` (only asked while hybrid replicas are active). If yes:
   ``deactivate_wait_samples(ctx)``, clamped to ``[step_required, step_required + buffer]`` in an
   only-hybrid cluster and to ``[0, step_required + buffer]`` otherwise; wait until the queue
   holds that many samples (``wait_for_enough_samples``), then deactivate.
2. ``trigger_parameter_sync_step`` collections. Each waits for ``required_samples`` fresh
   samples (recording the wait time and ``max(0, required - queue size when the wait began)``)
   and runs one ``train_step``. Training needs the trainer's GPUs, so if the hybrid replicas are
   still active at that point (the policy kept them), they are deactivated first.
3. Weight sync: the trainer exports weights (version ``g + 1``), the standalone replicas load
   them (pause, update, resume; requests in flight continue with the new weights), the
   rollouter's staleness budget is reset, the rollout window closes; ``global_steps = g + 1``.
4. ``should_activate_after_step(ctx)``; if yes, activate (the hybrid replicas get the same
   weights during activation); an only-hybrid cluster always activates (nothing else could
   generate). After an activation, if ``dynamic_schedule_enable_rebalance`` is on,
   ``should_rebalance(ctx)`` and a rebalance if yes.
5. ``update_after_step(ctx)`` with the same context as step 4.
6. The cycle's metrics (:func:`dynres.core.metrics.cycle_metrics`) are emitted through
   ``dynres_metrics_emitted``.

Before the first cycle an initial weight sync publishes version 0 and steps 4-5 run once with
``global_steps = 0``, so an only-hybrid cluster can start generating.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pluggy

from dynres.core.metrics import MicroStep, cycle_metrics, train_compute_time
from dynres.runtime.loop.controller import Controller
from dynres.runtime.loop.decisions import DecisionGuard, DecisionRecord
from dynres.runtime.loop.ops import OpRunner
from dynres.runtime.loop.queue import MessageQueue
from dynres.runtime.loop.report import CycleReport
from dynres.runtime.loop.rollouter import Rollouter
from dynres.runtime.loop.tracker import CycleMeasurements, RunTracker
from dynres.runtime.protocols import Replica, TrainEngine, WeightUpdate

logger = logging.getLogger("dynres.runtime.loop.cycle")


class StopRun(Exception):
    """Internal: the run cannot continue (no more samples); carries the reason."""


class TrainerLoop:
    """Drives sync cycles: policy calls, collections, fit steps, weight syncs, metrics."""

    def __init__(
        self,
        *,
        train_engine: TrainEngine,
        standalone: Sequence[Replica],
        controller: Controller,
        guard: DecisionGuard,
        tracker: RunTracker,
        queue: MessageQueue,
        rollouter: Rollouter,
        ops: OpRunner,
        pm: pluggy.PluginManager,
        enable_rebalance: bool,
        partial_rollout: bool,
        hybrid_gpus: int,
        standalone_gpus: int,
        now: Callable[[], float],
    ) -> None:
        """Wire the loop to the run's components (see run.FullyAsyncRun)."""
        self.train_engine = train_engine
        self.standalone = list(standalone)
        self.controller = controller
        self.guard = guard
        self.tracker = tracker
        self.queue = queue
        self.rollouter = rollouter
        self.ops = ops
        self.pm = pm
        self.enable_rebalance = enable_rebalance
        self.partial_rollout = partial_rollout
        self.hybrid_gpus = hybrid_gpus
        self.standalone_gpus = standalone_gpus
        self.version = 0
        """Weight version last published (count of syncs)."""
        self.last_update: WeightUpdate | None = None
        """The latest exported weights (hybrid replicas get them when activated)."""
        self._now = now

    # ---- Helpers ----------------------------------------------------------------------------

    @property
    def only_hybrid(self) -> bool:
        """True when the cluster has no standalone replica."""
        return self.tracker.num_standalone_replicas == 0

    def _no_producer(self) -> bool:
        """True when nothing can generate until the trainer itself acts."""
        return self.rollouter.finished() or (
            self.controller.balancer.num_replicas == 0 and not self.controller.is_hybrid_active
        )

    async def _wait_batch(self) -> list[Any]:
        """Wait for one collection, activating hybrid replicas if nothing else could produce it."""
        required = self.tracker.required_samples
        while True:
            batch = await self.queue.get_batch(required, self.tracker.global_steps, exhausted=self._no_producer)
            if batch is not None:
                return batch
            if self.rollouter.finished():
                raise StopRun(
                    f"the prompt source ran out: {self.queue.size} samples queued, "
                    f"{required} needed for the next collection"
                )
            # No replica is routable and the hybrid replicas are asleep (standalone replicas
            # died, or stale drops emptied an only-hybrid cycle): lend the trainer's GPUs.
            if not self.controller.usable_hybrid or self.last_update is None:
                raise StopRun(
                    "no replica can generate: every standalone replica failed and no hybrid replica is usable"
                )
            logger.warning("no replica can generate the next collection; activating hybrid replicas")
            if not await self.controller.activate(self.last_update):
                raise StopRun("no replica can generate: activating the hybrid replicas failed")

    async def _sync(self) -> WeightUpdate:
        """Export weights and load them into the routable standalone replicas."""
        self.version += 1
        exported = await self.ops.one("export_weights", "trainer", self.train_engine.export_weights)
        update = dataclasses.replace(exported, version=self.version)
        if not self.partial_rollout:
            # Without partial rollout a response must come from one weight version: let the
            # running samples finish before the new weights arrive.
            self.rollouter.pause_admission()
            await self.rollouter.drain()
        targets = [r for r in self.standalone if self.controller.balancer.has_replica(r.replica_id)]
        await self.controller.sync_weights(targets, update)
        self.rollouter.reset_staleness(self.version)
        self.rollouter.resume_admission()
        self.last_update = update
        return update

    async def _after_sync(self, update: WeightUpdate, decisions: list[DecisionRecord]) -> tuple[bool, bool, int]:
        """Steps 4-5: activation, rebalance, policy update; return (activated, rebalanced, moved)."""
        ctx = self.tracker.context()
        only_hybrid = self.only_hybrid

        def must_activate(v: Any) -> tuple[Any, str]:
            if only_hybrid and not v:
                return True, "only-hybrid cluster: nothing else could generate"
            return v, ""

        rec = await self.guard.decide("should_activate_after_step", ctx, must_activate)
        decisions.append(rec)
        activated = rebalanced = False
        moved = 0
        if rec.value and not self.controller.is_hybrid_active and self.controller.usable_hybrid:
            activated = await self.controller.activate(update)
            if activated and self.enable_rebalance:
                rctx = self.tracker.context()
                rrec = await self.guard.decide("should_rebalance", rctx)
                decisions.append(rrec)
                if rrec.value:
                    moved = await self.controller.rebalance()
                    rebalanced = True
        decisions.append(await self.guard.decide("update_after_step", ctx))
        return activated, rebalanced, moved

    # ---- Public steps -----------------------------------------------------------------------

    async def startup(self) -> list[DecisionRecord]:
        """Initial weight sync (the current version: 0, or a checkpoint's) and the activation
        decisions before the first cycle."""
        exported = await self.ops.one("export_weights", "trainer", self.train_engine.export_weights)
        update = dataclasses.replace(exported, version=self.version)
        targets = [r for r in self.standalone if self.controller.balancer.has_replica(r.replica_id)]
        await self.controller.sync_weights(targets, update)
        self.last_update = update
        self.rollouter.reset_staleness(self.version)
        decisions: list[DecisionRecord] = []
        await self._after_sync(update, decisions)
        return decisions

    async def cycle(self) -> CycleReport:
        """Run one sync cycle and return its report (raises StopRun when samples run out)."""
        t_start = self._now()
        step_required = self.tracker.step_required_samples
        buffer = int(step_required * self.tracker.staleness_threshold)
        decisions: list[DecisionRecord] = []
        hybrid_at_start = self.controller.is_hybrid_active
        deact_before = self.controller.deactivations
        dropped_before = self.queue.dropped_stale
        generated_before = self.rollouter.generated
        wait_target: int | None = None
        wait_s = 0.0
        deactivate_s = 0.0

        ctx = self.tracker.context()
        if self.controller.is_hybrid_active:
            rec = await self.guard.decide("should_deactivate", ctx)
            decisions.append(rec)
            if rec.value:
                only_hybrid = self.only_hybrid

                def clamp(v: Any) -> tuple[Any, str]:
                    lo = step_required if only_hybrid else 0
                    hi = step_required + buffer
                    if v < lo:
                        return lo, f"only-hybrid cluster: wait for at least step_required={lo}"
                    if v > hi:
                        return hi, f"never wait for more than step_required + buffer = {hi}"
                    return v, ""

                wrec = await self.guard.decide("deactivate_wait_samples", ctx, clamp)
                decisions.append(wrec)
                wait_target = int(wrec.value)
                t0 = self._now()
                target = wait_target
                # Near the end of a run the queue may never reach the target: stop waiting once
                # it holds all the run still needs.
                await self.queue.wait_until(
                    lambda: self.queue.size >= target or self.rollouter.finished() or self.rollouter.demand_queued()
                )
                wait_s = self._now() - t0
                await self.controller.deactivate()
                deactivate_s = self.controller.last_deactivate_duration_s

        micro: list[MicroStep] = []
        wait_times: list[float] = []
        wait_samples: list[int] = []
        train_call_s = 0.0
        train_metrics: dict[str, float] = {}
        required = self.tracker.required_samples
        trigger = self.tracker.trigger_parameter_sync_step
        activated = rebalanced = False
        moved = 0
        update: WeightUpdate | None = None
        for i in range(trigger):
            t_micro = t_start if i == 0 else self._now()
            self.queue.purge_stale(self.tracker.global_steps)
            wait_samples.append(max(0, required - self.queue.size))
            tw = self._now()
            batch = await self._wait_batch()
            waited = self._now() - tw
            wait_times.append(waited)
            hybrid_wait = 0.0
            if self.controller.is_hybrid_active:
                # The policy kept the hybrid replicas generating (or nothing else could), but
                # training needs the GPUs. The hybrid replicas generated during this wait, so
                # it counts as hybrid rollout time (the x of resource_utilization).
                hybrid_wait = waited
                await self.controller.deactivate()
                deactivate_s = self.controller.last_deactivate_duration_s
            ts = self._now()
            result = await self.ops.one("train_step", "trainer", lambda b=batch: self.train_engine.train_step(b))
            train_call_s += self._now() - ts
            train_metrics = dict(result.metrics)
            queue_after = self.queue.size
            if i == trigger - 1:
                update = await self._sync()
                points, window_end = self.rollouter.take_window()
                self.tracker.end_cycle(
                    CycleMeasurements(
                        wait_times=tuple(wait_times),
                        wait_samples=tuple(wait_samples),
                        cycle_time_s=self._now() - t_start,
                        train_time_s=sum(train_compute_time(m.phase_times) for m in micro)
                        + train_compute_time(result.phase_times),
                        train_call_s=train_call_s,
                        consumed=required * trigger,
                        generated=self.rollouter.generated - generated_before,
                    )
                )
                activated, rebalanced, moved = await self._after_sync(update, decisions)
            alloc = self._now() - t_micro
            micro.append(
                MicroStep(
                    phase_times=dict(result.phase_times),
                    allocated_s=alloc,
                    wait_s=(wait_s if i == 0 else 0.0) + hybrid_wait,
                    step_s=alloc,
                    queue_size_after=queue_after,
                )
            )

        metrics = cycle_metrics(
            micro,
            points,
            window_end,
            hybrid_gpus=self.hybrid_gpus,
            standalone_gpus=self.standalone_gpus,
        )
        t_end = self._now()
        report = CycleReport(
            step=self.tracker.global_steps,
            start_s=t_start,
            end_s=t_end,
            duration_s=t_end - t_start,
            metrics=metrics,
            hybrid_active_at_start=hybrid_at_start,
            deactivated=self.controller.deactivations > deact_before,
            activated=activated,
            rebalanced=rebalanced,
            rebalanced_requests=moved,
            deactivate_wait_samples=wait_target,
            wait_for_enough_samples_s=sum(m.wait_s for m in micro),
            step_wait_times=wait_times,
            step_wait_samples=wait_samples,
            samples_generated=self.rollouter.generated - generated_before,
            samples_consumed=required * trigger,
            samples_dropped_stale=self.queue.dropped_stale - dropped_before,
            queue_size_end=self.queue.size,
            weight_version=self.version,
            activate_duration_s=self.controller.last_activate_duration_s if activated else 0.0,
            deactivate_duration_s=deactivate_s,
            train_metrics=train_metrics,
            decisions=decisions,
        )
        try:
            self.pm.hook.dynres_metrics_emitted(step=report.step, metrics=dict(metrics))
        except Exception:
            logger.exception("a dynres_metrics_emitted observer failed; ignored")
        return report


async def maybe_await(value: Any) -> None:
    """Await ``value`` when it is awaitable (progress callbacks may be sync or async)."""
    if isinstance(value, Awaitable):
        await value
