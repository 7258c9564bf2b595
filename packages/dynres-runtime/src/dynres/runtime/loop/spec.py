"""What one fully-async run is given: :class:`RunSpec`, checked when it is made, and the queue bounds
its config implies (:func:`max_required_samples`, :func:`mq_size_cap`). The driver
(:mod:`~dynres.runtime.loop.driver`) runs it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pluggy

from dynres.core import BoundPolicy, DynresConfig, Policy
from dynres.core.errors import ConfigError
from dynres.runtime.loop.checkpoint import CheckpointStore
from dynres.runtime.loop.cycle import TrainerLoop
from dynres.runtime.loop.ledger import LedgerWriter
from dynres.runtime.loop.report import CycleReport
from dynres.runtime.loop.rollouter import PromptSource
from dynres.runtime.protocols import Replica, ReplicaRestarter, TrainEngine

__all__ = ["RunSpec", "max_required_samples", "mq_size_cap"]


def max_required_samples(config: DynresConfig) -> int:
    """int(required_samples x (staleness_threshold + 1) x trigger_parameter_sync_step) (samples)."""
    at = config.async_training
    return int(config.required_samples * (at.staleness_threshold + 1) * at.trigger_parameter_sync_step)


def mq_size_cap(config: DynresConfig) -> int:
    """The most samples that can wait in the queue right after a cycle's last fit step, which is
    as high as ``dynamic_resource/mq_size`` can go: production runs at most
    :func:`max_required_samples` ahead, and the cycle itself consumed its step_required_samples (samples)."""
    return max_required_samples(config) - config.required_samples * config.async_training.trigger_parameter_sync_step


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
    record_metrics: Callable[[], Mapping[str, float]] | None = None
    """Metrics of the cycle in progress that ``progress`` adds to a cycle's record (read, not
    consumed: e.g. the means of the train steps' metrics), added to the record a checkpoint holds
    too; None: none."""
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
    shared_host: bool = False
    """Every replica generates on one host's compute, so a woken hybrid adds no throughput (the
    policy reads it as ScheduleContext.shared_host)."""
    keep_checkpoint: bool = False
    """Put the end-of-run checkpoint (queue, partial samples, policy state) in the report; the run
    is then one segment of a longer one, so production does not stop at this run's demand."""
    resume_from: Mapping[str, Any] | None = None
    """A checkpoint to resume from (its queue, partial samples, steps, weight version, policy state)."""
    stall_timeout_s: float | None = 3600.0
    """The watchdog ends the run with RunStalledError (inside RunAbortedError) when nothing
    progresses for this long: no sample admitted, generated or trained, no request finished or
    failed, no backend operation finished (seconds; None: no watchdog; must exceed op_timeout_s)."""
    probation_backoff_s: float = 1.0
    """Wait before a failed replica's first health probe (seconds; doubles per failure)."""
    probation_max_s: float = 60.0
    """Longest wait between two health probes of a replica on probation (seconds)."""
    max_probes: int = 5
    """Failed health probes in a row after which a replica is quarantined for the rest of the run (count)."""
    calibration_switches: int = 0
    """Switch round trips of the hybrid replicas and the trainer measured before the first cycle
    (count; 0 = none; see :mod:`~dynres.runtime.loop.calibration`): the switch costs of a run that never
    switches. Each costs one idle switch's time, once per run."""
    trainer_loop: Callable[..., TrainerLoop] = TrainerLoop
    """Builds the trainer loop from the wiring and :class:`TrainerLoop`'s keyword arguments; a
    simulation hosted by verl's trainer order passes its own (:mod:`dynres.runtime.sim.verl_host`)."""
    restart_replica: ReplicaRestarter | None = None
    """Recreates a replica that is gone (None: a gone replica is quarantined for the rest of the run)."""
    max_restarts: int = 3
    """Restart attempts per replica over the run, each after a backoff of ``probation_backoff_s``
    doubling up to ``probation_max_s``; then it is quarantined (count; 0 = never restart)."""
    checkpoints: CheckpointStore | None = None
    """Where periodic checkpoints go (None: none is written; ``checkpoint()`` still works)."""
    checkpoint_every: int = 0
    """Write a checkpoint every this many cycles (global_steps a multiple of it) and after the run's
    last cycle (count; 0 = never; needs ``checkpoints``)."""
    ledger: LedgerWriter | None = None
    """Gets one line per trained sample (None: no ledger)."""

    def __post_init__(self) -> None:
        """Check the spec's consistency; raise ConfigError naming the field and the fix."""
        if self.num_cycles < 1:
            raise ConfigError(f"RunSpec.num_cycles must be >= 1, got {self.num_cycles}")
        self._check_replicas()
        self._check_limits()
        if max_required_samples(self.config) < self.config.required_samples:
            raise ConfigError("max_required_samples is below required_samples; check the config")

    def _check_replicas(self) -> None:
        """The replica lists fit the config: some replica, hybrid ones only with dynamic scheduling, unique ids."""
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

    def _check_limits(self) -> None:
        """Timeouts, backoffs, budgets and counts are in range."""
        if self.op_timeout_s <= 0 or self.policy_timeout_s <= 0:
            raise ConfigError("RunSpec.op_timeout_s and policy_timeout_s must be > 0 seconds")
        if self.stall_timeout_s is not None and not self.stall_timeout_s > self.op_timeout_s:
            raise ConfigError(
                f"RunSpec.stall_timeout_s ({self.stall_timeout_s:g} s) must exceed op_timeout_s "
                f"({self.op_timeout_s:g} s), or one slow operation would look like a stall; raise it or pass None"
            )
        if not (self.probation_backoff_s > 0 and self.probation_max_s >= self.probation_backoff_s):
            raise ConfigError("RunSpec.probation_backoff_s must be > 0 and probation_max_s >= it (seconds)")
        if self.max_probes < 1:
            raise ConfigError(f"RunSpec.max_probes must be >= 1, got {self.max_probes}")
        if self.max_restarts < 0 or self.checkpoint_every < 0:
            raise ConfigError("RunSpec.max_restarts and checkpoint_every must be >= 0 (0 = off)")
        if self.checkpoint_every and self.checkpoints is None:
            raise ConfigError("RunSpec.checkpoint_every is set but checkpoints is None; give a CheckpointStore")
        if self.calibration_switches < 0:
            raise ConfigError(
                f"RunSpec.calibration_switches must be >= 0 round trips (0 = off), got {self.calibration_switches}"
            )
