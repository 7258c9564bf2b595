"""dynres policies inside verl: registration on ``import verl``, params, contexts, safety."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from dynres.core import ScheduleContext, installed_policies
from dynres.core.errors import ConfigError, PolicyParamsError
from dynres.verl import adapter
from dynres.verl._verl import registry, schedule_module
from dynres.verl.params import PARAMS_ENV
from dynres.verl.registration import register_dynres_policies


def verl_ctx(**kw):
    fields = dict(required_samples=10, trigger_parameter_sync_step=2, total_generated_samples=0, expected_samples=0)
    fields.update(kw)
    fields.setdefault("buffer_samples", 0)
    return schedule_module().DynamicScheduleContext(**fields)


def test_every_installed_dynres_policy_is_in_verls_registry_next_to_verls_own():
    reg = registry()
    for name in installed_policies():
        assert f"dynres:{name}" in reg
        assert issubclass(reg[f"dynres:{name}"], schedule_module().DynamicSchedulePolicyBase)
    assert reg["default"].__module__.startswith("verl.")  # verl's own default is untouched


def test_build_policy_maps_verls_kwargs():
    build = schedule_module().build_policy
    pol = build("dynres:default", deactivate_ratio=0.6, only_hybrid=False)
    assert pol.policy.name == "default" and pol.policy.params.deactivate_ratio == 0.6
    assert pol.should_deactivate(1, True, verl_ctx()) is True
    assert pol.deactivate_wait_samples(verl_ctx()) == 12  # int(20 x 0.6)
    static = build("dynres:static_fully_async", deactivate_ratio=0.6, only_hybrid=False)
    assert static.policy.params.model_dump() == {}  # no deactivate_ratio field: not passed


def test_params_from_the_environment_win_over_verls_ratio(monkeypatch, tmp_path):
    build = schedule_module().build_policy
    monkeypatch.setenv(PARAMS_ENV, '{"min_ratio": 0.1, "deactivate_ratio": 0.4}')
    assert build("dynres:default", deactivate_ratio=0.6).policy.params.deactivate_ratio == 0.4
    path = tmp_path / "params.yaml"
    path.write_text("switch_cost_window: 5\n")
    monkeypatch.setenv(PARAMS_ENV, str(path))
    params = build("dynres:default", deactivate_ratio=0.6).policy.params
    assert (params.switch_cost_window, params.deactivate_ratio) == (5, 0.6)


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        ('{"min_ratoi": 0.1}', PolicyParamsError, ["min_ratoi", "min_ratio"]),
        ('{"switch_cost_window": 0}', PolicyParamsError, ["switch_cost_window"]),
        ("{not: [valid", ConfigError, [PARAMS_ENV, "invalid inline"]),
        ("/nowhere/params.yaml", ConfigError, [PARAMS_ENV, "no such file"]),
        ("[1, 2]", ConfigError, [PARAMS_ENV, "mapping"]),
    ],
)
def test_bad_params_are_one_line_errors(monkeypatch, value, error, words):
    monkeypatch.setenv(PARAMS_ENV, value)
    with pytest.raises(error) as info:
        schedule_module().build_policy("dynres:default", deactivate_ratio=0.3)
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_verls_context_becomes_a_schedule_context(monkeypatch):
    seen: list[ScheduleContext] = []
    pol = schedule_module().build_policy("dynres:default", deactivate_ratio=0.3, only_hybrid=False)

    def activate(ctx: ScheduleContext) -> bool:
        seen.append(ctx)
        return True

    monkeypatch.setattr(pol.policy, "should_activate_after_step", activate)
    ctx = verl_ctx(
        total_generated_samples=50,
        expected_samples=40,
        buffer_samples=10.0,
        step_wait_times=[1.5, 0.5],
        step_wait_samples=[3, 1],
        last_activate_duration_s=2.0,
        last_deactivate_duration_s=3.0,
    )
    assert pol.should_activate_after_step(2, False, ctx) is True
    (s,) = seen
    assert (s.global_steps, s.required_samples, s.trigger_parameter_sync_step) == (2, 10, 2)
    assert (s.total_generated_samples, s.expected_samples, s.surplus_samples) == (50, 40, 10)
    assert (s.staleness_threshold, s.buffer_samples) == (0.5, 10)
    assert (s.step_wait_times, s.step_wait_samples) == ((1.5, 0.5), (3, 1))
    # At this call verl's own activation time can only be 0 (the cycle's activation comes after it):
    # the context carries the activation of the latest update, none yet here.
    assert (s.last_activate_duration_s, s.last_deactivate_duration_s) == (0.0, 3.0)
    assert (s.num_standalone_replicas, s.num_hybrid_replicas, s.only_hybrid) == (1, 1, False)
    assert (s.queue_size, s.in_flight_samples, s.consumption_rate) == (0, 0, 0.0)  # unknown to verl


def test_only_hybrid_clamps_like_the_dynres_runtime(monkeypatch):
    pol = schedule_module().build_policy("dynres:fixed_ratio", deactivate_ratio=0.3, only_hybrid=True)
    monkeypatch.setattr(pol.policy, "deactivate_wait_samples", lambda ctx: 0)
    monkeypatch.setattr(pol.policy, "should_activate_after_step", lambda ctx: False)
    assert pol.should_deactivate(3, True, verl_ctx()) is True
    assert pol.deactivate_wait_samples(verl_ctx()) == 20  # a whole cycle: nothing else generates
    assert pol.should_activate_after_step(3, False, verl_ctx()) is True
    monkeypatch.setattr(pol.policy, "deactivate_wait_samples", lambda ctx: 10**6)
    assert pol.deactivate_wait_samples(verl_ctx(buffer_samples=5.0)) == 25  # step_required + buffer


def test_observers_and_logs_see_the_value_verl_acts_on(monkeypatch, caplog):
    from dynres.core import hookimpl

    seen = []

    class Observer:
        @hookimpl
        def dynres_decision_made(self, decision, value, ctx, policy_name, fallback):
            seen.append((decision, value, fallback))

    pol = schedule_module().build_policy("dynres:fixed_ratio", deactivate_ratio=0.3, only_hybrid=True)
    pol.guard.policy.pm.register(Observer())
    monkeypatch.setattr(pol.policy, "deactivate_wait_samples", lambda ctx: -1)
    with caplog.at_level(logging.INFO, logger="dynres.verl"):
        assert pol.deactivate_wait_samples(verl_ctx()) == 20
    # the hook carries what verl acts on: the safe 0, clamped to a whole cycle in only-hybrid
    assert seen == [("deactivate_wait_samples", 20, True)]
    warning, clamp = (r.getMessage() for r in caplog.records if r.name == "dynres.verl")
    assert warning.startswith("dynres policy 'fixed_ratio' deactivate_wait_samples at global_steps=0")
    assert warning.endswith("using the safe value 0, verl continues")
    assert clamp.startswith("dynres policy 'fixed_ratio' deactivate_wait_samples: 0 clamped to 20: only-hybrid")


@pytest.mark.parametrize(
    ("method", "answer", "safe"),
    [
        ("should_deactivate", "yes", True),
        ("deactivate_wait_samples", -3, 0),
        ("deactivate_wait_samples", 2.5, 0),
        ("should_activate_after_step", None, False),
    ],
)
def test_wrong_answers_fall_back_to_the_safe_value(monkeypatch, caplog, method, answer, safe):
    pol = schedule_module().build_policy("dynres:default", deactivate_ratio=0.3)
    monkeypatch.setattr(pol.policy, method, lambda ctx: answer)
    args = {"deactivate_wait_samples": (verl_ctx(),)}.get(method, (1, True, verl_ctx()))
    if method == "deactivate_wait_samples":
        pol.should_deactivate(1, True, verl_ctx())  # verl asks for the wait right after this
    before = pol.guard.fallbacks
    assert getattr(pol, method)(*args) == safe
    assert pol.guard.fallbacks == before + 1
    assert any(method in r.getMessage() and "safe value" in r.getMessage() for r in caplog.records)


def test_rebalance_asks_verls_rollouter_only_when_the_policy_agrees(monkeypatch):
    asked = []

    class Rollouter:
        class rebalance_requests:
            @staticmethod
            def remote():
                asked.append(1)
                return {"cleared_entries": 3}

        class get_standalone_replicas:
            @staticmethod
            def remote():
                return [1, 2, 3]

        class get_all_hybrid_replicas:
            @staticmethod
            def remote():
                return {"a": 1, "b": 2}

    build = schedule_module().build_policy
    pol = build("dynres:default", deactivate_ratio=0.3)
    pol._rollouter = Rollouter()
    pol.request_rebalance(1, verl_ctx())
    assert asked == [1] and pol.rebalances == 1
    assert (pol.reader.num_standalone_replicas, pol.reader.num_hybrid_replicas) == (3, 2)
    static = build("dynres:static_fully_async", deactivate_ratio=0.3)
    static._rollouter = Rollouter()
    static.request_rebalance(1, verl_ctx())
    assert asked == [1]  # static_fully_async never rebalances


def test_a_hung_policy_is_not_called_again_once_calls_pile_up(monkeypatch):
    import threading

    release = threading.Event()
    pol = schedule_module().build_policy("dynres:default", deactivate_ratio=0.3)
    pol.guard.timeout_s = 0.05
    calls = []

    def hang(ctx: ScheduleContext) -> bool:
        calls.append(1)
        return release.wait()

    monkeypatch.setattr(pol.policy, "should_activate_after_step", hang)
    try:
        answers = [pol.should_activate_after_step(1, False, verl_ctx()) for _ in range(6)]
    finally:
        release.set()
    assert answers == [False] * 6
    assert len(calls) == pol.guard.max_stuck_calls  # the last two fell back without a call


def test_a_policy_that_fails_to_import_is_skipped(monkeypatch, caplog):
    from dynres.core.loading import PolicyEntry

    bad = PolicyEntry("broken", "no_such_module_xyz:Policy", "broken-dist", "0.1")
    good = installed_policies()
    monkeypatch.setattr("dynres.core.loading.installed_policies", lambda: {**good, "broken": (bad,)})
    before = dict(registry())
    try:
        added = register_dynres_policies()
    finally:
        registry().clear()
        registry().update(before)
    assert "dynres:broken" not in added and "dynres:default" in added
    assert any("'broken' skipped" in r.getMessage() and "broken-dist" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_import_verl_survives_a_broken_dynres_policy_in_a_fresh_interpreter(tmp_path):
    # A distribution whose dynres policy raises on import, installed next to dynres-verl.
    dist = tmp_path / "broken_policy-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-policy\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[dynres.policies]\nbroken = broken_policy:Policy\n")
    (tmp_path / "broken_policy.py").write_text("raise RuntimeError('this policy cannot import')\n")
    code = textwrap.dedent(
        """
        import json, verl
        from verl.experimental.fully_async_policy.dynamic_schedule import base
        print(json.dumps(sorted(base._policy_registry)))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    names = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "dynres:default" in names and "default" in names and "dynres:broken" not in names
    assert "'broken' skipped" in proc.stderr and "cannot import" in proc.stderr


def test_adapter_timeout_is_bounded():
    assert 0 < adapter.DECISION_TIMEOUT_S <= 60
