"""The policy's admit_extra_samples: samples a weight version admits beyond its staleness budget."""

from __future__ import annotations

from dynres.core import ScheduleContext
from dynres.policies.default import DefaultPolicy
from dynres.runtime.loop.decisions import DecisionRecord
from dynres.runtime.sim import SimResult, simulate

SHORT = {"steps": 6}
# Staleness 0: each version admits one cycle's samples, and the replicas idle beside its tail.
PRESET = "seed-staleness0-16-16"


class HalfBatchExtra(DefaultPolicy):
    """verl's default, admitting half a cycle's batch beyond the budget at every weight sync."""

    name = "half_batch_extra"

    def admit_extra_samples(self, ctx: ScheduleContext) -> int:
        return ctx.step_required_samples // 2


class Boundless(DefaultPolicy):
    """Asks for far more than a cycle's batch: the guard clamps it to step_required_samples."""

    name = "boundless"

    def admit_extra_samples(self, ctx: ScheduleContext) -> int:
        return 10**9


def _extra_decisions(r: SimResult) -> list[DecisionRecord]:
    return [
        d
        for d in (*r.report.startup_decisions, *(d for c in r.report.cycles for d in c.decisions))
        if d.method == "admit_extra_samples"
    ]


def test_extra_samples_fill_the_tail_and_the_run_finishes_sooner_with_nothing_lost() -> None:
    base = simulate(PRESET, overrides=SHORT)
    extra = simulate(PRESET, policy=HalfBatchExtra, overrides=SHORT)
    assert extra.end_to_end_s < 0.95 * base.end_to_end_s
    # Replicas that would idle beside the tail generate the next cycle's samples instead.
    key = "dynamic_resource/rollout_resource_utilization"
    assert extra.mean_metric(key) > base.mean_metric(key) + 0.05
    # Every admitted sample is trained once, still held, or dropped as too stale; nothing else.
    assert extra.ledger is not None and base.ledger is not None
    assert extra.ledger.problems() == [] and base.ledger.problems() == []
    assert len(extra.ledger.trained) == len(base.ledger.trained)
    # The price: samples staler than staleness 0 allows; those past the queue's limit are dropped.
    assert extra.ledger.dropped and not base.ledger.dropped
    # Asked at start-up and after every weight sync but the run's last, answered as written.
    decisions = _extra_decisions(extra)
    step = extra.scenario.step_required_samples
    assert len(decisions) == len(extra.report.cycles)
    assert all(d.value == step // 2 and not d.clamped and not d.fallback for d in decisions)
    assert all(d.value == 0 for d in _extra_decisions(base))
    # The bound lets the extra samples cross each sync (sim.bound, per_cycle), and the JSON says so.
    assert extra.extra["extra_admitted_samples"] == step // 2 and base.extra["extra_admitted_samples"] == 0
    assert extra.end_to_end_s >= extra.lower_bound_s


def test_more_than_a_cycles_batch_is_clamped_to_it() -> None:
    r = simulate(PRESET, policy=Boundless, overrides=SHORT)
    step = r.scenario.step_required_samples
    decisions = _extra_decisions(r)
    assert decisions and all(d.clamped and d.value == step and "step_required" in d.reason for d in decisions)
    assert r.ledger is not None and r.ledger.problems() == []
    assert r.end_to_end_s >= r.lower_bound_s
