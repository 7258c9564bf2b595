"""Tests of the example policy: its own behaviour, then the dynres conformance suite."""

from __future__ import annotations

import pytest
from dynres_policy_example import ExamplePolicy

from dynres.core.errors import PolicyParamsError
from dynres.testkit.checks import parametrize_with_checks
from dynres.testkit.strategies import sample_context


def test_waits_for_the_floor():
    ctx = sample_context(required_samples=32, trigger_parameter_sync_step=4)  # 128 per cycle
    assert ExamplePolicy().deactivate_wait_samples(ctx) == 64
    assert ExamplePolicy({"floor": 0.25}).deactivate_wait_samples(ctx) == 32


def test_activates_below_the_floor_only():
    behind = sample_context(queue_size=10, is_hybrid_active=False)  # surplus 10 < 64
    ahead = sample_context(queue_size=100, is_hybrid_active=False)  # surplus 100 >= 64
    assert ExamplePolicy().should_activate_after_step(behind) is True
    assert ExamplePolicy().should_activate_after_step(ahead) is False


def test_always_activates_without_standalone_replicas():
    ctx = sample_context(num_standalone_replicas=0, queue_size=500, is_hybrid_active=False)
    assert ExamplePolicy().should_activate_after_step(ctx) is True


def test_params_are_validated():
    with pytest.raises(PolicyParamsError, match="floor"):
        ExamplePolicy({"floor": 1.5})
    with pytest.raises(PolicyParamsError, match="did you mean 'floor'"):
        ExamplePolicy({"flor": 0.5})


# The whole conformance suite, for the defaults and for a tuned instance.
@parametrize_with_checks([ExamplePolicy, ExamplePolicy({"floor": 0.2, "rebalance": False})])
def test_conformance(policy, check):
    check(policy)
