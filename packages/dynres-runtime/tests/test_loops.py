"""Rollouter/trainer loops: policy call order, fault isolation, wait clamps, staleness, rebalance gate."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from small_config import small_config

from dynres.core import Policy, ScheduleContext, get_plugin_manager, hookimpl
from dynres.core.config import DynresConfig
from dynres.runtime.backends.fake import FakeCluster, FakeReplica, fake_prompts
from dynres.runtime.loop.driver import FullyAsyncRun, RunSpec, max_required_samples, run_fully_async
from dynres.runtime.loop.queue import MessageQueue
from dynres.runtime.loop.report import RunReport
from dynres.runtime.loop.rollouter import Rollouter
from dynres.runtime.loop.routing import LoadBalancer


def make_cfg(
    *,
    trigger: int = 2,
    mini: int = 4,
    staleness: float = 0.5,
    csr: int = 4,
    standalone_nodes: int = 1,
    rebalance: bool = True,
    partial: bool = True,
) -> DynresConfig:
    return small_config(
        standalone_nodes=standalone_nodes,
        mini=mini,
        n=1,
        trigger_parameter_sync_step=trigger,
        staleness_threshold=staleness,
        concurrent_samples_per_replica=csr,
        dynamic_schedule_enable_rebalance=rebalance,
        partial_rollout=partial,
    )


class Scripted(Policy):
    """Answers from class attributes and records every call (method, global_steps, hybrid active)."""

    name = "scripted"
    deactivate: Any = True
    wait: Any = 2
    activate: Any = True
    rebalance: Any = True
    update: Any = None

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self.calls: list[tuple[str, int, bool]] = []

    def _rec(self, m: str, ctx: ScheduleContext) -> None:
        self.calls.append((m, ctx.global_steps, ctx.is_hybrid_active))

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        self._rec("should_deactivate", ctx)
        return self._answer("deactivate")

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        self._rec("deactivate_wait_samples", ctx)
        return self._answer("wait")

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        self._rec("should_activate_after_step", ctx)
        return self._answer("activate")

    def should_rebalance(self, ctx: ScheduleContext) -> bool:
        self._rec("should_rebalance", ctx)
        return self._answer("rebalance")

    def update_after_step(self, ctx: ScheduleContext) -> None:
        self._rec("update_after_step", ctx)
        return self._answer("update")

    def _answer(self, attr: str) -> Any:
        v = getattr(type(self), attr)
        return v() if callable(v) else v


def scripted(**answers: Any) -> Scripted:
    members = {k: staticmethod(v) if callable(v) else v for k, v in answers.items()}
    cls = type("ScriptedX", (Scripted,), {**members, "name": "scripted"})
    return cls()


class DecisionLog:
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any, bool]] = []

    @hookimpl
    def dynres_decision_made(self, decision: str, value: Any, fallback: bool) -> None:
        self.seen.append((decision, value, fallback))


def run(
    policy: Policy,
    *,
    cfg: DynresConfig | None = None,
    n_standalone: int = 2,
    n_hybrid: int = 2,
    cycles: int = 3,
    cluster: FakeCluster | None = None,
    observer: Any = None,
    **spec_kw: Any,
) -> tuple[RunReport, FakeCluster]:
    cfg = cfg or make_cfg()
    cl = cluster or FakeCluster(n_standalone, n_hybrid)
    pm = get_plugin_manager(load_plugins=False)
    if observer is not None:
        pm.register(observer)
    spec = RunSpec(
        config=cfg,
        policy=policy,
        standalone=cl.standalone,
        hybrid=cl.hybrid,
        train_engine=cl.engine,
        prompts=fake_prompts(),
        num_cycles=cycles,
        plugin_manager=pm,
        **spec_kw,
    )
    report = asyncio.run(run_fully_async(spec))
    assert cl.violations() == []
    return report, cl


# ---- policy call order ---------------------------------------------------------------------


def test_policy_call_order_per_cycle() -> None:
    pol = scripted()
    report, _ = run(pol, cycles=3)
    calls = [(m, g) for m, g, _ in pol.calls]
    startup = [("should_activate_after_step", 0), ("should_rebalance", 0), ("update_after_step", 0)]
    expected = list(startup)
    for g in range(1, 4):
        expected += [("should_deactivate", g - 1), ("deactivate_wait_samples", g - 1)]
        # After the run's final sync nothing is activated (it would only cost a switch), so
        # the policy is asked only to learn from the cycle.
        expected += [("should_activate_after_step", g), ("should_rebalance", g)] if g < 3 else []
        expected += [("update_after_step", g)]
    assert calls == expected
    # deactivation is asked while active; activation and update see the same context
    assert all(active for m, _, active in pol.calls if m == "should_deactivate")
    assert all(active for m, _, active in pol.calls if m == "should_rebalance")
    assert [c.step for c in report.cycles] == [1, 2, 3]
    assert all(c.deactivated and c.activated and c.rebalanced for c in report.cycles[:-1])
    assert report.cycles[-1].deactivated and not report.cycles[-1].activated
    assert report.final_state == "STANDALONE_ONLY"


def test_should_deactivate_not_asked_while_standalone_only() -> None:
    pol = scripted(activate=False)
    report, _ = run(pol, cycles=2)
    # startup and cycle 1 ask both; after the final sync (cycle 2) only update_after_step
    assert [m for m, _, _ in pol.calls] == ["should_activate_after_step", "update_after_step"] * 2 + [
        "update_after_step"
    ]
    assert report.operations.activations == 0


def test_kept_active_hybrids_still_hand_gpus_back_before_training() -> None:
    pol = scripted(deactivate=False)
    report, cl = run(pol, cycles=2)
    assert all(c.deactivated for c in report.cycles)
    assert all(c.deactivate_wait_samples is None for c in report.cycles)
    assert cl.engine.violations == []  # never trained while offloaded


# ---- rebalance gate -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("enabled", "answer", "asked", "done"),
    [(False, True, False, False), (True, False, True, False), (True, True, True, True)],
)
def test_rebalance_needs_config_and_policy(enabled: bool, answer: bool, asked: bool, done: bool) -> None:
    pol = scripted(rebalance=answer)
    report, _ = run(pol, cfg=make_cfg(rebalance=enabled), cycles=1)
    assert any(m == "should_rebalance" for m, _, _ in pol.calls) is asked
    assert (report.operations.rebalances > 0) is done


# ---- fault isolation ------------------------------------------------------------------------


def _hang() -> bool:
    time.sleep(1.0)
    return True


def _boom() -> bool:
    raise ValueError("policy bug")


@pytest.mark.parametrize(
    ("answers", "method", "safe"),
    [
        ({"activate": _boom}, "should_activate_after_step", False),
        ({"activate": _hang}, "should_activate_after_step", False),
        ({"activate": 1}, "should_activate_after_step", False),
        ({"activate": "yes"}, "should_activate_after_step", False),
        ({"deactivate": None}, "should_deactivate", True),
        ({"wait": True}, "deactivate_wait_samples", 0),
        ({"wait": -5}, "deactivate_wait_samples", 0),
        ({"wait": 2.5}, "deactivate_wait_samples", 0),
        ({"rebalance": 1}, "should_rebalance", False),
        ({"update": 42}, "update_after_step", None),
    ],
    ids=[
        "raises",
        "hangs",
        "int-for-bool",
        "str-for-bool",
        "none-for-bool",
        "bool-for-int",
        "negative-wait",
        "float-wait",
        "int-rebalance",
        "update-returns-value",
    ],
)
def test_bad_policy_answers_fall_back_and_training_continues(
    answers: dict[str, Any], method: str, safe: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pol = scripted(**answers)
    observer = DecisionLog()
    with caplog.at_level(logging.WARNING, logger="dynres.runtime.loop.decisions"):
        report, _ = run(pol, cycles=2, observer=observer, policy_timeout_s=0.2)
    assert len(report.cycles) == 2  # training went on
    bad = [
        d for d in [*report.startup_decisions, *(x for c in report.cycles for x in c.decisions)] if d.method == method
    ]
    assert bad and all(d.fallback and d.value == safe and d.reason for d in bad)
    assert report.policy_fallbacks == len(bad)
    assert (method, safe, True) in observer.seen
    assert any(method in r.getMessage() and "scripted" in r.getMessage() for r in caplog.records)
    if method == "should_activate_after_step":
        assert report.operations.activations == 0  # the safe decision: stay standalone-only


def test_numpy_answers_are_accepted() -> None:
    np = pytest.importorskip("numpy")
    pol = scripted(activate=np.bool_(True), wait=np.int64(2))
    # Two cycles: the activation after the first sync (none follows the final one) and the wait.
    report, _ = run(pol, cycles=2)
    assert report.policy_fallbacks == 0 and report.cycles[0].activated
    assert report.cycles[1].deactivate_wait_samples == 2


# ---- wait clamps ----------------------------------------------------------------------------


def test_wait_is_clamped_to_step_required_plus_buffer() -> None:
    cfg = make_cfg(trigger=2, mini=4, staleness=0.5)  # step_required 8, buffer 4
    pol = scripted(wait=10_000)
    report, _ = run(pol, cfg=cfg, cycles=2)
    for c in report.cycles:
        assert c.deactivate_wait_samples == 12
        rec = next(d for d in c.decisions if d.method == "deactivate_wait_samples")
        assert rec.clamped and not rec.fallback and "step_required + buffer" in rec.reason


def test_only_hybrid_waits_for_a_whole_cycle_and_always_activates() -> None:
    cfg = make_cfg(trigger=2, mini=4, staleness=0.5, standalone_nodes=0)
    pol = scripted(wait=0, activate=False)
    report, _cl = run(pol, cfg=cfg, n_standalone=0, n_hybrid=2, cycles=3)
    assert len(report.cycles) == 3
    for c in report.cycles:
        assert c.deactivate_wait_samples == 8
    # Every sync but the run's final one activates (nothing is generated after that one).
    for c in report.cycles[:-1]:
        assert c.activated
        act = next(d for d in c.decisions if d.method == "should_activate_after_step")
        assert act.clamped and act.value is True and "only-hybrid" in act.reason
    assert not report.cycles[-1].activated
    # the wait for a full cycle means no collection had to wait after deactivation
    assert all(sum(c.step_wait_samples) == 0 for c in report.cycles)


def test_only_hybrid_fallback_is_to_activate() -> None:
    cfg = make_cfg(standalone_nodes=0)
    pol = scripted(activate=_boom)
    report, _ = run(pol, cfg=cfg, n_standalone=0, cycles=2)
    # Startup and cycle 1 fall back to activating; after the final sync the policy is not asked.
    assert len(report.cycles) == 2 and report.policy_fallbacks == 2


# ---- staleness, admission, drops ------------------------------------------------------------


def test_admission_never_exceeds_max_required_samples() -> None:
    cfg = make_cfg(trigger=2, mini=4, staleness=0.25, csr=8)
    cl = FakeCluster(3, 2, response_tokens=30)
    spec = RunSpec(
        config=cfg,
        policy=scripted(),
        standalone=cl.standalone,
        hybrid=cl.hybrid,
        train_engine=cl.engine,
        prompts=fake_prompts(),
        num_cycles=4,
        plugin_manager=get_plugin_manager(load_plugins=False),
    )
    limit = max_required_samples(cfg)
    seen: list[int] = []

    async def main() -> RunReport:
        r = FullyAsyncRun(spec)
        task = asyncio.create_task(r.run())
        while not task.done():
            if r.rollouter is not None and r.queue is not None:
                assert r.rollouter.staleness_samples <= limit
                seen.append(r.queue.size + r.rollouter.in_flight)
            await asyncio.sleep(0.001)
        return await task

    report = asyncio.run(main())
    assert max(seen) <= limit and max(seen) >= limit - 2  # production really runs up to the bound
    assert len(report.cycles) == 4


def test_stale_samples_are_dropped_and_replaced() -> None:
    cfg = make_cfg(trigger=2, mini=4, staleness=1.0)
    report, cl = run(scripted(activate=False), cfg=cfg, cycles=4, max_staleness_versions=0)
    s = report.samples
    assert s.dropped_stale > 0
    assert sum(c.samples_dropped_stale for c in report.cycles) <= s.dropped_stale
    assert s.generated == s.consumed + s.dropped_stale + s.queued_at_end
    assert s.duplicates == 0 and len(report.cycles) == 4
    # no consumed sample lagged the trainer: step k belongs to cycle k // trigger
    for k, batch in enumerate(cl.engine.batches):
        assert all(x.start_version >= k // 2 for x in batch)


def test_step_wait_samples_match_the_waits() -> None:
    report, _ = run(scripted(), cycles=3)
    for c in report.cycles:
        assert len(c.step_wait_samples) == len(c.step_wait_times) == 2
        for n, t in zip(c.step_wait_samples, c.step_wait_times, strict=True):
            assert 0 <= n <= 4
            if n > 0:
                assert t > 0  # it really had to wait for generation


def test_rollout_capacity_counts_each_replica_once() -> None:
    lb = LoadBalancer()
    for r in (FakeReplica("s0"), FakeReplica("s1"), FakeReplica("h0", asleep=False)):
        lb.add_replica(r)
    ro = Rollouter(
        balancer=lb,
        queue=MessageQueue(100),
        prompts=[],
        now=lambda: 0.0,
        max_required_samples=100,
        concurrent_samples_per_replica=16,
    )
    assert ro.capacity == 48
    ro.max_required_samples = 20
    assert ro.capacity == 20


def test_without_partial_rollout_aborted_work_restarts() -> None:
    report, _ = run(scripted(), cfg=make_cfg(partial=False), cycles=3)
    assert report.samples.resumed == 0
    assert report.samples.restarted > 0
    assert len(report.cycles) == 3 and report.samples.duplicates == 0


def test_metrics_hook_fires_once_per_cycle() -> None:
    steps: list[int] = []

    class Metrics:
        @hookimpl
        def dynres_metrics_emitted(self, step: int, metrics: dict[str, float]) -> None:
            assert "dynamic_resource/resource_utilization" in metrics
            steps.append(step)

    run(scripted(), cycles=3, observer=Metrics())
    assert steps == [1, 2, 3]


def test_a_policy_that_keeps_hanging_is_no_longer_called() -> None:
    calls: list[int] = []

    def hang() -> bool:
        calls.append(1)
        time.sleep(1.5)
        return True

    pol = scripted(activate=hang, update=lambda: hang() and None)
    report, _ = run(pol, cycles=3, policy_timeout_s=0.05)
    assert len(report.cycles) == 3
    decisions = [*report.startup_decisions, *(d for c in report.cycles for d in c.decisions)]
    hung = [d for d in decisions if d.method in ("should_activate_after_step", "update_after_step")]
    assert hung and all(d.fallback for d in hung)
    # Once the breaker is spent, even a method that would answer at once is not called.
    assert any(d.reason.startswith("not called") for d in decisions if d.method == "admit_extra_samples")
    assert len(calls) == 4  # the breaker stops at max_stuck_calls threads


def test_hybrid_generation_time_counts_in_the_hybrid_rollout_fraction() -> None:
    report, _ = run(scripted(deactivate=False), cycles=2)
    for c in report.cycles:
        assert c.wait_for_enough_samples_s == pytest.approx(c.step_wait_times[0])
