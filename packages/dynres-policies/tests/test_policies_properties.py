"""Properties every built-in policy keeps over random valid contexts and params (hypothesis)."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policies_helpers import BUILTINS, ReferenceDefault, contexts, params_for, runs

from dynres.core import CYCLE_METHODS, Policy, ScheduleContext, load_policy
from dynres.policies.default import DefaultPolicy

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

DECISIONS = ("should_deactivate", "deactivate_wait_samples", "should_activate_after_step", "should_rebalance")


def run_cycle(policy: Policy, ctx: ScheduleContext) -> tuple:
    """Every method once, in the controller's order; returns the answers."""
    return tuple(getattr(policy, m)(ctx) for m in CYCLE_METHODS)


@st.composite
def policy_and_history(draw: st.DrawFn, name: str) -> tuple[Policy, list[ScheduleContext]]:
    only_hybrid = draw(st.one_of(st.none(), st.booleans()))
    policy = load_policy(name, draw(params_for(name)))
    history = draw(st.lists(contexts(only_hybrid=only_hybrid), min_size=1, max_size=6))
    return policy, history


@pytest.mark.parametrize("name", BUILTINS)
@SETTINGS
@given(data=st.data())
def test_cycle_contract(name, data):
    """Right types (an int wait, not a bool), no negative wait, no exception, repeatable and
    side-effect-free decisions, and the context left as it was."""
    policy, history = data.draw(policy_and_history(name))
    for ctx in history:
        dumped, state = ctx.model_dump(), policy.state_dict()
        first = [getattr(policy, m)(ctx) for m in DECISIONS]
        deact, wait, activate, rebalance = first
        assert type(deact) is bool
        assert type(wait) is int
        assert wait >= 0
        assert type(activate) is bool
        assert type(rebalance) is bool
        assert [getattr(policy, m)(ctx) for m in DECISIONS] == first
        assert policy.state_dict() == state
        assert policy.update_after_step(ctx) is None
        assert ctx.model_dump() == dumped


@pytest.mark.parametrize("name", BUILTINS)
@SETTINGS
@given(data=st.data())
def test_deterministic_for_the_same_state_and_context(name, data):
    policy, history = data.draw(policy_and_history(name))
    for ctx in history[:-1]:
        run_cycle(policy, ctx)
    twin = copy.deepcopy(policy)
    for ctx in history[-2:]:
        assert run_cycle(twin, ctx) == run_cycle(policy, ctx)
        assert twin.state_dict() == policy.state_dict()


@pytest.mark.parametrize("name", BUILTINS)
@SETTINGS
@given(data=st.data())
def test_state_round_trip_gives_identical_decisions(name, data):
    policy, history = data.draw(policy_and_history(name))
    split = data.draw(st.integers(0, len(history)))
    for ctx in history[:split]:
        run_cycle(policy, ctx)
    saved = json.loads(json.dumps(policy.state_dict(), allow_nan=False))
    resumed = load_policy(name, policy.params)
    resumed.load_state_dict(saved)
    assert vars(resumed) == vars(policy)  # state_dict() carried everything the policy adapted
    for ctx in history[split:]:
        assert run_cycle(resumed, ctx) == run_cycle(policy, ctx)
    assert resumed.state_dict() == policy.state_dict()


@pytest.mark.parametrize("name", BUILTINS)
@SETTINGS
@given(ctx=contexts(only_hybrid=True))
def test_only_hybrid_clusters_always_activate(name, ctx):
    assert load_policy(name).should_activate_after_step(ctx) is True


@SETTINGS
@given(data=st.data())
def test_default_ratio_stays_within_its_bounds(data):
    policy, history = data.draw(policy_and_history("default"))
    assert isinstance(policy, DefaultPolicy)
    for ctx in history:
        run_cycle(policy, ctx)
        assert policy.params.min_ratio <= policy.ratio <= 1.0
        assert policy.per_sample_time_s > 0


# ---- Parity with the reference algorithm -----------------------------------------------------


PARITY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_same_cycle(ours: DefaultPolicy, reference: ReferenceDefault, ctx: ScheduleContext) -> None:
    assert ours.should_deactivate(ctx) == reference.should_deactivate(ctx)
    assert ours.deactivate_wait_samples(ctx) == reference.deactivate_wait_samples(ctx)
    assert ours.should_activate_after_step(ctx) == reference.should_activate_after_step(ctx)
    ours.update_after_step(ctx)
    reference.update_after_step(ctx)


def assert_same_state(ours: DefaultPolicy, reference: ReferenceDefault) -> None:
    assert ours.ratio == reference.ratio
    assert ours.per_sample_time_s == reference.per_sample_time_s
    recent = reference.switch_costs[-3:]
    assert ours.switch_cost() == (sum(recent) / len(recent) if recent else 10.0)


@PARITY
@given(history=runs(), start=st.sampled_from([0.3, 0.0, 0.05, 0.5, 1.0]))
def test_default_matches_the_reference_while_its_ratio_is_not_negative(history, start):
    ours, reference = DefaultPolicy({"deactivate_ratio": start}), ReferenceDefault(start)
    for ctx in history:
        assert_same_cycle(ours, reference, ctx)
        if reference.ratio < 0:
            # From here on the reference is in the regime dynres fixes (ratio floor at 0).
            assert ours.ratio == 0.0
            return
        assert_same_state(ours, reference)


@PARITY
@given(history=runs(), start=st.sampled_from([0.3, 0.0, 0.05, 0.5, 1.0]))
def test_default_is_the_reference_plus_a_floor_over_whole_runs(history, start):
    ours, reference = DefaultPolicy({"deactivate_ratio": start}), ReferenceDefault(start, floor=True)
    for ctx in history:
        assert_same_cycle(ours, reference, ctx)
        assert_same_state(ours, reference)
