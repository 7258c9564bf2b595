"""What the `predictive` policy learns and forecasts: :class:`Estimates`, their checkpoint form, :class:`Forecast`.

The policy (``dynres.policies.predictive``) decides; this module holds the numbers it decides on,
the rules that keep them valid when a checkpoint is loaded, and the small helpers its
learning step shares.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from dynres.core import ScheduleContext
from dynres.core.errors import PolicyValidationError


@dataclass(frozen=True)
class Estimates:
    """What the policy has learned from finished cycles (all JSON numbers; 0 = not measured yet).

    Rates are kept relative to the training time of a cycle, so they stay valid while response
    lengths (and with them both generation and training time) grow during a run. Every field
    keeps its declared type on every path that sets it: a checkpoint stores it as JSON, and an
    int where a float belongs would come back changed.
    """

    train_s: float = 0.0
    """Seconds of train_step calls per sync cycle (seconds)."""
    sync_s: float = 0.0
    """Seconds of one weight sync (seconds)."""
    sync_min_s: float = 0.0
    """Shortest weight sync of any cycle: a sync that drained no running samples (seconds; 0 = none yet)."""
    activate_s: float = 0.0
    """Seconds of one activation (seconds)."""
    deactivate_s: float = 0.0
    """Seconds of one deactivation (seconds)."""
    standalone_share: float = 0.0
    """Samples the standalone replicas produce per second of training, over a cycle's samples
    (1 = exactly keeps up with the trainer; fraction)."""
    wait_bias: float = 0.0
    """Correction added to the forecast wait target, learned from waits after deactivation (samples)."""
    token_gain: float = -1.0
    """Hybrid replicas' token rate while routable over the standalone replicas' token rate in the
    same cycles (ratio, the model's rho measured directly; -1 = engines count no tokens or no hybrid
    cycle yet)."""
    static_idle_share: float = -1.0
    """Realised trainer idle per second of training in cycles without hybrids (ratio; -1 = none seen)."""
    hybrid_idle_share: float = -1.0
    """The same in cycles with hybrids, activation and deactivation included (ratio; -1 = none seen)."""
    hybrid_cycles: int = 0
    """Cycles that ran with hybrid replicas (count)."""
    last_hybrid_step: int = 0
    """global_steps after the latest cycle that ran with hybrid replicas (global step; 0 = none)."""
    static_cycles: int = 0
    """Cycles that ran without hybrid replicas (count)."""
    queue_end: float = -1.0
    """Queue size at the end of the latest cycle: the next cycle's starting stock (samples; -1 = none yet)."""
    wait_cap: float = 0.0
    """Most the wait target may be, set by the first cycle with hybrids and moved by what later ones
    missed, like ``wait_bias`` (samples; 0 = none, or released by a draining sync)."""
    calm_cycles: int = 0
    """Consecutive hybrid cycles whose fit steps never waited, which scales the next cut of the
    wait target until the first miss (count)."""
    misses: int = 0
    """Hybrid cycles whose fit steps waited or whose sync drained (count)."""
    losses: int = 0
    """Consecutive hybrid cycles that realised no saving over the static reference (count)."""
    backoff: int = 0
    """Length of the latest back-off (cycles; 0 = never backed off)."""
    suppress_until: int = 0
    """No activation while global_steps is below this (global step; a back-off in force)."""

    def state_dict(self) -> dict[str, Any]:
        """Every estimate and counter, by field name (JSON numbers)."""
        return asdict(self)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Estimates:
        """The estimates :meth:`state_dict` saved; reject missing, unknown or non-finite values.

        A state saved by an earlier dynres (a checkpoint from before an upgrade) loads too: its
        retired entries are dropped and the entries it lacks start unmeasured.
        """
        names = {f.name: f for f in fields(cls)}
        if set(state) - set(names) <= RETIRED_STATE and set(names) - set(state) <= ADDED_STATE:
            defaults = asdict(cls())
            state = {name: state[name] if name in state else defaults[name] for name in names}
        if set(state) != set(names):
            raise PolicyValidationError(
                f"policy 'predictive': state keys {sorted(state)} do not match {sorted(names)}; "
                "pass what state_dict() returned"
            )
        values: dict[str, Any] = {}
        for name, f in names.items():
            raw = state[name]
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
                raise PolicyValidationError(
                    f"policy 'predictive': state {name}={raw!r} must be a finite number; pass what "
                    "state_dict() returned"
                )
            if f.type == "int" and raw != int(raw):
                raise PolicyValidationError(f"policy 'predictive': state {name}={raw!r} must be a whole number")
            floor = -1.0 if f.default == -1.0 else (-math.inf if name == "wait_bias" else 0.0)
            if raw < floor:
                raise PolicyValidationError(f"policy 'predictive': state {name}={raw!r} must be >= {floor:g}")
            values[name] = int(raw) if f.type == "int" else float(raw)
        return cls(**values)


RETIRED_STATE = frozenset({"collect_share", "window_share"})
"""State entries earlier versions saved that this one no longer keeps (dropped on load)."""

ADDED_STATE = frozenset({"sync_min_s", "queue_end", "wait_cap", "calm_cycles", "misses"})
"""State entries this version added (unmeasured when a state from before them is loaded)."""


@dataclass(frozen=True)
class Forecast:
    """The next cycle's trainer idle with and without hybrid replicas, and the wait target."""

    static_idle_s: float
    """Forecast trainer idle without hybrid replicas (seconds)."""
    hybrid_idle_s: float
    """Forecast trainer idle with hybrid replicas, activation and deactivation included (seconds)."""
    switch_s: float
    """Measured (or assumed) activation + deactivation cost (seconds)."""
    wait_samples: int
    """Queue size to wait for before deactivating (samples)."""
    window_s: float = 0.0
    """How long the hybrid replicas must stay routable for the queue to reach ``wait_samples``,
    standalone and hybrid production together (seconds; 0 when nothing was measured)."""

    @property
    def saving_s(self) -> float:
        """Idle the hybrid replicas are expected to remove, switches paid (seconds; may be negative)."""
        return self.static_idle_s - self.hybrid_idle_s


def standalone_rate(ctx: ScheduleContext, est: Estimates) -> float:
    """Samples per second the standalone replicas deliver, from the learned share (samples/s;
    needs ``est.train_s > 0``)."""
    return est.standalone_share * ctx.step_required_samples / est.train_s


def replica_ratio(ctx: ScheduleContext) -> float:
    """The prior rho: hybrid over standalone replicas, a hybrid replica as productive as a standalone one (ratio)."""
    return ctx.num_hybrid_replicas / max(1, ctx.num_standalone_replicas)


def ema(old: float, new: float, weight: float) -> float:
    """The running average after ``new`` with weight ``weight``; ``new`` alone while ``old`` is unmeasured (<= 0)."""
    return new if old <= 0 else (1.0 - weight) * old + weight * new


DRAIN_MIN_RATIO = 1.5
"""A weight sync counts as draining running samples only above this many times the shortest (ratio;
below it export and load jitter; once the shortest has itself drained some samples, one that
drained many more may still be under twice as long)."""

MAX_SECONDS = 1e9
"""Durations beyond this (about 30 years) are not measurements (seconds)."""

MIN_TRAIN_SECONDS = 1e-9
"""Training times below this are not measurements (seconds): the policy divides idle by them, and
a few denormal seconds make the idle share infinite, which a checkpoint cannot store."""

MAX_GAIN = 1e6
"""Hybrid over standalone token rates beyond this are not measurements (ratio)."""

MIN_SHARE = 1e-9
"""Standalone productions below this are no measurement (a cycle's samples per training time):
the policy divides by the rate they give, and one from a rate of a few denormal samples per
second makes the adjusted idle infinite, which a checkpoint cannot store."""


def learn_share(
    est: Estimates, share: float, throttled: bool, weight: float, *, replace_old: bool = False
) -> Estimates:
    """``est`` with ``share`` learned as the standalone production (``replace_old``: instead of averaged)."""
    # A throttled cycle's production is only a floor on what the replicas can do.
    if share < MIN_SHARE or (throttled and share <= est.standalone_share):
        return est
    return replace(est, standalone_share=share if replace_old else ema(est.standalone_share, share, weight))


def throttled(ctx: ScheduleContext) -> bool:
    """Whether the latest cycle's production was held back by the staleness budget: it neither
    waited nor ended below the buffer (a production measured then is only a floor)."""
    return sum(ctx.step_wait_times) <= 0 and ctx.queue_size >= ctx.buffer_samples


def first_production(ctx: ScheduleContext) -> bool:
    """Whether the latest cycle's production is the run's first measurement of it, which the next
    replaces instead of averaging with.

    The run's first cycle trained on the samples that finished first, the short ones: per second
    of its short training the production looks low.
    """
    return ctx.global_steps <= 2


def stock_adjusted_idle(ctx: ScheduleContext, est: Estimates, idle_s: float) -> float:
    """A cycle's trainer idle less the standalone production time of the samples it added to the
    queue, plus that of the samples it took from it (seconds, at least 0).

    A cycle with hybrids that ends with a fuller queue than it started with has done part of the
    next cycle's work, and the cycle without hybrids after it idles little because it uses that
    stock up: counted raw, the pair blames the hybrids for the window and credits the static
    cycle with the hybrids' samples, and the measured rho can fall to 0 so that the policy never
    switches again.
    """
    if est.queue_end < 0 or est.standalone_share <= 0 or est.train_s <= 0:
        return idle_s
    stocked = ctx.queue_size - est.queue_end
    return max(0.0, idle_s - stocked / standalone_rate(ctx, est))


def drain_samples(ctx: ScheduleContext, est: Estimates) -> int:
    """Samples the standalone replicas would have delivered while the latest weight sync took
    longer than the shortest one (count; 0 when it took at most ``DRAIN_MIN_RATIO`` times it).

    Without partial rollout a sync first waits for the running samples to finish, and the
    trainer idles meanwhile. A longer window leaves fewer of them running at the sync (the
    staleness budget closes admission earlier), so that drain is a wait the target missed by,
    like a fit step's.
    """
    if est.sync_min_s <= 0 or est.standalone_share <= 0 or est.train_s <= 0:
        return 0
    if ctx.last_sync_s <= DRAIN_MIN_RATIO * est.sync_min_s:
        # Export and load times vary from sync to sync: that jitter is no drain, and counting
        # it would raise the target a little every cycle.
        return 0
    drain_s = ctx.last_sync_s - est.sync_min_s
    return int(drain_s * standalone_rate(ctx, est))
