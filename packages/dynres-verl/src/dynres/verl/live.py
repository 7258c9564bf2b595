"""verl's live run state, as a dynres policy inside verl sees it: the rollouter's counters and the trainer's call times.

verl hands its policies a ``DynamicScheduleContext`` that says nothing about the queue, the samples
in flight, training or sync times, or what the hybrid replicas did. Two sources fill the gap without
touching verl:

* **the rollouter.** verl's ``DynamicResourceController`` gives every policy the rollouter's actor
  handle (``policy._rollouter``). Its ``get_hybrid_statistics()`` returns, in one call, the message
  queue's size (``monitor/queue/mq_queue_size``), the samples being generated
  (``monitor/active_tasks_size``), the samples generated so far (``count/total_generated_samples``)
  and when hybrid replicas last entered and left the load balancer (``hybrid/last_add_time``,
  ``hybrid/last_remove_time``, the rollouter's ``time.time()``); ``get_total_train_steps()`` is the
  run's number of sync cycles. :class:`RolloutSnapshot` holds one such reading.
* **the trainer's call order.** verl's trainer calls ``should_deactivate`` at the start of every fit
  step, ``deactivate_wait_samples`` right before it waits for the queue, ``should_activate_after_step``
  after the cycle's last train step and *before* the weight sync, and ``update_after_step`` after
  the sync, the activation and the staleness reset. :class:`CycleTimeline` stamps these calls and
  turns them, with the context's own wait and switch times, into the cycle's training time, sync
  time, hybrid window and production: the fields the dynres runtime measures directly.

The timeline's clock must be on the same time base as the rollouter's stamps, which is why the
adapter's default clock is ``time.time`` (wall time; on a multi-node cluster the rollouter's node and
the trainer's agree to NTP's accuracy). Where a reading is missing (no rollouter injected, an RPC
failed, a stamp older than the cycle), the field keeps dynres's "unknown" value 0 and the policy
falls back as documented in docs/verl.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

STATS_KEYS: dict[str, str] = {
    "queue_size": "monitor/queue/mq_queue_size",
    "in_flight": "monitor/active_tasks_size",
    "total_generated": "count/total_generated_samples",
    "hybrid_added_at": "hybrid/last_add_time",
    "hybrid_removed_at": "hybrid/last_remove_time",
}
"""RolloutSnapshot field -> key of verl's ``get_hybrid_statistics()`` dict it comes from."""


def _count(x: Any) -> int:
    try:
        v = int(x)
    except (TypeError, ValueError, OverflowError):
        return 0
    return max(0, v)


def _stamp(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) and v > 0 else 0.0


@dataclass(frozen=True)
class RolloutSnapshot:
    """One reading of verl's rollouter (counts in samples; stamps in seconds on its clock, 0 = never)."""

    queue_size: int = 0
    """Samples waiting in the message queue."""
    in_flight: int = 0
    """Samples the rollouter is generating (its active tasks)."""
    total_generated: int = 0
    """Samples generated since training began."""
    hybrid_added_at: float = 0.0
    """When hybrid replicas last entered the load balancer (seconds; 0 = never)."""
    hybrid_removed_at: float = 0.0
    """When hybrid replicas last left it (seconds; 0 = never)."""

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any]) -> RolloutSnapshot:
        """Read verl's ``get_hybrid_statistics()`` dict; a missing or malformed key reads as 0."""
        return cls(
            queue_size=_count(stats.get(STATS_KEYS["queue_size"])),
            in_flight=_count(stats.get(STATS_KEYS["in_flight"])),
            total_generated=_count(stats.get(STATS_KEYS["total_generated"])),
            hybrid_added_at=_stamp(stats.get(STATS_KEYS["hybrid_added_at"])),
            hybrid_removed_at=_stamp(stats.get(STATS_KEYS["hybrid_removed_at"])),
        )


@dataclass(frozen=True)
class CycleFigures:
    """What the timeline derived for the latest sync cycle (seconds and samples; 0 = unknown)."""

    cycle_s: float = 0.0
    """The cycle's time as the dynres runtime counts it: its collections plus a weight sync."""
    train_s: float = 0.0
    """Time the trainer spent training: the cycle's fit steps minus their waits and the switch."""
    sync_s: float = 0.0
    """The latest weight sync into the standalone replicas."""
    generated: int = 0
    """Samples generated during the cycle."""
    hybrid_s: float = 0.0
    """Time hybrid replicas were routable during the cycle."""
    hybrid_generated: int = 0
    """Samples generated while they were."""


class CycleTimeline:
    """Stamps verl's policy calls within a sync cycle and derives the cycle's times from them.

    All times are on one clock (the adapter's) and compared with the rollouter's stamps. The
    figures for ``should_activate_after_step`` come before the cycle's weight sync, so they carry
    the previous sync time, and the cycle time is counted from the previous update to this call
    plus that sync: what a policy subtracts as "sync" from the cycle then matches what the cycle
    contains. ``update_after_step`` sees the cycle's own sync.
    """

    def __init__(self) -> None:
        """Start before the first cycle, with nothing measured."""
        self.figures = CycleFigures()
        """The latest cycle's figures (what the next contexts carry)."""
        self.opening_activate_s = 0.0
        """The activation at the latest update, which opened the current hybrid window (seconds; 0 = none)."""
        self.deciding = False
        """True between ``should_activate_after_step`` and ``update_after_step`` (the weight sync)."""
        self._updated_at: float | None = None
        self._generated_at_update = 0
        self._first_step_at: float | None = None
        self._active_at_start = False
        self._wait: tuple[float, int, int, int] | None = None  # (time, queue, target, generated)
        self._before_sync_at: float | None = None
        self._before_sync: CycleFigures | None = None

    def fit_step(self, now: float, is_hybrid_active: bool) -> None:
        """verl's trainer started a fit step (its ``should_deactivate`` call)."""
        if self._first_step_at is None:
            self._first_step_at = now
            self._active_at_start = is_hybrid_active

    def waiting(self, now: float, target: int, snap: RolloutSnapshot | None) -> None:
        """The trainer is about to wait for ``target`` queued samples, then deactivate."""
        if snap is not None:
            self._wait = (now, snap.queue_size, target, snap.total_generated)

    def before_sync(self, now: float, ctx: Any, snap: RolloutSnapshot | None) -> CycleFigures:
        """The cycle's train steps are done (``should_activate_after_step``): derive its figures."""
        prev = self.figures
        start = self._updated_at
        if start is None:
            # Before the first update (verl's start-up sync) there is no cycle to measure.
            self._before_sync_at, self._before_sync = now, None
            self.deciding = True
            return prev
        generated = _generated(ctx, snap)
        window = max(0.0, now - start)
        waits = sum(_finite_list(getattr(ctx, "step_wait_times", None)))
        deactivate_s = _seconds(getattr(ctx, "last_deactivate_duration_s", 0.0))
        wait_s, removed_at = self._wait_for_enough(now, snap)
        first = self._first_step_at if self._first_step_at is not None else start
        train = max(0.0, (now - first) - waits - deactivate_s - wait_s)
        hybrid_s, hybrid_generated = self._hybrid_window(now, snap, removed_at)
        figures = CycleFigures(
            cycle_s=window + prev.sync_s,
            train_s=train,
            sync_s=prev.sync_s,
            generated=max(0, generated - self._generated_at_update),
            hybrid_s=hybrid_s,
            hybrid_generated=hybrid_generated,
        )
        self._before_sync_at, self._before_sync = now, figures
        self.figures = figures
        self.deciding = True
        return figures

    def after_sync(self, now: float, ctx: Any, snap: RolloutSnapshot | None) -> CycleFigures:
        """The weight sync, activation and staleness reset are done (``update_after_step``)."""
        figures = self.figures
        t_before = self._before_sync_at
        generated = _generated(ctx, snap)
        if t_before is not None:
            # The activation verl did after the sync is in the context's accumulated time.
            sync_s = max(0.0, now - t_before - _seconds(getattr(ctx, "last_activate_duration_s", 0.0)))
            before = self._before_sync
            if before is not None and self._updated_at is not None:
                figures = CycleFigures(
                    cycle_s=(t_before - self._updated_at) + sync_s,
                    train_s=before.train_s,
                    sync_s=sync_s,
                    generated=max(0, generated - self._generated_at_update),
                    hybrid_s=before.hybrid_s,
                    hybrid_generated=before.hybrid_generated,
                )
            else:
                # verl's start-up sync (before the first cycle): only its duration is known.
                figures = CycleFigures(sync_s=sync_s)
        self.figures = figures
        self.opening_activate_s = _seconds(getattr(ctx, "last_activate_duration_s", 0.0))
        self.deciding = False
        self._updated_at = now
        self._generated_at_update = generated
        self._first_step_at = None
        self._wait = None
        self._before_sync_at = self._before_sync = None
        return figures

    # ---- derivations ----------------------------------------------------------------------

    def _wait_for_enough(self, now: float, snap: RolloutSnapshot | None) -> tuple[float, float]:
        """Seconds the trainer waited for the deactivation target, and when the hybrids left routing.

        verl's controller removes the hybrid replicas from the load balancer first thing in a
        deactivation, so the rollouter's removal stamp ends the wait that began at
        ``deactivate_wait_samples``.
        """
        if self._wait is None or snap is None:
            return 0.0, 0.0
        began = self._wait[0]
        removed = snap.hybrid_removed_at
        if removed < began:
            return 0.0, 0.0  # no removal since the wait began: unknown, counted as none
        return min(removed, now) - began, removed

    def _hybrid_window(self, now: float, snap: RolloutSnapshot | None, removed_at: float) -> tuple[float, int]:
        """Seconds the hybrid replicas were routable this cycle, and the samples generated meanwhile.

        The window opens at the rollouter's last add (the activation after the previous sync) and
        closes at the removal that ended the deactivation wait, or now if they are still routable.
        The trainer consumes nothing while it waits for the target, so what the queue grew by in
        that wait was generated then; before it, the rollouter's own count says.
        """
        if not self._active_at_start or self._updated_at is None or snap is None:
            return 0.0, 0
        opened = snap.hybrid_added_at if 0 < snap.hybrid_added_at <= self._updated_at else self._updated_at
        closed = removed_at if removed_at > opened else now
        if self._wait is None:
            generated = snap.total_generated - self._generated_at_update
        else:
            _, queue, target, generated_at_wait = self._wait
            generated = generated_at_wait - self._generated_at_update
            if removed_at > 0:
                generated += max(0, target - queue)
        return max(0.0, closed - opened), max(0, generated)


def _generated(ctx: Any, snap: RolloutSnapshot | None) -> int:
    """Samples generated so far: the rollouter's count, else what verl's trainer last put in the context."""
    return snap.total_generated if snap is not None else _count(getattr(ctx, "total_generated_samples", 0))


def _seconds(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) and v > 0 else 0.0


def _finite_list(values: Any) -> list[float]:
    return [_seconds(v) for v in (values or ())]
