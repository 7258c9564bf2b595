"""The simulator drives the real runtime: progress per cycle, policy threads on the virtual clock."""

from __future__ import annotations

import threading
import time

import pytest

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


class Recording(DefaultPolicy):
    """The default policy, keeping every context update_after_step saw."""

    name = "recording_default"

    def __init__(self, params: object = None) -> None:
        super().__init__(params)  # type: ignore[arg-type]  # the test passes a plain mapping
        self.seen: list[ScheduleContext] = []

    def update_after_step(self, ctx: ScheduleContext) -> None:
        self.seen.append(ctx)
        super().update_after_step(ctx)


def test_context_reports_run_length_hybrid_time_and_sync_time() -> None:
    pol = Recording({"deactivate_ratio": 0.6})
    r = simulate("seed-dynamic-16-16", policy=pol, overrides={"steps": 4})
    assert [c.total_steps for c in pol.seen] == [4] * 5
    sc = r.scenario
    for ctx, cycle in zip(pol.seen[1:], r.report.cycles, strict=True):
        # The standalone replicas load each update for weight_sync_s (export is free here).
        assert ctx.last_sync_s == pytest.approx(sc.costs.weight_sync_s + sc.costs.export_weights_s)
        if cycle.hybrid_active_at_start:
            # Hybrid replicas were routable from the previous activation to this deactivation:
            # the rebalance after it (an abort on the standalone replicas) and the whole wait for
            # enough samples; they finished some of the cycle's samples.
            wait = cycle.wait_for_enough_samples_s
            assert wait - 1e-6 <= ctx.last_hybrid_active_s <= wait + sc.costs.abort_s + 1e-6
            assert 0 < ctx.last_hybrid_generated_samples <= cycle.samples_generated
        else:
            assert ctx.last_hybrid_active_s == 0 and ctx.last_hybrid_generated_samples == 0


@pytest.mark.parametrize("partial", [True, False])
def test_context_carries_the_runs_partial_rollout_setting(partial: bool) -> None:
    pol = Recording({"deactivate_ratio": 0.6})
    simulate("seed-dynamic-16-16", policy=pol, overrides={"steps": 2, "async_training.partial_rollout": partial})
    assert len(pol.seen) == 3 and {c.partial_rollout for c in pol.seen} == {partial}


@pytest.mark.parametrize("shared", [True, False])
def test_context_carries_the_scenarios_shared_host(shared: bool) -> None:
    pol = Recording({"deactivate_ratio": 0.6})
    simulate("seed-dynamic-16-16", policy=pol, overrides={"steps": 2, "cluster.shared_host": shared})
    assert len(pol.seen) == 3 and {c.shared_host for c in pol.seen} == {shared}


def test_queue_size_end_is_read_before_the_end_of_cycle_activation() -> None:
    # queue_size_end is the queue after the cycle's sync, what the policy's end-of-cycle context
    # shows, capped at max_required - step_required. Read after the activation (offload, wake-up,
    # weight load, rebalance: ~10 s of standalone output) it was larger, above the cap at times.
    pol = Recording({"deactivate_ratio": 0.6})
    r = simulate("seed-dynamic-16-16", policy=pol, overrides={"steps": 12})
    assert [c.queue_size_end for c in r.report.cycles] == [ctx.queue_size for ctx in pol.seen[1:]]
    cap = int(r.scenario.step_required_samples * r.scenario.async_training.staleness_threshold)
    assert max(c.queue_size_end for c in r.report.cycles) <= cap


def test_long_simulated_fit_steps_are_not_timeouts() -> None:
    # A fit step of ~1600 virtual seconds is what the scenario models; the runtime's 600 s
    # operation timeout is for hung engines and must not fire on the virtual clock.
    r = simulate("verl-7b-async-16-16", overrides={"steps": 1, "workload.train.step_s": 1600.0})
    assert len(r.report.cycles) == 1 and not r.report.op_failures
    assert r.extra["train_compute_s"] > 4 * 1000


def test_context_token_counts_measure_the_hybrid_speed_factor() -> None:
    # Hybrid replicas decoding at 85% and at 5% of a standalone one: per cycle with hybrids, their
    # token rate while routable against the standalone replicas' over the cycle tells the two
    # apart (sample counts do not: with partial rollout the standalone replicas finish the samples
    # the hybrids worked on).
    measured = {}
    for factor in (0.85, 0.05):
        pol = Recording({"deactivate_ratio": 0.6})
        simulate(
            "seed-dynamic-16-16", policy=pol, overrides={"steps": 4, "workload.decode.hybrid_speed_factor": factor}
        )
        cycles = pol.seen[1:]
        assert all(c.last_standalone_tokens > 0 for c in cycles)
        assert all((c.last_hybrid_tokens > 0) == (c.last_hybrid_active_s > 0) for c in cycles)
        hybrid = [c for c in cycles if c.last_hybrid_active_s > 0]
        per_replica = [
            (c.last_hybrid_tokens / c.last_hybrid_active_s / c.num_hybrid_replicas)
            / (c.last_standalone_tokens / c.last_cycle_time_s / c.num_standalone_replicas)
            for c in hybrid
        ]
        measured[factor] = sum(per_replica) / len(per_replica)
    assert measured[0.05] < 0.1 and 0.6 < measured[0.85] < 1.4, measured
