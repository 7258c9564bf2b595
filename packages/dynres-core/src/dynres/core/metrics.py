"""The ``dynamic_resource/*`` metric formulas, as pure functions over recorded numbers.

All times are seconds. One *sync cycle* has ``trigger_parameter_sync_step`` micro-steps (fit
steps); the runtime records one :class:`MicroStep` per fit step and the rollout activity as
``(time, active, capacity)`` change points, then calls :func:`cycle_metrics`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dynres.core.errors import MetricsError

PREFIX = "dynamic_resource/"
TRAIN_UTILIZATION = PREFIX + "train_resource_utilization"
"""Key: sum(train compute) / sum(train allocated) over the cycle (fraction)."""
ROLLOUT_UTILIZATION = PREFIX + "rollout_resource_utilization"
"""Key: capacity-time weighted rollout concurrency use over the cycle (fraction)."""
CLUSTER_UTILIZATION = PREFIX + "resource_utilization"
"""Key: GPU-weighted cluster utilization of the cycle (fraction)."""
MQ_SIZE = PREFIX + "mq_size"
"""Key: message-queue size right after the cycle's last fit step (samples)."""
TRAIN_COMPUTE_TIME = PREFIX + "train_compute_time_s"
"""Key: summed train compute time of the cycle (seconds)."""
TRAIN_ALLOCATED_TIME = PREFIX + "train_allocated_time_s"
"""Key: summed wall time of the cycle's micro-steps (seconds)."""

METRIC_KEYS: tuple[str, ...] = (
    TRAIN_UTILIZATION,
    ROLLOUT_UTILIZATION,
    CLUSTER_UTILIZATION,
    MQ_SIZE,
    TRAIN_COMPUTE_TIME,
    TRAIN_ALLOCATED_TIME,
)
"""Every key :func:`cycle_metrics` returns."""

TRAIN_COMPUTE_PHASES: tuple[str, ...] = (
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
)
"""Trainer phases that count as compute; a missing phase counts as 0 seconds."""


def train_compute_time(phase_times: Mapping[str, float]) -> float:
    """Sum the compute phases of one micro-step (seconds); other keys (e.g. param_sync) are ignored."""
    return float(sum(phase_times.get(p, 0.0) for p in TRAIN_COMPUTE_PHASES))


def train_resource_utilization(compute_s: Sequence[float], allocated_s: Sequence[float]) -> float:
    """sum(compute) / sum(allocated) over a cycle's micro-steps (fraction; 0.0 when nothing allocated)."""
    if len(compute_s) != len(allocated_s):
        raise MetricsError(
            f"train_resource_utilization: compute_s has {len(compute_s)} entries but allocated_s "
            f"has {len(allocated_s)}; record one of each per micro-step"
        )
    alloc = float(sum(allocated_s))
    return float(sum(compute_s)) / alloc if alloc > 0 else 0.0


def rollout_capacity(servers: int, concurrent_samples_per_replica: int, max_required_samples: int) -> int:
    """cap = min(servers x concurrent_samples_per_replica, max_required_samples) (samples)."""
    return max(0, min(servers * concurrent_samples_per_replica, max_required_samples))


@dataclass(frozen=True)
class RolloutPoint:
    """A change point of rollout activity: from ``t`` on, ``active`` samples run under ``capacity``."""

    t: float
    """Time of the change (seconds)."""
    active: int
    """Samples being generated from ``t`` on (count)."""
    capacity: int
    """Concurrency capacity from ``t`` on (samples; see :func:`rollout_capacity`)."""


def rollout_resource_utilization(points: Sequence[RolloutPoint], end_t: float) -> float:
    """sum dt*min(cap, active) / sum dt*cap over the intervals that ``points`` open, up to ``end_t``.

    Each point holds until the next one (the last until ``end_t``). Intervals with zero capacity
    or zero length carry no weight; 0.0 when the total weight is 0.
    """
    used = weight = 0.0
    for k, p in enumerate(points):
        t_next = points[k + 1].t if k + 1 < len(points) else end_t
        dt = t_next - p.t
        if dt < 0:
            raise MetricsError(
                f"rollout_resource_utilization: rollout points must be in time order and end by "
                f"end_t; got t={p.t} followed by {t_next}; sort the points and pass the cycle's end"
            )
        if p.capacity <= 0 or dt == 0:
            continue
        used += dt * min(p.capacity, max(0, p.active))
        weight += dt * p.capacity
    return used / weight if weight > 0 else 0.0


def hybrid_rollout_fraction(wait_s: float, step_s: float) -> float:
    """x = clip(sum wait_for_enough_samples / sum step time, 0, 1) (fraction; 0 when step_s is 0)."""
    if step_s <= 0:
        return 0.0
    return min(1.0, max(0.0, wait_s / step_s))


def cluster_resource_utilization(
    train_util: float, rollout_util: float, hybrid_gpus: int, standalone_gpus: int, x: float
) -> float:
    """((1-x) a U_train + (x a + b) U_rollout) / (a + b), a hybrid GPUs, b standalone GPUs (fraction)."""
    a, b = hybrid_gpus, standalone_gpus
    if a + b <= 0:
        return 0.0
    x = min(1.0, max(0.0, x))
    return ((1 - x) * a * train_util + (x * a + b) * rollout_util) / (a + b)


@dataclass(frozen=True)
class MicroStep:
    """What the trainer recorded for one fit step of a cycle."""

    phase_times: Mapping[str, float] = field(default_factory=dict)
    """Seconds per trainer phase (keys of TRAIN_COMPUTE_PHASES count as compute)."""
    allocated_s: float = 0.0
    """Wall time of the fit step, param sync and activation included (seconds)."""
    wait_s: float = 0.0
    """Time spent waiting for enough samples while hybrid replicas generated (seconds)."""
    step_s: float = 0.0
    """Wall time of the step as the trainer timed it (seconds)."""
    queue_size_after: int = 0
    """Message-queue size right after the fit step (samples)."""


def cycle_metrics(
    micro_steps: Sequence[MicroStep],
    rollout_points: Sequence[RolloutPoint],
    rollout_end_t: float,
    *,
    hybrid_gpus: int,
    standalone_gpus: int,
) -> dict[str, float]:
    """All ``dynamic_resource/*`` values of one sync cycle, from its micro-steps and rollout history."""
    compute = [train_compute_time(m.phase_times) for m in micro_steps]
    alloc = [m.allocated_s for m in micro_steps]
    u_train = train_resource_utilization(compute, alloc)
    u_rollout = rollout_resource_utilization(rollout_points, rollout_end_t)
    x = hybrid_rollout_fraction(sum(m.wait_s for m in micro_steps), sum(m.step_s for m in micro_steps))
    return {
        TRAIN_UTILIZATION: u_train,
        ROLLOUT_UTILIZATION: u_rollout,
        CLUSTER_UTILIZATION: cluster_resource_utilization(u_train, u_rollout, hybrid_gpus, standalone_gpus, x),
        MQ_SIZE: float(micro_steps[-1].queue_size_after) if micro_steps else 0.0,
        TRAIN_COMPUTE_TIME: float(sum(compute)),
        TRAIN_ALLOCATED_TIME: float(sum(alloc)),
    }


# ---- Names for tracking backends (trainer.logger) ------------------------------------------------

TRACKING_NAMES: Mapping[str, str] = {
    "duration_s": "timing_s/step",
    "wait_for_enough_samples_s": "timing_s/wait_for_enough_samples",
    "weight_sync_s": "timing_s/param_sync",
    "samples_generated": "fully_async/rollouter/step_generated_samples",
    "weight_version": "fully_async/count/current_param_version",
}
"""Per-cycle record keys that verl logs under a name of its own, and that name: the sync cycle's
wall time, the wait for enough samples while hybrid replicas generated, the weight sync (seconds),
samples generated during the cycle and the weight version it published (counts)."""
DYNRES_TRACKING_PREFIX = "dynres/"
"""Prefix of the record's own fields that verl has no name for (``dynres/activated``, ``dynres/end_s``)."""
REWARD_KEYS: tuple[str, ...] = ("cycle_mean/reward/mean", "cycle_mean/reward", "reward/mean", "train/reward")
"""Where a per-cycle record keeps the mean reward, best first (the train engine's own metric names)."""


def tracking_metrics(record: Mapping[str, object]) -> dict[str, float]:
    """A per-cycle record's numbers as tracking backends receive them, under verl's names where it has one.

    Keys with a ``/`` keep their name (``dynamic_resource/*``, ``batch/*``, ``reward/mean``); the
    fields of :data:`TRACKING_NAMES` take verl's name; any other field goes under
    :data:`DYNRES_TRACKING_PREFIX`. ``step`` is the x axis, not a metric. Booleans become 0.0 / 1.0;
    lists, text and non-finite numbers (a cycle without a metric holds NaN) are left out, since
    not every backend stores them.
    """
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "step" or not isinstance(value, bool | int | float):
            continue
        number = float(value)
        if not math.isfinite(number):
            continue
        name = key if "/" in key else TRACKING_NAMES.get(key, DYNRES_TRACKING_PREFIX + key)
        out[name] = number
    return out


def reward_key(record: Mapping[str, object]) -> str | None:
    """The key of the per-cycle mean reward in ``record`` (see :data:`REWARD_KEYS`), or None."""
    return next((k for k in REWARD_KEYS if k in record), None)
