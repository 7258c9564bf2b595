"""verl's policies inside dynres: ``verl:<name>`` wraps verl's registered class as a dynres Policy."""

from __future__ import annotations

import json
import pickle

import pytest

from dynres.core import ScheduleContext
from dynres.core.errors import PolicyNotFoundError
from dynres.verl.hooks import dynres_resolve_policy
from dynres.verl.wrapper import VerlPolicy, dynres_wrapper_class


def ctx(**kw) -> ScheduleContext:
    fields = dict(required_samples=10, trigger_parameter_sync_step=2, num_standalone_replicas=2, num_hybrid_replicas=2)
    fields.update(kw)
    return ScheduleContext(**fields)


def test_the_hook_answers_verl_names_only():
    cls = dynres_resolve_policy(name="verl:default")
    assert cls is not None and issubclass(cls, VerlPolicy)
    assert cls.name == "verl_default" and cls.verl_name == "default"
    assert dynres_resolve_policy(name="default") is None
    assert dynres_resolve_policy(name="pkg.mod:Cls") is None


def test_unknown_verl_names_list_verls_policies():
    with pytest.raises(PolicyNotFoundError, match=r"verl has no dynamic-schedule policy 'defualt'.*'default'"):
        dynres_wrapper_class("defualt")
    with pytest.raises(PolicyNotFoundError, match="name it directly as 'default'"):
        dynres_wrapper_class("dynres:default")


def test_fixed_ratio_is_found_although_verl_never_registers_it():
    assert dynres_wrapper_class("fixed_ratio").verl_name == "fixed_ratio"


def test_verls_default_decides_through_the_wrapper(capsys):
    pol = dynres_wrapper_class("default")({"deactivate_ratio": 0.5})
    assert pol.should_activate_after_step(ctx(global_steps=0)) is True  # gap 10 x 1000 s > 10 s
    assert pol.verl_policy.deactivate_ratio == 0.5 and pol.verl_policy.only_hybrid is False
    pol.update_after_step(ctx(global_steps=0))
    active = ctx(global_steps=1, is_hybrid_active=True, now=5.0, num_active_replicas=4)
    assert pol.should_rebalance(active) is True
    assert pol.rollouter.calls == ["rebalance_requests"]
    assert pol.should_deactivate(active) is True
    assert pol.deactivate_wait_samples(active) == 10
    assert capsys.readouterr().out == ""  # verl's prints went to the log, not to stdout


def test_verls_static_never_rebalances_nor_activates():
    pol = dynres_wrapper_class("static_fully_async")()
    assert pol.should_activate_after_step(ctx(global_steps=1)) is False
    assert pol.should_rebalance(ctx(global_steps=1, is_hybrid_active=True, now=1.0)) is False
    assert pol.rollouter.calls == []
    only_hybrid = ctx(global_steps=1, num_standalone_replicas=0)
    assert dynres_wrapper_class("static_fully_async")().should_activate_after_step(only_hybrid) is False


def test_switch_times_reach_verl_once_per_switch():
    # The runtime keeps reporting the latest durations; verl must see each switch once, as its
    # own trainer accumulates and resets them per cycle.
    pol = dynres_wrapper_class("default")()
    pol.should_activate_after_step(ctx(global_steps=0, now=0.0))
    pol.update_after_step(ctx(global_steps=0, now=0.0))
    lent = dict(is_hybrid_active=True, num_active_replicas=4, last_activate_duration_s=2.0)
    pol.should_deactivate(ctx(global_steps=0, now=1.0, **lent))  # activation of 2 s seen
    back = dict(last_activate_duration_s=2.0, last_deactivate_duration_s=3.0)
    pol.should_activate_after_step(ctx(global_steps=1, now=9.0, total_generated_samples=100, **back))
    pol.update_after_step(ctx(global_steps=1, now=9.0, total_generated_samples=100, **back))
    assert pol.verl_policy._recent_switch_overheads == [5.0]
    for step in (2, 3):  # no switches: the same stale durations must not be counted again
        quiet = ctx(global_steps=step, now=10.0 * step, total_generated_samples=100 * step, **back)
        pol.should_activate_after_step(quiet)
        pol.update_after_step(quiet)
    assert pol.verl_policy._recent_switch_overheads == [5.0]


def test_state_survives_json_and_pickle():
    pol = dynres_wrapper_class("default")()
    waited = ctx(global_steps=1, step_wait_times=(4.0, 2.0), step_wait_samples=(3, 1))
    pol.should_activate_after_step(waited)
    pol.update_after_step(waited)
    state = json.loads(json.dumps(pol.state_dict()))
    assert state["verl"]["_last_per_sample_time"] == 1.5 and state["verl"]["deactivate_ratio"] == pytest.approx(
        0.4
    )  # +clip(4/20, 0.02, 0.1)
    fresh = dynres_wrapper_class("default")()
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    probe = ctx(global_steps=2, total_generated_samples=17, expected_samples=20)
    clone = pickle.loads(pickle.dumps(pol))
    answers = {p.should_activate_after_step(probe) for p in (pol, fresh, clone)}
    assert len(answers) == 1
    assert clone.state_dict() == pol.state_dict()
