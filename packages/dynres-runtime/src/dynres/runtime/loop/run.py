"""The fully-async training driver: ``await run_fully_async(RunSpec(...)) -> RunReport``.

One driver for every backend: the simulator runs it on a virtual-time event loop with simulated
replicas, a real run with vLLM/Ray replicas and a real trainer. It wires the load balancer,
message queue, rollouter, controller and trainer loop together, runs ``num_cycles`` sync
cycles, then drains: the balancer stops retrying, everything in flight is aborted and kept with
its partial output, and hybrid replicas still active are deactivated. The replicas and the train
engine are not shut down (the caller owns them).

Example::

    report = asyncio.run(run_fully_async(RunSpec(
        config=cfg, policy=load_policy("default")(), standalone=[...], hybrid=[...],
        train_engine=engine, prompts=prompt_groups, num_cycles=10)))
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pluggy

from dynres.core import BoundPolicy, DynresConfig, Policy, get_plugin_manager
from dynres.core.context import step_required_samples
from dynres.core.errors import ConfigError, RuntimeStateError
from dynres.runtime.loop.balancer import LoadBalancer
from dynres.runtime.loop.checkpoint import CHECKPOINT_FORMAT, make_checkpoint, restore_checkpoint
from dynres.runtime.loop.clock import RunClock
from dynres.runtime.loop.controller import Controller, ControllerState
from dynres.runtime.loop.cycle import LoopWiring, StopRun, TrainerLoop, maybe_await
from dynres.runtime.loop.decisions import DecisionGuard, DecisionRecord
from dynres.runtime.loop.gcpolicy import run_gc_policy
from dynres.runtime.loop.ops import OpRunner
from dynres.runtime.loop.queue import MessageQueue
from dynres.runtime.loop.report import CycleReport, OperationTimings, RunReport, SampleCounters
from dynres.runtime.loop.rollouter import PromptSource, Rollouter
from dynres.runtime.loop.tracker import RunTracker
from dynres.runtime.protocols import Replica, TrainEngine
from dynres.runtime.samples import PromptGroup, Sample

logger = logging.getLogger("dynres.runtime.loop.run")

__all__ = [
    "CHECKPOINT_FORMAT",
    "FullyAsyncRun",
    "PromptGroup",
    "RunSpec",
    "Sample",
    "max_required_samples",
    "run_fully_async",
]


def max_required_samples(config: DynresConfig) -> int:
    """int(required_samples x (staleness_threshold + 1) x trigger_parameter_sync_step) (samples)."""
    at = config.async_training
    return int(config.required_samples * (at.staleness_threshold + 1) * at.trigger_parameter_sync_step)


@dataclass
class RunSpec:
    """Everything one fully-async run needs."""

    config: DynresConfig
    """The dynres configuration (verl keys)."""
    policy: Policy | BoundPolicy
    """The scheduling policy; a bare Policy is bound to ``plugin_manager`` here."""
    standalone: Sequence[Replica]
    """Standalone replicas (always generating); may be empty in an only-hybrid cluster."""
    hybrid: Sequence[Replica]
    """Hybrid replicas on the trainer's GPUs (start asleep); empty without dynamic scheduling."""
    train_engine: TrainEngine
    """Trains on each collection and exports the weights at each sync (the caller shuts it down)."""
    prompts: PromptSource
    """Iterable or async iterable of PromptGroup (one per sample; ids unique)."""
    num_cycles: int
    """Sync cycles to run (count, >= 1)."""
    progress: Callable[[CycleReport], Any] | None = None
    """Called (or awaited, if it returns an awaitable) after each cycle with its report."""
    plugin_manager: pluggy.PluginManager | None = None
    """Plugin manager for hooks; None: a fresh one with the installed ``dynres.plugins``."""
    op_timeout_s: float = 600.0
    """Longest one backend operation on one replica or the trainer may take (seconds; inf = no
    limit, for simulated engines whose durations are modelled, not faults)."""
    policy_timeout_s: float = 10.0
    """Longest one policy decision may take before the safe value is used (seconds)."""
    sleep_level: int = 1
    """Level passed to Replica.sleep on deactivation (1: offload weights to CPU)."""
    seed: int = 0
    """Seed of the load balancer's tie-break RNG."""
    sticky_capacity: int = 100_000
    """Most sticky-session entries the balancer keeps (count)."""
    max_staleness_versions: int | None = None
    """Drop samples lagging the trainer by more weight versions (count); None: 1 + ceil(staleness)."""
    hybrid_gpus: int | None = None
    """GPUs shared by trainer and hybrid replicas, the metric's a (count); None: config trainer GPUs."""
    standalone_gpus: int | None = None
    """GPUs of the standalone replicas, the metric's b (count); None: config rollout GPUs."""
    keep_checkpoint: bool = False
    """Put the end-of-run checkpoint (queue, partial samples, policy state) in the report; the run
    is then one segment of a longer one, so production does not stop at this run's demand."""
    resume_from: Mapping[str, Any] | None = None
    """A checkpoint to resume from (its queue, partial samples, steps, weight version, policy state)."""

    def __post_init__(self) -> None:
        """Check the spec's consistency; raise ConfigError naming the field and the fix."""
        if self.num_cycles < 1:
            raise ConfigError(f"RunSpec.num_cycles must be >= 1, got {self.num_cycles}")
        if not self.standalone and not self.hybrid:
            raise ConfigError("RunSpec has no replica: give standalone and/or hybrid replicas")
        dynamic = self.config.async_training.use_dynamic_resource_scheduling
        if self.hybrid and not dynamic:
            raise ConfigError(
                f"RunSpec.hybrid has {len(self.hybrid)} replicas but "
                "async_training.use_dynamic_resource_scheduling is false; set it to true or pass hybrid=[]"
            )
        if not self.standalone and not dynamic:
            raise ConfigError("RunSpec.standalone is empty and dynamic scheduling is off: nothing would generate")
        ids = [r.replica_id for r in [*self.standalone, *self.hybrid]]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ConfigError(f"replica ids must be unique; repeated: {dup}")
        if self.op_timeout_s <= 0 or self.policy_timeout_s <= 0:
            raise ConfigError("RunSpec.op_timeout_s and policy_timeout_s must be > 0 seconds")
        if max_required_samples(self.config) < self.config.required_samples:
            raise ConfigError("max_required_samples is below required_samples; check the config")


class FullyAsyncRun:
    """One run of the fully-async loop; :meth:`run` once, :meth:`checkpoint` any time after.

    The constructor wires every component (their asyncio objects are created on first use, so
    it may run outside an event loop); :meth:`run` starts the clock, loads ``resume_from`` and
    drives the cycles.
    """

    def __init__(self, spec: RunSpec) -> None:
        """Bind the policy and wire the balancer, queue, rollouter, controller and trainer loop."""
        self.spec = spec
        """What to run (config, policy, replicas, trainer, prompts, cycles)."""
        cfg = spec.config
        at = cfg.async_training
        if isinstance(spec.policy, BoundPolicy):
            self.policy = spec.policy
        else:
            pm = spec.plugin_manager if spec.plugin_manager is not None else get_plugin_manager()
            self.policy = BoundPolicy(spec.policy, pm)
        """The policy behind its plugin manager (plugins may wrap its decisions)."""
        self.clock = RunClock()
        """Seconds since :meth:`run` started, on the event loop's clock."""
        now = self.clock.elapsed
        self.ops = OpRunner(timeout_s=spec.op_timeout_s, now=now)
        """Runs every backend operation with the op timeout; keeps per-operation timings and failures."""
        max_req = max_required_samples(cfg)
        # The balancer and the queue call back into the rollouter and controller built after them.
        self.balancer = LoadBalancer(
            seed=spec.seed,
            sticky_capacity=spec.sticky_capacity,
            partial_rollout=at.partial_rollout,
            on_change=lambda: self.rollouter.on_capacity_change(),
            on_replica_failure=lambda rid, exc: self.controller.on_replica_failure(rid, exc),
        )
        """Routes generation requests to the routable replicas and retries aborted ones."""
        self.queue = MessageQueue(
            max_req,
            max_staleness_versions=spec.max_staleness_versions,
            staleness_threshold=at.staleness_threshold,
            on_drop=lambda s: self.rollouter.on_drop(s),
        )
        """Finished samples waiting for the trainer (at most max_required_samples)."""
        self.rollouter = Rollouter(
            balancer=self.balancer,
            queue=self.queue,
            prompts=spec.prompts,
            now=now,
            max_required_samples=max_req,
            concurrent_samples_per_replica=at.concurrent_samples_per_replica,
            # A run that keeps a checkpoint goes on later, so production runs on to the end; a
            # final run admits only what its cycles consume, so nothing is generated in vain.
            demand=None
            if spec.keep_checkpoint
            else spec.num_cycles * step_required_samples(cfg.required_samples, at.trigger_parameter_sync_step),
        )
        """Admits samples from the prompt source within the staleness budget."""
        self.controller = Controller(
            balancer=self.balancer,
            train_engine=spec.train_engine,
            hybrid=spec.hybrid,
            ops=self.ops,
            pm=self.policy.pm,
            now=now,
            sleep_level=spec.sleep_level,
        )
        """Carries out activation, deactivation, rebalance and weight loading of the replicas."""
        self.guard = DecisionGuard(self.policy, timeout_s=spec.policy_timeout_s, now=now)
        """Asks the policy in a worker thread, with timeout, answer check, fallback and clamps."""
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
        )
        """Step bookkeeping; builds each decision's ScheduleContext."""
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
        )
        self.trainer = TrainerLoop(
            wiring,
            enable_rebalance=at.dynamic_schedule_enable_rebalance,
            partial_rollout=at.partial_rollout,
            hybrid_gpus=spec.hybrid_gpus if spec.hybrid_gpus is not None else cfg.trainer.n_gpus,
            standalone_gpus=spec.standalone_gpus if spec.standalone_gpus is not None else cfg.rollout.n_gpus,
        )
        """Drives the sync cycles: policy calls, collections, train steps, weight syncs."""
        for r in spec.standalone:
            self.balancer.add_replica(r)
        self._started = False

    # ---- Running ------------------------------------------------------------------------------

    async def run(self) -> RunReport:
        """Run the configured cycles and return the report."""
        if self._started:
            raise RuntimeStateError("a FullyAsyncRun runs once; build a new one for another run")
        self._started = True
        self.clock.begin()
        spec = self.spec
        if spec.resume_from is not None:
            restore_checkpoint(
                spec.resume_from,
                policy=self.policy,
                tracker=self.tracker,
                trainer=self.trainer,
                queue=self.queue,
                rollouter=self.rollouter,
                partial_rollout=spec.config.async_training.partial_rollout,
            )
        self.rollouter.start_window()
        # The runtime's GC step (loop/gcpolicy.py): start-up objects frozen, full collections
        # kept out of transitions; undone when the run ends.
        with run_gc_policy():
            return await self._run_cycles()

    async def _run_cycles(self) -> RunReport:
        spec = self.spec
        cycles: list[CycleReport] = []
        startup: list[DecisionRecord] = []
        stopped_early = ""
        self.tracker.total_steps = self.tracker.global_steps + spec.num_cycles
        roll_task = asyncio.create_task(self.rollouter.run(), name="dynres-rollouter")
        end_to_end = 0.0
        try:
            startup = await self._watch(self.trainer.startup(), roll_task)
            for _ in range(spec.num_cycles):
                try:
                    report = await self._watch(self.trainer.cycle(), roll_task)
                except StopRun as stop:
                    stopped_early = str(stop)
                    logger.warning("run stopped after %d cycles: %s", len(cycles), stopped_early)
                    break
                cycles.append(report)
                end_to_end = report.end_s
                if spec.progress is not None:
                    await maybe_await(spec.progress(report))
        finally:
            await self._teardown(roll_task)
        return self._report(end_to_end, cycles, startup, stopped_early)

    async def _watch(self, coro: Any, roll_task: asyncio.Task[None]) -> Any:
        """Await ``coro`` but fail fast if the rollouter loop crashes meanwhile."""
        main = asyncio.ensure_future(coro)
        if roll_task.done():
            return await main
        done, _ = await asyncio.wait({main, roll_task}, return_when=asyncio.FIRST_COMPLETED)
        if main in done:
            return main.result()
        exc = roll_task.exception()
        if exc is None:  # the rollouter finished normally (source exhausted)
            return await main
        main.cancel()
        await asyncio.gather(main, return_exceptions=True)
        raise exc

    async def _teardown(self, roll_task: asyncio.Task[None]) -> None:
        try:
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

        After :meth:`run` returned it holds the queued samples, the samples interrupted by the end
        of the run with their partial output, the step and weight-version counters and the
        policy's ``state_dict``. Called during a run (e.g. from the progress callback) it holds
        the queue and, for samples still generating, only their prompt groups (they restart).
        """
        if not self._started:
            raise RuntimeStateError("checkpoint() needs a started run; call run() first")
        return make_checkpoint(self.policy, self.tracker, self.trainer, self.queue, self.rollouter)

    def _report(
        self,
        end_to_end: float,
        cycles: list[CycleReport],
        startup: list[DecisionRecord],
        stopped_early: str,
    ) -> RunReport:
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
            final_state=self.controller.state.value,
            weight_version=self.trainer.version,
            hybrid_gpus=self.trainer.hybrid_gpus,
            standalone_gpus=self.trainer.standalone_gpus,
            stopped_early=stopped_early,
            checkpoint=self.checkpoint() if self.spec.keep_checkpoint else None,
        )


async def run_fully_async(spec: RunSpec) -> RunReport:
    """Run the fully-async loop described by ``spec`` and return its report."""
    return await FullyAsyncRun(spec).run()
