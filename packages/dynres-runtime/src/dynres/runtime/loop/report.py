"""What a fully-async run reports: per-cycle metrics, controller timeline, counters, timings.

:meth:`RunReport.to_json` is the ``--json`` payload of ``dynres simulate`` and ``dynres run``.
All times are seconds; timestamps (``*_s`` fields named ``at_s``, ``start_s``, ``end_s``) are
seconds since the run started, on the event loop's clock (virtual under the simulator).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dynres.core.metrics import METRIC_KEYS
from dynres.core.requests import RequestDecisionCounters
from dynres.runtime.loop.calibration import SwitchCalibration
from dynres.runtime.loop.controller_state import ReplicaEvent, StateChange
from dynres.runtime.loop.decisions import DecisionRecord
from dynres.runtime.loop.ops import OpFailure, OpStat
from dynres.runtime.loop.restarts import ReplicaRestart


@dataclass
class CycleReport:
    """One sync cycle: trigger_parameter_sync_step collections and the weight sync after them."""

    step: int
    """global_steps after this cycle (1 for the first cycle)."""
    start_s: float
    """Run-clock time the cycle started (seconds since run start)."""
    end_s: float
    """Run-clock time the cycle ended, policy updates included (seconds since run start)."""
    duration_s: float
    """end_s - start_s (seconds)."""
    metrics: dict[str, float]
    """The ``dynamic_resource/*`` values of the cycle (units per key, see dynres.core.metrics)."""
    hybrid_active_at_start: bool
    """Hybrid replicas were generating when the cycle started."""
    deactivated: bool
    """The hybrid replicas were deactivated during the cycle."""
    activated: bool
    """The hybrid replicas were activated after the cycle's weight sync."""
    rebalanced: bool
    """A rebalance followed the activation."""
    rebalanced_requests: int
    """Requests moved by that rebalance (count)."""
    deactivate_wait_samples: int | None
    """Queue size the deactivation waited for, after clamps (samples; None = no deactivation)."""
    wait_for_enough_samples_s: float
    """Time spent waiting for that queue size while hybrid replicas generated (seconds)."""
    step_wait_times: list[float]
    """Seconds each collection waited for its samples."""
    step_wait_samples: list[int]
    """Samples each collection had to wait for (count, parallel to step_wait_times)."""
    samples_generated: int
    """Samples finished by the rollouter during the cycle (count)."""
    samples_consumed: int
    """Samples trained on in the cycle (count)."""
    samples_dropped_stale: int
    """Samples dropped as too stale during the cycle (count)."""
    queue_size_end: int
    """Queue size at the end of the cycle (samples)."""
    weight_version: int
    """Weight version published by the cycle's sync (count of syncs)."""
    activate_duration_s: float
    """Duration of the activation after this cycle's sync (seconds; 0 = none)."""
    deactivate_duration_s: float
    """Duration of this cycle's deactivation, the policy's grace included (seconds; 0 = none)."""
    grace_finished_requests: int = 0
    """Requests that finished on the hybrids during the deactivation's grace instead of being
    aborted (count; 0 without a grace)."""
    activation_abandoned_s: float = 0.0
    """Time the activation after this cycle's sync ran before the policy gave it up, the hybrids'
    sleep and the trainer's onload included (seconds; 0 = none given up)."""
    train_metrics: dict[str, float] = field(default_factory=dict)
    """The train engine's metrics of the cycle's last fit step."""
    decisions: list[DecisionRecord] = field(default_factory=list)
    """Policy decisions made during the cycle, in order."""
    weight_sync_s: float = 0.0
    """Duration of the cycle's weight sync: export plus loading into the standalone replicas (seconds)."""
    train_step_times: list[float] = field(default_factory=list)
    """Duration of each train_step call of the cycle, in order (seconds)."""
    batch: dict[str, float] = field(default_factory=dict)
    """What the cycle trained on, from :func:`batch_stats` (keys in BATCH_KEYS; empty = not measured)."""

    def to_record(self) -> dict[str, Any]:
        """The cycle as one flat record: ``metrics.jsonl`` of ``dynres run``, ``steps`` of ``dynres simulate``.

        Keys: every field but ``decisions`` under its own name, each ``dynamic_resource/*`` key at
        the top level (NaN when the cycle lacks it), and each train metric under its own name when
        it has a ``/`` (``reward/mean``, ``cycle_mean/loss``), else as ``train/<name>``.
        """
        rec: dict[str, Any] = {
            "step": self.step,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "duration_s": self.duration_s,
        }
        rec.update({key: self.metrics.get(key, math.nan) for key in METRIC_KEYS})
        rec.update(self.metrics)
        # Train metrics without a namespace get one, so "step" or "loss" never shadow a field.
        rec.update({k if "/" in k else f"train/{k}": v for k, v in self.train_metrics.items()})
        rec.update(
            hybrid_active_at_start=self.hybrid_active_at_start,
            activated=self.activated,
            deactivated=self.deactivated,
            rebalanced=self.rebalanced,
            rebalanced_requests=self.rebalanced_requests,
            deactivate_wait_samples=self.deactivate_wait_samples,
            wait_for_enough_samples_s=self.wait_for_enough_samples_s,
            step_wait_times=list(self.step_wait_times),
            step_wait_samples=list(self.step_wait_samples),
            samples_generated=self.samples_generated,
            samples_consumed=self.samples_consumed,
            samples_dropped_stale=self.samples_dropped_stale,
            queue_size_end=self.queue_size_end,
            weight_version=self.weight_version,
            activate_duration_s=self.activate_duration_s,
            deactivate_duration_s=self.deactivate_duration_s,
            grace_finished_requests=self.grace_finished_requests,
            activation_abandoned_s=self.activation_abandoned_s,
            weight_sync_s=self.weight_sync_s,
            train_step_times=list(self.train_step_times),
        )
        rec.update({f"{BATCH_PREFIX}{k}": v for k, v in self.batch.items()})
        return rec


BATCH_PREFIX = "batch/"
"""Prefix of the :func:`batch_stats` keys in a per-cycle record."""
BATCH_KEYS: tuple[str, ...] = (
    "samples",
    "responses",
    "prompt_tokens_mean",
    "response_tokens_mean",
    "response_tokens_max",
    "response_log_tokens_mean",
    "response_log_tokens_std",
    "response_log_group_share",
    "sample_gen_s_mean",
    "sample_gen_s_max",
    "sample_aborts",
)
"""Keys of :func:`batch_stats`, in order (recorded as ``batch/<key>``)."""


def batch_stats(samples: Sequence[Any]) -> dict[str, float]:
    """Shape of the samples a cycle trained on: counts, token lengths, generation latency.

    ``samples`` are :class:`dynres.runtime.samples.Sample` objects (anything with ``group``,
    ``responses``, ``started_s``, ``finished_s``). Keys (BATCH_KEYS): samples and responses
    (count); mean prompt tokens and mean/max response tokens (tokens); mean and standard
    deviation of log(response tokens) (nats); the share of that log-variance between prompt
    groups (fraction; 0 with fewer than 2 groups); mean/max seconds from a sample's admission
    to its last response (seconds); aborts of its requests (count). Empty when ``samples`` is.
    """
    if not samples:
        return {}
    lens: list[list[float]] = []
    prompts = []
    gen = []
    aborts = 0
    for s in samples:
        lens.append([max(1.0, float(len(r.token_ids))) for r in s.responses])
        prompts.append(float(len(s.group.prompt_token_ids)))
        gen.append(max(0.0, float(s.finished_s) - float(s.started_s)))
        aborts += int(getattr(s, "aborts", 0))
    flat = [x for group in lens for x in group]
    logs = [[math.log(x) for x in group] for group in lens]
    flat_logs = [x for group in logs for x in group]
    mu = sum(flat_logs) / len(flat_logs)
    var = sum((x - mu) ** 2 for x in flat_logs) / len(flat_logs)
    # Between-group share of the log-variance: what the workload calls group_correlation.
    between = sum(len(g) * (sum(g) / len(g) - mu) ** 2 for g in logs if g) / len(flat_logs)
    share = between / var if var > 0 and len(logs) > 1 else 0.0
    return {
        "samples": float(len(samples)),
        "responses": float(len(flat)),
        "prompt_tokens_mean": sum(prompts) / len(prompts),
        "response_tokens_mean": sum(flat) / len(flat),
        "response_tokens_max": max(flat),
        "response_log_tokens_mean": mu,
        "response_log_tokens_std": math.sqrt(var),
        "response_log_group_share": min(1.0, share),
        "sample_gen_s_mean": sum(gen) / len(gen),
        "sample_gen_s_max": max(gen),
        "sample_aborts": float(aborts),
    }


@dataclass
class SampleCounters:
    """Sample and request accounting of a run (counts)."""

    admitted: int = 0
    """Samples the rollouter started."""
    generated: int = 0
    """Samples fully generated."""
    consumed: int = 0
    """Samples trained on."""
    dropped_stale: int = 0
    """Samples dropped as too stale (see dynres.runtime.loop.queue)."""
    failed: int = 0
    """Samples lost because a request failed on every replica it tried."""
    duplicates: int = 0
    """Samples or requests produced twice (must be 0)."""
    aborted: int = 0
    """Request attempts aborted (deactivation, rebalance) and retried."""
    resumed: int = 0
    """Retries that continued from partial output."""
    restarted: int = 0
    """Retries that started over (partial rollout off, or no output yet)."""
    evicted: int = 0
    """Attempts cancelled because their replica stopped answering."""
    queued_at_end: int = 0
    """Samples left in the queue at the end."""
    partial_at_end: int = 0
    """Samples interrupted at the end, kept with their partial output (in the checkpoint)."""
    partial_tokens_at_end: int = 0
    """Tokens generated for those interrupted samples (count)."""


@dataclass
class OperationTimings:
    """Where the time of transitions went: dynres's own work vs the engines' operations."""

    controller_overhead_s: float = 0.0
    """Run-clock time of activations/deactivations/rebalances not spent in engine operations (seconds)."""
    policy_wall_s: float = 0.0
    """Real time spent in policy decisions, thread hop included (seconds)."""
    engine: dict[str, OpStat] = field(default_factory=dict)
    """Operation name (sleep, wake_up, abort, update_weights, offload, ...) -> timing (seconds)."""
    activations: int = 0
    """Successful activations (count)."""
    abandoned_activations: int = 0
    """Activations the policy gave up part-way, their batch queued (``should_abandon_activation``) (count)."""
    deactivations: int = 0
    """Deactivations (count)."""
    rebalances: int = 0
    """Rebalances (count)."""


@dataclass
class RunReport:
    """Everything a fully-async run reports."""

    policy: str
    """Name of the policy that ran."""
    end_to_end_s: float
    """Run start to the end of the last cycle (seconds)."""
    cycles: list[CycleReport]
    """One report per sync cycle, in order."""
    timeline: list[StateChange]
    """Every controller state transition, in order."""
    startup_decisions: list[DecisionRecord]
    """Decisions made after the initial weight sync, before the first cycle."""
    samples: SampleCounters
    """Where every sample went: admitted, generated, consumed, dropped, left at the end (counts)."""
    operations: OperationTimings
    """Controller overhead and engine operation timings."""
    policy_fallbacks: int
    """Policy decisions replaced by the safe value (count)."""
    op_failures: list[OpFailure]
    """Backend operations that failed or timed out."""
    quarantined: dict[str, str]
    """Replica id -> why it was taken out of the run."""
    replica_events: list[ReplicaEvent]
    """Replicas put on probation after a failure, back after a health probe, or quarantined, in order."""
    failed_samples: list[str]
    """Ids of samples given up because a request failed on every replica it tried (should be empty)."""
    final_state: str
    """Controller state at the end."""
    weight_version: int
    """Weight version at the end (count of syncs)."""
    hybrid_gpus: int
    """GPUs shared by the trainer and the hybrid replicas (count; the metric's a)."""
    standalone_gpus: int
    """GPUs of the standalone replicas (count; the metric's b)."""
    stopped_early: str = ""
    """Why the run ended before its cycles were done ('' when it finished them)."""
    checkpoint: dict[str, Any] | None = None
    """State needed to resume (RunSpec.keep_checkpoint), JSON-serialisable; None otherwise."""
    switch_calibration: SwitchCalibration | None = None
    """The switches measured before the first cycle (RunSpec.calibration_switches), and the start-up
    sleep of hybrid replicas that started awake; not a cycle switch, not in ``operations``; None
    when it did nothing. Older report.json files call it ``startup_probe``
    (:data:`~dynres.runtime.renamed_keys.RENAMED_REPORT_KEYS`)."""
    replica_restarts: list[ReplicaRestart] = field(default_factory=list)
    """Every replica that went away and was recreated (or given up on), in order: its id, the
    cause, the cycle in progress, the seconds until it was back (None: it did not come back)."""
    request_decisions: RequestDecisionCounters | None = None
    """What the policy's per-request decisions (``predict_length``, ``route``) did: routings
    asked, answered and fallen back (counts); None when the policy makes none."""

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-serialisable data."""
        return _plain(dataclasses.asdict(self))

    def to_json(self, indent: int | None = None) -> str:
        """The report as a JSON document (the CLI's ``--json`` payload)."""
        return json.dumps(self.to_dict(), indent=indent)

    def metric_series(self, key: str) -> list[float]:
        """One metric's value per cycle, in order (NaN where a cycle lacks it)."""
        return [c.metrics.get(key, float("nan")) for c in self.cycles]


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, float | int | str | bool) or v is None:
        return v
    return repr(v)
