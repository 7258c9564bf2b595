"""What a dynres policy inside verl learns from verl's live state: the rollouter's counters, the trainer's call times.

One scripted sync cycle with known times, played in verl 0.9.1's trainer order against the adapter
with a rollouter stub and a hand-moved clock; every derived field is checked against the figure
the script implies.
"""

from __future__ import annotations

from typing import Any

import pytest

from dynres.core import ScheduleContext
from dynres.verl._verl import schedule_module
from dynres.verl.live import CycleTimeline, RolloutSnapshot

REQUIRED, TRIGGER = 8, 2


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0  # wall-clock-like: the rollouter's stamps are on the same base

    def __call__(self) -> float:
        return self.t


class Rollouter:
    """verl's rollouter as the adapter reads it: replica lists, the run's length, get_hybrid_statistics()."""

    def __init__(self) -> None:
        self.stats: dict[str, Any] = {}

    def __getattr__(self, method: str) -> Any:
        if method.startswith("__"):
            raise AttributeError(method)
        answers = {
            "get_standalone_replicas": lambda: [object(), object()],
            "get_all_hybrid_replicas": lambda: {"hybrid_0": object()},
            "get_total_train_steps": lambda: 40,
            "get_hybrid_statistics": lambda: dict(self.stats),
        }

        class Method:
            @staticmethod
            def remote() -> Any:
                return answers[method]()

        return Method

    def set(self, *, queue: int, in_flight: int, generated: int, added: float, removed: float) -> None:
        self.stats = {
            "monitor/queue/mq_queue_size": queue,
            "monitor/active_tasks_size": in_flight,
            "count/total_generated_samples": generated,
            "hybrid/last_add_time": added,
            "hybrid/last_remove_time": removed,
            "hybrid/num_hybrid_replicas": 1,
        }


def verl_ctx() -> Any:
    return schedule_module().DynamicScheduleContext(
        required_samples=REQUIRED,
        trigger_parameter_sync_step=TRIGGER,
        total_generated_samples=0,
        expected_samples=0,
        buffer_samples=0,
    )


@pytest.fixture
def scripted(monkeypatch):
    """An adapter over a recording policy, and the script of one start-up sync plus one cycle."""
    seen: dict[str, ScheduleContext] = {}
    pol = schedule_module().build_policy("dynres:default", deactivate_ratio=0.3, only_hybrid=False)
    clock = Clock()
    pol.reader.use_clock(clock)
    rollouter = Rollouter()
    pol._rollouter = rollouter

    def recording(method: str, real: Any) -> Any:
        def call(ctx: ScheduleContext) -> Any:
            seen[method] = ctx
            return real(ctx)

        return call

    for method in ("should_deactivate", "deactivate_wait_samples", "should_activate_after_step", "update_after_step"):
        monkeypatch.setattr(pol.policy, method, recording(method, getattr(pol.policy, method)))
    ctx = verl_ctx()
    t0 = clock.t
    # Start-up (verl's "param sync before fit"): activation question, a 5 s sync, a 3 s activation.
    rollouter.set(queue=0, in_flight=0, generated=0, added=0.0, removed=0.0)
    pol.should_activate_after_step(0, False, ctx)
    clock.t = t0 + 8.0
    rollouter.set(queue=0, in_flight=16, generated=0, added=t0 + 7.5, removed=0.0)
    ctx.last_activate_duration_s = 3.0
    pol.update_after_step(0, ctx)
    ctx.last_activate_duration_s = 0.0
    # Cycle 1, fit step 1 at +10: hybrids active; wait for default's 4 queued samples (1 there, 20 made so far).
    clock.t = t0 + 10.0
    rollouter.set(queue=1, in_flight=20, generated=20, added=t0 + 7.5, removed=0.0)
    assert pol.should_deactivate(0, True, ctx) is True
    target = pol.deactivate_wait_samples(ctx)
    # The queue reached the target at +16 (the rollouter's removal stamp), the deactivation took
    # 2 s, the first collection waited 1 s, the step trained 30 s; fit step 2 at +49 waited 4 s and
    # trained 30 s; the cycle's training ends at +83.
    ctx.last_deactivate_duration_s = 2.0
    clock.t = t0 + 49.0
    rollouter.set(queue=1, in_flight=12, generated=45, added=t0 + 7.5, removed=t0 + 16.0)
    assert pol.should_deactivate(0, False, ctx) is False
    clock.t = t0 + 83.0
    rollouter.set(queue=2, in_flight=14, generated=70, added=t0 + 7.5, removed=t0 + 16.0)
    ctx.total_generated_samples, ctx.expected_samples, ctx.buffer_samples = 70, 16, 8.0
    ctx.step_wait_times, ctx.step_wait_samples = [1.0, 4.0], [3, 5]
    pol.should_activate_after_step(1, False, ctx)
    before = seen["should_activate_after_step"]
    # A 6 s sync, no activation; update at +89.
    clock.t = t0 + 89.0
    rollouter.set(queue=3, in_flight=15, generated=72, added=t0 + 7.5, removed=t0 + 16.0)
    pol.update_after_step(1, ctx)
    return target, before, seen["update_after_step"]


def test_a_policy_inside_verl_sees_the_cycle_the_dynres_runtime_would_measure(scripted):
    target, before, after = scripted
    assert target == int(0.3 * REQUIRED * TRIGGER)
    # Read live from the rollouter at the call.
    assert (before.queue_size, before.in_flight_samples, before.total_steps) == (2, 14, 40)
    assert (before.num_standalone_replicas, before.num_hybrid_replicas) == (2, 1)
    # Training: 73 s from the first fit step, less 5 s of collection waits, 2 s of deactivation
    # and the 6 s the trainer waited for the target (the rollouter's removal stamp ends it).
    assert before.last_train_time_s == pytest.approx(60.0)
    assert before.consumption_rate == pytest.approx(REQUIRED * TRIGGER / 60.0)
    # Before the sync the cycle carries the previous (start-up) sync: 75 s since the update + 5 s.
    assert before.last_sync_s == pytest.approx(5.0)
    assert before.last_cycle_time_s == pytest.approx(80.0)
    assert before.generation_rate == pytest.approx(70 / 80.0)
    # Hybrids routable from the add (+7.5) to the removal (+16); they made the 20 samples done by
    # the wait's start plus the 3 the queue still needed then (the trainer consumed nothing).
    assert before.last_hybrid_active_s == pytest.approx(8.5)
    assert before.last_hybrid_generated_samples == 23
    assert (before.last_hybrid_tokens, before.last_standalone_tokens) == (0, 0)  # verl counts none
    # After the sync: its own 6 s, and the cycle's time and production counted to the update.
    assert after.last_sync_s == pytest.approx(6.0)
    assert after.last_cycle_time_s == pytest.approx(75.0 + 6.0)
    assert after.generation_rate == pytest.approx(72 / 81.0)
    assert after.last_train_time_s == pytest.approx(60.0)
    assert after.queue_size == 3


def test_without_a_rollouter_the_call_times_still_give_the_cycle_and_the_rest_reads_unknown():
    pol = schedule_module().build_policy("dynres:default", deactivate_ratio=0.3, only_hybrid=False)
    clock = Clock()
    pol.reader.use_clock(clock)
    ctx = verl_ctx()
    pol.should_activate_after_step(0, False, ctx)
    clock.t += 4.0
    pol.update_after_step(0, ctx)
    clock.t += 1.0
    pol.should_deactivate(0, False, ctx)
    clock.t += 50.0
    ctx.total_generated_samples, ctx.step_wait_times, ctx.step_wait_samples = 30, [10.0, 0.0], [4, 0]
    pol.should_activate_after_step(1, False, ctx)
    figures = pol.reader.timeline.figures
    assert figures.train_s == pytest.approx(40.0) and figures.cycle_s == pytest.approx(55.0)
    s = pol.reader.read(ctx, global_steps=1, is_hybrid_active=False)
    assert (s.queue_size, s.in_flight_samples, s.total_steps, s.last_hybrid_active_s) == (0, 0, 0, 0.0)


def test_a_rollouter_that_does_not_answer_is_one_warning_and_unknown_fields(caplog):
    class Broken:
        def __getattr__(self, method: str) -> Any:
            raise RuntimeError("actor died")

    pol = schedule_module().build_policy("dynres:default", deactivate_ratio=0.3, only_hybrid=False)
    pol._rollouter = Broken()
    for _ in range(3):
        pol.should_deactivate(0, False, verl_ctx())
    warnings = [r for r in caplog.records if "did not report its state" in r.getMessage()]
    assert len(warnings) == 1
    assert pol.reader.snapshot is None


def test_the_removal_stamp_only_counts_when_it_follows_the_wait():
    timeline = CycleTimeline()
    timeline.after_sync(1.0, verl_ctx(), RolloutSnapshot(hybrid_added_at=0.5))
    timeline.fit_step(2.0, True)
    timeline.waiting(2.0, 10, RolloutSnapshot(queue_size=2, total_generated=5, hybrid_added_at=0.5))
    # A removal stamp from an earlier cycle says nothing about this wait.
    stale = RolloutSnapshot(total_generated=9, hybrid_added_at=0.5, hybrid_removed_at=0.7)
    figures = timeline.before_sync(22.0, verl_ctx(), stale)
    assert figures.train_s == pytest.approx(20.0)
    assert figures.hybrid_s == pytest.approx(21.5)  # still routable as far as the stamps say


def test_snapshots_read_verls_keys_and_treat_garbage_as_unknown():
    snap = RolloutSnapshot.from_stats(
        {
            "monitor/queue/mq_queue_size": 7,
            "monitor/active_tasks_size": "3",
            "count/total_generated_samples": -5,
            "hybrid/last_add_time": float("nan"),
            "hybrid/last_remove_time": 12.5,
        }
    )
    assert snap == RolloutSnapshot(queue_size=7, in_flight=3, total_generated=0, hybrid_removed_at=12.5)
