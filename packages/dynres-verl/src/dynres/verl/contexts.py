"""Context translation between verl's ``DynamicScheduleContext`` and dynres's ``ScheduleContext``.

verl hands its policies a mutable dataclass plus ``global_steps`` and ``is_hybrid_active``;
dynres hands one frozen :class:`~dynres.core.ScheduleContext`. :class:`VerlContextReader` turns
the former into the latter (the adapter, dynres policies inside verl) and
:func:`to_verl_context` goes the other way (the wrapper, verl's policies inside dynres).

Where each field verl's context lacks comes from (docs/verl.md has the same table):

* ``queue_size``, ``in_flight_samples``: the rollouter's ``get_hybrid_statistics()`` at the call
  (:class:`~dynres.verl.live.RolloutSnapshot`); 0 without a rollouter.
* ``total_steps``: the rollouter's ``get_total_train_steps()`` (verl's number of sync cycles).
* ``shared_host``: False; verl's replicas run on GPUs, each on its own.
* ``partial_rollout``: True, verl's default; verl passes its policy no config and its rollouter
  has no call that returns the setting.
* ``last_train_time_s``, ``consumption_rate``, ``last_cycle_time_s``, ``generation_rate``,
  ``last_sync_s``, ``last_hybrid_active_s``, ``last_hybrid_generated_samples``: derived from the
  trainer's call times and the rollouter's counters and stamps by
  :class:`~dynres.verl.live.CycleTimeline` (0 before the first cycle).
* ``last_hybrid_tokens``, ``last_standalone_tokens``: 0; verl counts no tokens per replica.
* ``now``: seconds on the reader's clock (wall time) since the adapter was built.
* ``staleness_threshold``: ``buffer_samples / step_required_samples`` once verl has filled
  ``buffer_samples`` (its trainer does at the first weight sync); the last such value after
  that; 0.0 before.
* replica counts: asked from the rollouter verl injects (``_rollouter``) when it answers;
  otherwise 0 standalone in an only-hybrid cluster, else 1, and 1 hybrid replica (the least a
  cluster with hybrid replicas has).
* ``last_activate_duration_s`` / ``last_deactivate_duration_s``: verl's values unchanged, i.e.
  the switch time accumulated in the current sync cycle (0 in a cycle without that switch), with
  one exception: at ``should_activate_after_step`` (and ``request_rebalance``), where verl's
  activation time is always 0 because the cycle's activation comes after that call, the context
  carries the activation that opened the cycle's hybrid window (the latest update's), which is what
  the dynres runtime reports there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from dynres.core import ScheduleContext
from dynres.verl.live import CycleTimeline, RolloutSnapshot


def _finite(x: Any, default: float = 0.0) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) and v >= 0 else default


class VerlContextReader:
    """Builds ScheduleContexts from verl contexts and verl's live state (see :mod:`dynres.verl.live`)."""

    def __init__(self, *, only_hybrid: bool, clock: Callable[[], float] = time.time) -> None:
        """Read contexts of a cluster that is only-hybrid or not; ``clock`` returns seconds.

        The clock must share its time base with verl's rollouter, whose hybrid add/remove stamps
        are ``time.time()``: hence wall time by default (a simulated verl run passes its own).
        """
        self.only_hybrid = only_hybrid
        """True when the cluster has no standalone replicas (verl's ``only_hybrid`` kwarg)."""
        self.num_standalone_replicas = 0 if only_hybrid else 1
        """Standalone replicas (count; 1 = at least one, until the rollouter answers)."""
        self.num_hybrid_replicas = 1
        """Hybrid replicas (count; 1 = at least one, until the rollouter answers)."""
        self.staleness_threshold = 0.0
        """Last staleness derived from verl's buffer_samples (fraction of a cycle)."""
        self.total_steps = 0
        """Sync cycles of the run, from the rollouter's ``get_total_train_steps()`` (count; 0 = unknown)."""
        self.snapshot: RolloutSnapshot | None = None
        """The rollouter's latest reading (None = no rollouter, or it did not answer)."""
        self.timeline = CycleTimeline()
        """The trainer's calls of the current cycle and the figures of the latest one."""
        self.clock = clock
        """Seconds on the time base of the rollouter's stamps."""
        self._t0 = clock()

    def use_clock(self, clock: Callable[[], float]) -> None:
        """Read time from ``clock`` from now on (a simulated verl run's loop clock); ``now`` restarts at 0."""
        self.clock = clock
        self._t0 = clock()

    def now(self) -> float:
        """Seconds since the reader was built (or its clock was set), on its clock."""
        return max(0.0, self.clock() - self._t0)

    def set_replica_counts(self, standalone: int, hybrid: int) -> None:
        """Use the rollouter's replica counts (ignored when they contradict the cluster's kind)."""
        if standalone < 0 or hybrid < 1 or (standalone == 0) != self.only_hybrid:
            return
        self.num_standalone_replicas, self.num_hybrid_replicas = standalone, hybrid

    def read(self, ctx: Any, *, global_steps: int, is_hybrid_active: bool) -> ScheduleContext:
        """The ScheduleContext for verl's ``ctx`` at ``global_steps`` (each field's source: module doc)."""
        required = max(1, int(ctx.required_samples))
        trigger = max(1, int(ctx.trigger_parameter_sync_step))
        buffer = _finite(getattr(ctx, "buffer_samples", 0.0))
        if buffer > 0:
            self.staleness_threshold = buffer / (required * trigger)
        waits = list(getattr(ctx, "step_wait_times", None) or ())
        counts = list(getattr(ctx, "step_wait_samples", None) or ())
        n = min(len(waits), len(counts))  # verl fills both per collection; trim a ragged pair
        active_total = self.num_standalone_replicas + (self.num_hybrid_replicas if is_hybrid_active else 0)
        snap = self.snapshot or RolloutSnapshot()
        f = self.timeline.figures
        return ScheduleContext(
            global_steps=max(0, int(global_steps)),
            now=self.now(),
            required_samples=required,
            trigger_parameter_sync_step=trigger,
            staleness_threshold=self.staleness_threshold,
            total_steps=self.total_steps,
            total_generated_samples=max(0, int(ctx.total_generated_samples)),
            expected_samples=max(0, int(ctx.expected_samples)),
            queue_size=snap.queue_size,
            in_flight_samples=snap.in_flight,
            step_wait_times=tuple(_finite(t) for t in waits[:n]),
            step_wait_samples=tuple(max(0, int(s)) for s in counts[:n]),
            is_hybrid_active=bool(is_hybrid_active),
            num_standalone_replicas=self.num_standalone_replicas,
            num_hybrid_replicas=self.num_hybrid_replicas,
            num_active_replicas=active_total,
            last_activate_duration_s=(
                self.timeline.opening_activate_s
                if self.timeline.deciding
                else _finite(getattr(ctx, "last_activate_duration_s", 0.0))
            ),
            last_deactivate_duration_s=_finite(getattr(ctx, "last_deactivate_duration_s", 0.0)),
            generation_rate=f.generated / f.cycle_s if f.cycle_s > 0 else 0.0,
            consumption_rate=required * trigger / f.train_s if f.train_s > 0 else 0.0,
            last_train_time_s=f.train_s,
            last_cycle_time_s=f.cycle_s,
            last_hybrid_active_s=f.hybrid_s,
            last_hybrid_generated_samples=f.hybrid_generated,
            last_sync_s=f.sync_s,
        )


def to_verl_context(ctx: ScheduleContext, *, activate_s: float, deactivate_s: float) -> Any:
    """Return verl's ``DynamicScheduleContext`` for ``ctx``, with the cycle's switch times given.

    ``buffer_samples`` is ``step_required_samples x staleness_threshold`` unrounded, as verl's
    trainer computes it; ``activate_s`` / ``deactivate_s`` are the seconds of the switches that
    belong to this cycle (verl's accumulate-and-reset convention, see the wrapper).
    """
    from dynres.verl._verl import schedule_module

    cls = schedule_module().DynamicScheduleContext
    return cls(
        required_samples=ctx.required_samples,
        trigger_parameter_sync_step=ctx.trigger_parameter_sync_step,
        total_generated_samples=ctx.total_generated_samples,
        expected_samples=ctx.expected_samples,
        buffer_samples=ctx.step_required_samples * ctx.staleness_threshold,
        step_wait_times=list(ctx.step_wait_times),
        step_wait_samples=list(ctx.step_wait_samples),
        only_hybrid=ctx.only_hybrid,
        last_activate_duration_s=activate_s,
        last_deactivate_duration_s=deactivate_s,
    )
