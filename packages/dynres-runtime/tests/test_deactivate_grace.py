"""The policy's deactivate_grace_s: the hybrids' running requests may finish before the abort."""

from __future__ import annotations

from dynres.core import ScheduleContext
from dynres.policies.default import DefaultPolicy
from dynres.runtime.sim import simulate

SHORT = {"steps": 5}
PRESET = "seed-dynamic-16-16"


class Graceful(DefaultPolicy):
    """verl's default, letting the hybrids' tail run for up to ``GRACE`` seconds at each deactivation."""

    name = "graceful"
    GRACE = 60.0

    def deactivate_grace_s(self, ctx: ScheduleContext) -> float:
        return self.GRACE


class Forever(Graceful):
    """Asks for a grace far beyond a cycle: the guard clamps it to the latest cycle's length."""

    name = "forever"
    GRACE = 1e9


def test_a_grace_lets_running_requests_finish_instead_of_being_aborted() -> None:
    base = simulate(PRESET, overrides=SHORT)
    graceful = simulate(PRESET, policy=Graceful, overrides=SHORT)
    finished = sum(c.grace_finished_requests for c in graceful.report.cycles)
    assert finished > 0 and all(c.grace_finished_requests == 0 for c in base.report.cycles)
    # Each request that finished in the grace is one abort (and one resume elsewhere) fewer.
    assert graceful.report.samples.aborted < base.report.samples.aborted
    assert graceful.report.samples.duplicates == 0 and graceful.report.samples.failed == 0
    # The grace is part of the deactivation, which takes longer.
    deact = [c.deactivate_duration_s for c in graceful.report.cycles if c.deactivated]
    base_deact = [c.deactivate_duration_s for c in base.report.cycles if c.deactivated]
    assert sum(deact) > sum(base_deact)
    graces = [d for c in graceful.report.cycles for d in c.decisions if d.method == "deactivate_grace_s"]
    assert graces and all(d.value == Graceful.GRACE or d.clamped for d in graces)


def test_a_grace_beyond_the_latest_cycle_is_clamped_to_it() -> None:
    r = simulate(PRESET, policy=Forever, overrides=SHORT)
    graces = [d for c in r.report.cycles for d in c.decisions if d.method == "deactivate_grace_s"]
    assert graces and all(d.clamped and d.value < 1e9 and "last_cycle_time_s" in d.reason for d in graces)
    longest = max(c.duration_s for c in r.report.cycles)
    assert all(c.deactivate_duration_s < longest for c in r.report.cycles)  # no deactivation waited 1e9 s
