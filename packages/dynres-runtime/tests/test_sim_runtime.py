"""The simulator drives the real runtime: progress per cycle, policy threads on the virtual clock."""

from __future__ import annotations

import threading
import time

from dynres.core import ScheduleContext
from dynres.policies.default import DefaultPolicy
from dynres.runtime.sim import simulate

SHORT = {"steps": 3}


def test_progress_is_called_once_per_sync_cycle() -> None:
    seen: list[tuple[int, float]] = []
    r = simulate("seed-dynamic-16-16", overrides=SHORT, progress=lambda c: seen.append((c.step, c.end_s)))
    assert [s for s, _ in seen] == [1, 2, 3]
    assert seen[-1][1] == r.end_to_end_s


class SlowDefault(DefaultPolicy):
    """The default policy, but every decision takes real time in its worker thread."""

    name = "slow_default"

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        time.sleep(0.02)
        return super().should_activate_after_step(ctx)

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        time.sleep(0.02)
        return super().deactivate_wait_samples(ctx)


def test_slow_policy_threads_cost_no_virtual_time() -> None:
    """Real time spent in policy threads never leaks into the virtual clock (or the results)."""
    fast = simulate("seed-dynamic-16-16", overrides=SHORT)
    slow = simulate("seed-dynamic-16-16", policy=SlowDefault({"deactivate_ratio": 0.6}), overrides=SHORT)
    assert slow.report.policy_fallbacks == 0
    assert slow.end_to_end_s == fast.end_to_end_s
    assert [c.metrics for c in slow.report.cycles] == [c.metrics for c in fast.report.cycles]


class HangsOnce(DefaultPolicy):
    """Hangs (for real) in its first activation decision, then behaves."""

    name = "hangs_once"
    release = threading.Event()

    def __init__(self, *a: object, **k: object) -> None:
        super().__init__(*a, **k)  # type: ignore[arg-type]  # the base's parameters are typed; this test double forwards any
        self.calls = 0

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        self.calls += 1
        if self.calls == 1:
            self.release.wait(5)
        return super().should_activate_after_step(ctx)


def test_hung_policy_times_out_on_virtual_time_and_falls_back() -> None:
    policy = HangsOnce({"deactivate_ratio": 0.6})
    t0 = time.perf_counter()
    try:
        r = simulate("seed-dynamic-16-16", policy=policy, overrides=SHORT, thread_grace_s=0.2)
    finally:
        HangsOnce.release.set()
    assert time.perf_counter() - t0 < 5
    assert r.report.policy_fallbacks == 1
    first = r.report.startup_decisions[0]
    assert first.method == "should_activate_after_step" and first.fallback and "no answer" in first.reason
    assert r.end_to_end_s >= r.lower_bound_s
