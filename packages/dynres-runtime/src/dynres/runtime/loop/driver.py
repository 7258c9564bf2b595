"""The fully-async training driver: ``await run_fully_async(RunSpec(...)) -> RunReport``.

One driver for every backend: the simulator runs it on a virtual-time event loop with simulated
replicas, a real run with vLLM/Ray replicas and a real trainer. It wires the load balancer,
message queue, rollouter, controller and trainer loop together, runs ``num_cycles`` sync
cycles, then drains: the balancer stops retrying, everything in flight is aborted and kept with
its partial output, and hybrid replicas still active are deactivated. The replicas and the train
engine are not shut down (the caller owns them).

With hybrid replicas, the start-up step of :mod:`~dynres.runtime.loop.calibration` runs before the
rollouter starts: hybrid replicas that report themselves awake are put to sleep, and with
``RunSpec.calibration_switches`` > 0 that many switch round trips are measured. Its timings go to
``RunReport.switch_calibration`` (None when it did nothing), apart from the cycles' operations.

A run that cannot finish its cycles (a train step that fails or hangs, a stall the watchdog
names, a policy that raises ``SystemExit`` or ``KeyboardInterrupt``, a prompt source that breaks)
drains the same way and raises :class:`~dynres.core.errors.RunAbortedError`, whose ``report``
holds the cycles done and a checkpoint with every admitted, untrained sample. Replica faults do
not end a run: the replica goes on probation, and one that is gone is recreated by
``RunSpec.restart_replica`` while its budget lasts (see :mod:`~dynres.runtime.loop.controller`).

With ``RunSpec.checkpoints`` and ``checkpoint_every`` the run writes a checkpoint to disk every
that many cycles and after its last one (:class:`~dynres.runtime.loop.checkpoint.CheckpointStore`:
the sample side, the train engine's state, the ledger's line count), and ``RunSpec.ledger`` gets
one line per trained sample, so that a run killed at any moment resumes from its latest
checkpoint with every admitted sample trained exactly once.

Example::

    report = asyncio.run(run_fully_async(RunSpec(
        config=cfg, policy=load_policy("default")(), standalone=[...], hybrid=[...],
        train_engine=engine, prompts=prompt_groups, num_cycles=10)))
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from dynres.core import BoundPolicy, get_plugin_manager
from dynres.core.context import step_required_samples
from dynres.core.errors import DynresError, RunAbortedError, RunStalledError, RuntimeStateError
from dynres.runtime.loop.calibration import SwitchCalibration, run_switch_calibration
from dynres.runtime.loop.checkpoint import (
    CHECKPOINT_FORMAT,
    CYCLE_RECORD_KEY,
    load_train_state,
    make_checkpoint,
    policy_state,
    restore_checkpoint,
    save_checkpoint,
)
from dynres.runtime.loop.clock import RunClock
from dynres.runtime.loop.controller import Controller, ControllerState
from dynres.runtime.loop.cycle import LoopWiring, StopRun, TrainerLoop, maybe_await
from dynres.runtime.loop.decisions import DecisionGuard, DecisionRecord, PolicyInterrupted
from dynres.runtime.loop.gc_control import run_gc_control
from dynres.runtime.loop.ops import OpRunner
from dynres.runtime.loop.queue import MessageQueue
from dynres.runtime.loop.report import CycleReport, OperationTimings, RunReport, SampleCounters
from dynres.runtime.loop.rollouter import Rollouter
from dynres.runtime.loop.routing import LoadBalancer
from dynres.runtime.loop.routing.decider import RequestDecider
from dynres.runtime.loop.spec import RunSpec, max_required_samples
from dynres.runtime.loop.tracker import RunTracker
from dynres.runtime.samples import PromptGroup, Sample

logger = logging.getLogger("dynres.runtime.loop.driver")

__all__ = [
    "CHECKPOINT_FORMAT",
    "FullyAsyncRun",
    "PromptGroup",
    "RunSpec",
    "Sample",
    "max_required_samples",
    "run_fully_async",
]


class FullyAsyncRun:
    """One run of the fully-async loop; :meth:`run` once, :meth:`checkpoint` any time after.

    The constructor wires every component (their asyncio objects are created on first use, so
    it may run outside an event loop); :meth:`run` starts the clock, loads ``resume_from`` and
    drives the cycles.
    """

    spec: RunSpec
    """What to run (config, policy, replicas, trainer, prompts, cycles)."""
    policy: BoundPolicy
    """The policy behind its plugin manager (plugins may wrap its decisions)."""
    clock: RunClock
    """Seconds since :meth:`run` started, on the event loop's clock."""
    ops: OpRunner
    """Runs every backend operation with the op timeout; keeps per-operation timings and failures."""
    balancer: LoadBalancer
    """Routes generation requests to the routable replicas and retries aborted ones."""
    queue: MessageQueue
    """Finished samples waiting for the trainer (at most max_required_samples)."""
    rollouter: Rollouter
    """Admits samples from the prompt source within the staleness budget."""
    controller: Controller
    """Carries out activation, deactivation, rebalance and weight loading of the replicas."""
    guard: DecisionGuard
    """Asks the policy in a worker thread, with timeout, answer check, fallback and clamps."""
    tracker: RunTracker
    """Step bookkeeping; builds each decision's ScheduleContext."""
    trainer: TrainerLoop
    """Drives the sync cycles: policy calls, collections, train steps, weight syncs."""
    switch_calibration: SwitchCalibration | None
    """What the switch calibration measured; None when it did not run."""
    interrupted_report: RunReport | None
    """The report of a run that was cancelled (Ctrl-C of ``dynres run``): what it had when it
    stopped, built after its teardown, with a checkpoint when one could be written; else None."""

    def __init__(self, spec: RunSpec) -> None:
        """Bind the policy and wire the balancer, queue, rollouter, controller and trainer loop."""
        self.spec = spec
        if isinstance(spec.policy, BoundPolicy):
            self.policy = spec.policy
        else:
            pm = spec.plugin_manager if spec.plugin_manager is not None else get_plugin_manager()
            self.policy = BoundPolicy(spec.policy, pm)
        self.clock = RunClock()
        self.ops = OpRunner(timeout_s=spec.op_timeout_s, now=self.clock.elapsed)
        # In the order the components need each other: the sample path first, then what moves
        # replicas in and out of it, then the trainer loop that drives both.
        self._wire_sample_path()
        self._wire_control()
        self._wire_trainer()
        self.balancer.add_replicas(spec.standalone)
        self.switch_calibration = None
        self.interrupted_report = None
        self._started = False
        # What the segments before this one did, carried from checkpoint to checkpoint.
        self._carried = {key: list((spec.resume_from or {}).get(key, [])) for key in ("dropped", "replica_restarts")}

    def _wire_sample_path(self) -> None:
        """The balancer, the message queue and the rollouter: prompts -> requests -> samples."""
        spec, now = self.spec, self.clock.elapsed
        at = spec.config.async_training
        max_req = max_required_samples(spec.config)
        step_req = step_required_samples(spec.config.required_samples, at.trigger_parameter_sync_step)
        # The balancer and the queue call back into the rollouter and controller built after them.
        self.balancer = LoadBalancer(
            seed=spec.seed,
            sticky_capacity=spec.sticky_capacity,
            partial_rollout=at.partial_rollout,
            on_change=lambda: self.rollouter.on_capacity_change(),
            on_replica_failure=lambda rid, exc: self.controller.on_replica_failure(rid, exc),
            decider=RequestDecider(self.policy, now) if self.policy.decides_requests else None,
        )
        self.queue = MessageQueue(
            # The most admission ever lets wait: the budget plus the largest extra a policy may
            # ask for (one cycle's batch, see dynres.core.answers.clamp_answer).
            max_req + step_req,
            max_staleness_versions=spec.max_staleness_versions,
            staleness_threshold=at.staleness_threshold,
            on_drop=lambda s: self.rollouter.on_drop(s),
        )
        self.rollouter = Rollouter(
            balancer=self.balancer,
            queue=self.queue,
            prompts=spec.prompts,
            now=now,
            max_required_samples=max_req,
            concurrent_samples_per_replica=at.concurrent_samples_per_replica,
            # A run that keeps a checkpoint goes on later, so production runs on to the end; a
            # final run admits only what its cycles consume, so nothing is generated in vain.
            demand=None if spec.keep_checkpoint else spec.num_cycles * step_req,
        )

    def _wire_control(self) -> None:
        """The controller (replica lifecycle) and the guard that asks the policy."""
        spec, now = self.spec, self.clock.elapsed
        self.controller = Controller(
            balancer=self.balancer,
            train_engine=spec.train_engine,
            hybrid=spec.hybrid,
            standalone=spec.standalone,
            ops=self.ops,
            pm=self.policy.pm,
            now=now,
            sleep_level=spec.sleep_level,
            probation_backoff_s=spec.probation_backoff_s,
            probation_max_s=spec.probation_max_s,
            max_probes=spec.max_probes,
            restart=spec.restart_replica,
            max_restarts=spec.max_restarts,
            cycle=lambda: self.tracker.global_steps + 1,
            on_replaced=lambda old, new: self.tracker.replace_replica(old, new),
        )
        self.guard = DecisionGuard(self.policy, timeout_s=spec.policy_timeout_s, now=now)

    def _wire_trainer(self) -> None:
        """The step tracker and the trainer loop that drives the cycles over every other part."""
        spec, now = self.spec, self.clock.elapsed
        cfg = spec.config
        at = cfg.async_training
        self.tracker = RunTracker(
            required_samples=cfg.required_samples,
            trigger_parameter_sync_step=at.trigger_parameter_sync_step,
            staleness_threshold=at.staleness_threshold,
            num_standalone_replicas=len(spec.standalone),
            num_hybrid_replicas=len(spec.hybrid),
            queue=self.queue,
            rollouter=self.rollouter,
            balancer=self.balancer,
            controller=self.controller,
            now=now,
            standalone=spec.standalone,
            hybrid=spec.hybrid,
            shared_host=spec.shared_host,
        )
        wiring = LoopWiring(
            train_engine=spec.train_engine,
            standalone=spec.standalone,
            balancer=self.balancer,
            controller=self.controller,
            guard=self.guard,
            tracker=self.tracker,
            queue=self.queue,
            rollouter=self.rollouter,
            ops=self.ops,
            pm=self.policy.pm,
            now=now,
            ledger=spec.ledger,
            checkpoint=self._periodic_checkpoint if spec.checkpoints is not None and spec.checkpoint_every else None,
        )
        self.trainer = spec.trainer_loop(
            wiring,
            enable_rebalance=at.dynamic_schedule_enable_rebalance,
            partial_rollout=at.partial_rollout,
            hybrid_gpus=spec.hybrid_gpus if spec.hybrid_gpus is not None else cfg.trainer.n_gpus,
            standalone_gpus=spec.standalone_gpus if spec.standalone_gpus is not None else cfg.rollout.n_gpus,
        )

    # ---- Running ------------------------------------------------------------------------------

    async def run(self) -> RunReport:
        """Run the configured cycles and return the report."""
        if self._started:
            raise RuntimeStateError("a FullyAsyncRun runs once; build a new one for another run")
        self._started = True
        self.clock.begin()
        spec = self.spec
        if spec.resume_from is not None:
            await load_train_state(spec.resume_from, spec.train_engine, self.ops)
            restore_checkpoint(
                spec.resume_from,
                policy=self.policy,
                tracker=self.tracker,
                trainer=self.trainer,
                queue=self.queue,
                rollouter=self.rollouter,
                partial_rollout=spec.config.async_training.partial_rollout,
            )
        if spec.keep_checkpoint:
            policy_state(self.policy)  # a state_dict that cannot be saved fails before any work
        if spec.hybrid:
            # Before the rollouter starts: nothing generates yet and no request can reach a hybrid.
            # Even with no round trip asked for, its first step runs: a hybrid replica that starts
            # awake (a vLLM engine does) is put to sleep, since the controller assumes it asleep
            # and the trainer needs that GPU memory from the first train step on.
            calibration = SwitchCalibration(
                rounds=spec.calibration_switches, start_s=self.clock.elapsed(), end_s=self.clock.elapsed()
            )
            try:
                await run_switch_calibration(
                    rounds=spec.calibration_switches,
                    hybrid=list(spec.hybrid),
                    train_engine=spec.train_engine,
                    controller=self.controller,
                    weight_version=self.trainer.version,
                    timeout_s=spec.op_timeout_s,
                    now=self.clock.elapsed,
                    sleep_level=spec.sleep_level,
                    record=calibration,
                )
            except asyncio.CancelledError:
                # Ctrl-C of `dynres run` cancels the run: nothing generates yet, so there is
                # nothing to drain; keep what the calibration measured and stay cancelled.
                self._keep_calibration(calibration)
                self.interrupted_report = self._partial_report(
                    0.0, [], [], f"interrupted during the switch calibration (0 of {spec.num_cycles} cycles done)"
                )
                raise
            except (Exception, KeyboardInterrupt, SystemExit) as exc:
                self._keep_calibration(calibration)
                stopped = f"{type(exc).__name__}: {exc}"
                raise self._aborted(exc, 0.0, [], [], stopped, where="during the switch calibration") from exc
            self._keep_calibration(calibration)
        self.rollouter.start_window()
        # The runtime's GC step (loop/gc_control.py): start-up objects frozen, full collections
        # kept out of transitions; undone when the run ends.
        with run_gc_control():
            return await self._run_cycles()

    def _keep_calibration(self, calibration: SwitchCalibration) -> None:
        """Record what the switch calibration measured (also when it was interrupted)."""
        calibration.end_s = self.clock.elapsed()
        self.ops.failures.extend(calibration.failures)
        if self.spec.calibration_switches or calibration.steps:
            self.switch_calibration = calibration

    async def _run_cycles(self) -> RunReport:
        spec = self.spec
        cycles: list[CycleReport] = []
        startup: list[DecisionRecord] = []
        stopped_early = ""
        self.tracker.total_steps = self.tracker.global_steps + spec.num_cycles
        failure: BaseException | None = None
        cancelled = False
        roll_task = asyncio.create_task(self.rollouter.run(), name="dynres-rollouter")
        watchdog = asyncio.create_task(self._watchdog(), name="dynres-watchdog") if spec.stall_timeout_s else None
        end_to_end = 0.0
        try:
            startup = await self._watch(self.trainer.startup(), roll_task, watchdog)
            for _ in range(spec.num_cycles):
                try:
                    report = await self._watch(self.trainer.cycle(), roll_task, watchdog)
                except StopRun as stop:
                    stopped_early = str(stop)
                    logger.warning("run stopped after %d cycles: %s", len(cycles), stopped_early)
                    break
                cycles.append(report)
                end_to_end = report.end_s
                if spec.progress is not None:
                    await maybe_await(spec.progress(report))
        except asyncio.CancelledError:
            # Ctrl-C of `dynres run` cancels the run (asyncio.run, or the Ray coordinator's stop):
            # it drains like any other stop and keeps its report, but stays cancelled.
            cancelled = True
            stopped_early = f"interrupted after {len(cycles)} of {spec.num_cycles} cycles"
            raise
        except (Exception, KeyboardInterrupt, SystemExit) as exc:
            # Every other way out of a run still drains it and hands back a report + checkpoint.
            failure = exc
            stopped_early = f"{type(exc).__name__}: {exc}"
            logger.error("run stopped after %d cycles: %s", len(cycles), stopped_early)
        finally:
            if watchdog is not None:
                watchdog.cancel()
                await asyncio.gather(watchdog, return_exceptions=True)
            await self._teardown(roll_task)
            if cancelled:
                self.interrupted_report = self._partial_report(end_to_end, cycles, startup, stopped_early)
        if failure is not None:
            raise self._aborted(failure, end_to_end, cycles, startup, stopped_early) from failure
        try:
            return self._report(end_to_end, cycles, startup, stopped_early)
        except DynresError as exc:  # the checkpoint could not be written (policy state_dict)
            report = self._report(end_to_end, cycles, startup, stopped_early, with_checkpoint=False)
            raise RunAbortedError(f"the run finished but {exc}", report=report) from exc

    def _partial_report(
        self, end_to_end: float, cycles: list[CycleReport], startup: list[DecisionRecord], stopped_early: str
    ) -> RunReport:
        """The report of a run that stopped early, with a checkpoint when it can be written."""
        try:
            return self._report(end_to_end, cycles, startup, stopped_early, with_checkpoint=True)
        except DynresError:
            return self._report(end_to_end, cycles, startup, stopped_early, with_checkpoint=False)

    def _aborted(
        self,
        failure: BaseException,
        end_to_end: float,
        cycles: list[CycleReport],
        startup: list[DecisionRecord],
        stopped_early: str,
        *,
        where: str = "",
    ) -> RunAbortedError:
        """The error a failed run raises: the cause, and a report whose checkpoint loses nothing."""
        where = where or f"after {len(cycles)} of {self.spec.num_cycles} cycles"
        try:
            report = self._report(end_to_end, cycles, startup, stopped_early, with_checkpoint=True)
            kept = "its report (.report) holds a checkpoint with every untrained sample; resume from it"
        except DynresError as exc:
            report = self._report(end_to_end, cycles, startup, stopped_early, with_checkpoint=False)
            kept = f"no checkpoint could be written ({exc})"
        if isinstance(failure, PolicyInterrupted):
            failure = failure.original
        if isinstance(failure, KeyboardInterrupt | SystemExit):
            what = f"interrupted by {type(failure).__name__}"
            if isinstance(failure, SystemExit) and failure.code not in (None, 0):
                what += f"({failure.code})"
            code = 130 if isinstance(failure, KeyboardInterrupt) else 2
        else:
            what = f"stopped by {type(failure).__name__}: {failure}"
            code = 2
        return RunAbortedError(f"run {what} {where}; {kept}", report=report, exit_code=code)

    def _progress_mark(self) -> tuple[int, ...]:
        """Numbers that change whenever the run gets anywhere (the watchdog compares them)."""
        bc = self.balancer.counters
        return (
            self.rollouter.admitted,
            self.rollouter.generated,
            self.queue.consumed,
            self.queue.dropped_stale,
            bc.completed,
            bc.aborted,
            bc.replica_failures,
            len(self.controller.timeline),
            len(self.controller.replica_events),
            sum(st.count for st in self.ops.stats.values()),
            self.tracker.global_steps,
        )

    async def _watchdog(self) -> str:
        """Return (ending the run) a description once nothing has progressed for stall_timeout_s."""
        limit = float(self.spec.stall_timeout_s or 0.0)
        mark = self._progress_mark()
        since = self.clock.elapsed()
        while True:
            await asyncio.sleep(limit / 4)
            cur = self._progress_mark()
            if cur != mark:
                mark, since = cur, self.clock.elapsed()
                continue
            if self.clock.elapsed() - since >= limit:
                return (
                    f"the run made no progress for {limit:g} s (cycle {self.tracker.global_steps + 1}, "
                    f"controller {self.controller.state.value}, {self.queue.size} samples queued, "
                    f"{self.rollouter.in_flight} generating on {self.balancer.num_replicas} routable replicas, "
                    f"{len(self.controller.quarantined)} quarantined, {len(self.controller.probation)} on probation); "
                    "check the replicas and the train engine, or raise RunSpec.stall_timeout_s"
                )

    async def _watch(self, coro: Any, roll_task: asyncio.Task[None], watchdog: asyncio.Task[str] | None) -> Any:
        """Await ``coro`` but fail fast if the rollouter loop crashes or the watchdog fires meanwhile."""
        main = asyncio.ensure_future(coro)
        waiting: set[asyncio.Future[Any]] = {main}
        if not roll_task.done():
            waiting.add(roll_task)
        if watchdog is not None:
            waiting.add(watchdog)
        while True:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if main in done:
                return main.result()
            if roll_task in done:
                waiting.discard(roll_task)
                exc = roll_task.exception()
                if exc is None:  # the rollouter finished normally (source exhausted)
                    continue
            else:
                exc = RunStalledError(watchdog.result()) if watchdog is not None else None
            main.cancel()
            await asyncio.gather(main, return_exceptions=True)
            raise exc if exc is not None else RuntimeStateError("the run's watch ended without a cause")

    async def _teardown(self, roll_task: asyncio.Task[None]) -> None:
        try:
            await self.controller.close()
            self.balancer.start_draining()
            await self.controller.abort_everywhere()
            if self.controller.state is ControllerState.HYBRID_ACTIVE:
                await self.controller.deactivate()
            await self.rollouter.stop()
        except Exception:
            logger.exception("draining at the end of the run failed; partial samples may be missing")
        finally:
            roll_task.cancel()
            await asyncio.gather(roll_task, return_exceptions=True)

    # ---- Results --------------------------------------------------------------------------------

    def checkpoint(self) -> dict[str, Any]:
        """The state needed to resume, as JSON-serialisable data.

        It holds every admitted sample not trained yet: the queued ones and, with their finished
        responses and partial output, those interrupted by the end of the run or (called during
        a run, e.g. from the progress callback) still generating; plus the step and
        weight-version counters, the prompt source's position and the policy's ``state_dict``
        (PolicyError when that is not plain JSON). See :mod:`dynres.runtime.loop.checkpoint`.
        """
        if not self._started:
            raise RuntimeStateError("checkpoint() needs a started run; call run() first")
        return make_checkpoint(
            self.policy,
            self.tracker,
            self.trainer,
            self.queue,
            self.rollouter,
            dropped_before=self._carried["dropped"],
            restarts=[*self._carried["replica_restarts"], *map(dataclasses.asdict, self.controller.restarts.records)],
        )

    async def _periodic_checkpoint(self, step: int, record: Callable[[], dict[str, Any]]) -> None:
        """After cycle ``step``'s weight sync: write a checkpoint to disk when one is due, with the
        cycle's metrics record as it stands (``record()``; see :data:`CYCLE_RECORD_KEY`)."""
        spec = self.spec
        store = spec.checkpoints
        if store is not None and (step % spec.checkpoint_every == 0 or step >= self.tracker.total_steps):
            engine = spec.train_engine

            def state() -> dict[str, Any]:
                extra = dict(spec.record_metrics()) if spec.record_metrics is not None else {}
                return {**self.checkpoint(), CYCLE_RECORD_KEY: {**record(), **extra}}

            await save_checkpoint(store, step, state, train_engine=engine, ledger=spec.ledger, ops=self.ops)

    def _report(
        self,
        end_to_end: float,
        cycles: list[CycleReport],
        startup: list[DecisionRecord],
        stopped_early: str,
        *,
        with_checkpoint: bool | None = None,
    ) -> RunReport:
        keep = self.spec.keep_checkpoint if with_checkpoint is None else with_checkpoint
        bc = self.balancer.counters
        partials = self.rollouter.partials
        samples = SampleCounters(
            admitted=self.rollouter.admitted,
            generated=self.rollouter.generated,
            consumed=self.queue.consumed,
            dropped_stale=self.queue.dropped_stale,
            failed=self.rollouter.failed,
            duplicates=self.queue.duplicates + bc.duplicates,
            aborted=bc.aborted,
            resumed=bc.resumed,
            restarted=bc.restarted,
            evicted=bc.evicted,
            queued_at_end=self.queue.size,
            partial_at_end=len(partials),
            partial_tokens_at_end=sum(len(r.token_ids) for p in partials for r in p.results if r.aborted),
        )
        ops = OperationTimings(
            controller_overhead_s=self.controller.overhead_s,
            policy_wall_s=self.guard.wall_s,
            engine=dict(self.ops.stats),
            activations=self.controller.activations,
            abandoned_activations=self.controller.abandoned,
            deactivations=self.controller.deactivations,
            rebalances=self.controller.rebalances,
        )
        return RunReport(
            policy=self.policy.name,
            end_to_end_s=end_to_end,
            cycles=cycles,
            timeline=list(self.controller.timeline),
            startup_decisions=startup,
            samples=samples,
            operations=ops,
            policy_fallbacks=self.guard.fallbacks,
            op_failures=list(self.ops.failures),
            quarantined=dict(self.controller.quarantined),
            replica_restarts=list(self.controller.restarts.records),
            replica_events=list(self.controller.replica_events),
            failed_samples=list(self.rollouter.failed_ids),
            final_state=self.controller.state.value,
            weight_version=self.trainer.version,
            hybrid_gpus=self.trainer.hybrid_gpus,
            standalone_gpus=self.trainer.standalone_gpus,
            stopped_early=stopped_early,
            checkpoint=self.checkpoint() if keep else None,
            switch_calibration=self.switch_calibration,
            request_decisions=None
            if self.balancer.decider is None
            else dataclasses.replace(self.balancer.decider.counters),
        )


async def run_fully_async(spec: RunSpec) -> RunReport:
    """Run the fully-async loop described by ``spec`` and return its report."""
    return await FullyAsyncRun(spec).run()
