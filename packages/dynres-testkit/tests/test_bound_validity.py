"""No run of a random policy beats the simulator's tight lower bound.

Hypothesis draws a short scenario from the testkit (with staleness, partial rollout, switch costs
and hybrid speed varied, on a shared host or not) and a random policy: every decision is a coin
toss or a random wait, from a seeded generator, so each example is one reproducible run. The slow
test makes 100 such runs, within CI's time budget (200 took 146 s of it).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynres.core import Policy, ScheduleContext
from dynres.runtime.sim import simulate
from dynres.testkit.scenarios import short_scenario, short_scenario_names


class RandomPolicy(Policy):
    """Decides everything at random (seeded): the bound must hold for any schedule."""

    name = "random_for_bound"

    class Params(Policy.Params):
        """The generator's seed."""

        seed: int = 0

    params: Params

    def __init__(self, params: Any = None) -> None:
        """Seed the generator."""
        super().__init__(params)
        self.rng = random.Random(self.params.seed)

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        """Coin toss."""
        return self.rng.random() < 0.8

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        """Any count the runtime accepts."""
        return self.rng.randint(0, ctx.step_required_samples + ctx.buffer_samples)

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Coin toss."""
        return ctx.only_hybrid or self.rng.random() < 0.5

    def should_rebalance(self, ctx: ScheduleContext) -> bool:
        """Coin toss."""
        return self.rng.random() < 0.5

    def admit_extra_samples(self, ctx: ScheduleContext) -> int:
        """None half the time, else any count the runtime accepts (more samples cross each sync)."""
        return 0 if self.rng.random() < 0.5 else self.rng.randint(0, ctx.step_required_samples)


@st.composite
def runs(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """A short testkit scenario with varied knobs, and a policy seed."""
    sc = short_scenario(draw(st.sampled_from(short_scenario_names())))
    at = sc["async_training"]
    at["staleness_threshold"] = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5]))
    at["partial_rollout"] = draw(st.booleans())
    sc["steps"] = draw(st.integers(2, 4))
    sc["seed"] = draw(st.integers(0, 1000))
    scale = draw(st.sampled_from([0.0, 0.5, 1.0, 5.0]))
    sc["costs"] = {k: v * scale for k, v in sc["costs"].items()}
    sc["costs"]["export_weights_s"] = draw(st.sampled_from([0.0, 1.0]))
    sc["workload"]["decode"]["hybrid_speed_factor"] = draw(st.sampled_from([0.1, 0.5, 1.0]))
    sc.setdefault("cluster", {})["shared_host"] = draw(st.booleans())
    return sc, draw(st.integers(0, 2**31 - 1))


def _check(case: tuple[dict[str, Any], int]) -> None:
    scenario, seed = case
    r = simulate(scenario, policy=RandomPolicy({"seed": seed}))
    assert r.end_to_end_s >= r.lower_bound_s, (scenario, seed, r.end_to_end_s, r.bound.terms)


@pytest.mark.slow
@settings(max_examples=100, deadline=None, database=None, derandomize=True)
@given(runs())
def test_100_random_policy_runs_never_beat_the_tight_bound(case: tuple[dict[str, Any], int]) -> None:
    _check(case)
