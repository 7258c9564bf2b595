"""The built-ins are registered through ``dynres.policies`` entry points and load by name."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from policies_helpers import BUILTINS

from dynres.core import AsyncTrainingConfig, BoundPolicy, get_plugin_manager, installed_policies, load_policy
from dynres.core.config import policy_params_from_config
from dynres.core.policy import validate_policy_class
from dynres.policies.default import DefaultPolicy
from dynres.policies.fixed_ratio import FixedRatioPolicy
from dynres.policies.predictive import PredictivePolicy
from dynres.policies.static_fully_async import StaticFullyAsyncPolicy

CLASSES = {
    "default": DefaultPolicy,
    "static_fully_async": StaticFullyAsyncPolicy,
    "fixed_ratio": FixedRatioPolicy,
    "predictive": PredictivePolicy,
}


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_is_registered_by_dynres_policies(name):
    (entry,) = installed_policies()[name]
    assert entry.distribution == "dynres-policies"
    cls = CLASSES[name]
    assert entry.value == f"{cls.__module__}:{cls.__qualname__}"


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_loads_by_name_and_validates(name):
    policy = load_policy(name)
    assert type(policy) is CLASSES[name]
    assert policy.name == name
    assert validate_policy_class(CLASSES[name]) is CLASSES[name]
    BoundPolicy(policy, get_plugin_manager(load_plugins=False))


def test_fixed_ratio_needs_no_import_step():
    # Deliberate difference: the reference never registers fixed_ratio. In a fresh interpreter,
    # loading by name must work without importing dynres.policies first.
    code = textwrap.dedent(
        """
        import sys
        from dynres.core import load_policy
        assert "dynres.policies.fixed_ratio" not in sys.modules
        policy = load_policy("fixed_ratio", {"deactivate_ratio": 0.2})
        assert type(policy).__module__ == "dynres.policies.fixed_ratio", type(policy)
        assert policy.params.deactivate_ratio == 0.2
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize("name", ["default", "fixed_ratio"])
def test_config_ratio_sets_the_starting_ratio(name):
    cfg = AsyncTrainingConfig(dynamic_schedule_policy=name, dynamic_schedule_deactivate_ratio=0.45)
    cls = CLASSES[name]
    policy = load_policy(cfg.dynamic_schedule_policy, policy_params_from_config(cfg, cls.Params))
    assert isinstance(policy, DefaultPolicy | FixedRatioPolicy) and type(policy) is cls
    assert policy.params.deactivate_ratio == 0.45


def test_config_ratio_starts_the_adaptive_ratio():
    cfg = AsyncTrainingConfig(dynamic_schedule_deactivate_ratio=0.45)
    policy = load_policy("default", policy_params_from_config(cfg, DefaultPolicy.Params))
    assert isinstance(policy, DefaultPolicy) and policy.ratio == 0.45


def test_static_takes_no_ratio_from_config():
    cfg = AsyncTrainingConfig(dynamic_schedule_policy="static_fully_async")
    assert policy_params_from_config(cfg, StaticFullyAsyncPolicy.Params) == {}
    load_policy("static_fully_async", policy_params_from_config(cfg, StaticFullyAsyncPolicy.Params))


def test_policy_params_from_config_reach_the_policy():
    cfg = AsyncTrainingConfig(dynamic_schedule_policy_params={"switch_cost_window": 5})
    policy = load_policy("default", policy_params_from_config(cfg, DefaultPolicy.Params))
    assert isinstance(policy, DefaultPolicy)
    assert policy.params.switch_cost_window == 5
    assert policy.params.deactivate_ratio == 0.3
