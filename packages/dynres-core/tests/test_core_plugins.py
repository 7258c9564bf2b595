"""Plugin manager, ``dynres.plugins`` autoloading, and BoundPolicy decisions through the hooks."""

from __future__ import annotations

import sys

import pytest
from core_helpers import make_ctx

from dynres.core import PLUGINS_GROUP, BoundPolicy, Policy, ScheduleContext, get_plugin_manager, hookimpl
from dynres.core.errors import PluginError, PolicyValidationError
from dynres.core.hookspecs import DECISION_HOOKS, OBSERVER_HOOKS, REQUEST_HOOKS
from dynres.core.plugins import DISABLE_AUTOLOAD_ENV, register_plugin

OBSERVER_PLUGIN = """
from dynres.core import hookimpl

SEEN = []


@hookimpl
def dynres_metrics_emitted(step, metrics):
    SEEN.append((step, dict(metrics)))
"""


class Recorder(Policy):
    """Answers fixed values and records what it was asked."""

    name = "recorder"

    def __init__(self, params=None):
        super().__init__(params)
        self.calls: list[str] = []

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        self.calls.append("should_deactivate")
        return False

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        self.calls.append("deactivate_wait_samples")
        return 5

    def deactivate_grace_s(self, ctx: ScheduleContext) -> float:
        self.calls.append("deactivate_grace_s")
        return 2.5

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        self.calls.append("should_activate_after_step")
        return False

    def should_abandon_activation(self, ctx: ScheduleContext) -> bool:
        self.calls.append("should_abandon_activation")
        return True

    def should_rebalance(self, ctx: ScheduleContext) -> bool:
        self.calls.append("should_rebalance")
        return True

    def admit_extra_samples(self, ctx: ScheduleContext) -> int:
        self.calls.append("admit_extra_samples")
        return 3

    def update_after_step(self, ctx: ScheduleContext) -> None:
        self.calls.append("update_after_step")


@pytest.fixture(autouse=True)
def _autoload_on(monkeypatch):
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)


def bound(*plugins: object) -> BoundPolicy:
    pm = get_plugin_manager(load_plugins=False)
    for i, plugin in enumerate(plugins):
        register_plugin(pm, plugin, name=f"test-plugin-{i}")
    return BoundPolicy(Recorder(), pm)


def calls(bp: BoundPolicy) -> list[str]:
    """The decision methods the Recorder behind ``bp`` was asked, in order."""
    assert isinstance(bp.policy, Recorder)
    return bp.policy.calls


def test_group_and_env_names_are_the_contract():
    assert PLUGINS_GROUP == "dynres.plugins"
    assert DISABLE_AUTOLOAD_ENV == "DYNRES_DISABLE_PLUGIN_AUTOLOAD"


def test_manager_has_every_hook_spec():
    pm = get_plugin_manager(load_plugins=False)
    for hook in DECISION_HOOKS + REQUEST_HOOKS + OBSERVER_HOOKS:
        assert getattr(pm.hook, hook).has_spec(), hook


# ---- Autoloading ----------------------------------------------------------------------------


def test_entry_point_plugin_is_autoloaded(make_dist):
    dist = make_dist("acme-observer", modules={"obs": OBSERVER_PLUGIN}, plugins={"acme_obs": "obs"})
    pm = get_plugin_manager()
    assert pm.get_plugin("acme_obs") is sys.modules[dist.module("obs")]
    pm.hook.dynres_metrics_emitted(step=3, metrics={"dynamic_resource/mq_size": 7.0})
    assert sys.modules[dist.module("obs")].SEEN == [(3, {"dynamic_resource/mq_size": 7.0})]


def test_each_call_builds_a_fresh_manager(make_dist):
    make_dist("acme-observer", modules={"obs": OBSERVER_PLUGIN}, plugins={"acme_obs": "obs"})
    first, second = get_plugin_manager(), get_plugin_manager()
    assert first is not second
    BoundPolicy(Recorder(), first)
    assert not any(name and name.startswith("dynres-policy:") for name, _ in second.list_name_plugin())


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_env_var_disables_autoload(make_dist, monkeypatch, value):
    make_dist("acme-observer", modules={"obs": OBSERVER_PLUGIN}, plugins={"acme_obs": "obs"})
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, value)
    assert get_plugin_manager().get_plugin("acme_obs") is None
    # An explicit request still loads.
    assert get_plugin_manager(load_plugins=True).get_plugin("acme_obs") is not None


@pytest.mark.parametrize("value", ["0", "", "no"])
def test_env_var_other_values_keep_autoload(make_dist, monkeypatch, value):
    make_dist("acme-observer", modules={"obs": OBSERVER_PLUGIN}, plugins={"acme_obs": "obs"})
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, value)
    assert get_plugin_manager().get_plugin("acme_obs") is not None


def test_load_plugins_false_skips_entry_points(make_dist):
    make_dist("acme-observer", modules={"obs": OBSERVER_PLUGIN}, plugins={"acme_obs": "obs"})
    assert get_plugin_manager(load_plugins=False).get_plugin("acme_obs") is None


def test_unknown_hook_in_entry_point_plugin_is_named(make_dist):
    source = "from dynres.core import hookimpl\n\n@hookimpl\ndef dynres_metrics_emited(step):\n    pass\n"
    make_dist("acme-typo", modules={"typo": source}, plugins={"acme_typo": "typo"})
    with pytest.raises(PluginError) as info:
        get_plugin_manager()
    msg = str(info.value)
    assert "'acme_typo'" in msg and "'acme-typo'" in msg
    assert "dynres_metrics_emited" in msg
    assert "did you mean 'dynres_metrics_emitted'?" in msg


def test_wrong_argument_name_in_entry_point_plugin_is_named(make_dist):
    source = "from dynres.core import hookimpl\n\n@hookimpl\ndef dynres_should_deactivate(context):\n    return True\n"
    make_dist("acme-args", modules={"args": source}, plugins={"acme_args": "args"})
    with pytest.raises(PluginError) as info:
        get_plugin_manager()
    msg = str(info.value)
    assert "'acme_args'" in msg and "'acme-args'" in msg
    assert "dynres_should_deactivate" in msg and "context" in msg


def test_plugin_import_failure_names_distribution_and_switch(make_dist):
    make_dist("acme-crash", modules={"crash": "raise ImportError('no engine')\n"}, plugins={"acme_crash": "crash"})
    with pytest.raises(PluginError) as info:
        get_plugin_manager()
    msg = str(info.value)
    assert "'acme_crash'" in msg and "'acme-crash'" in msg and "no engine" in msg
    assert DISABLE_AUTOLOAD_ENV in msg


def test_two_distributions_with_one_plugin_name_are_an_error(make_dist):
    make_dist("acme-a", modules={"a": OBSERVER_PLUGIN}, plugins={"same_name": "a"})
    make_dist("acme-b", modules={"b": OBSERVER_PLUGIN}, plugins={"same_name": "b"})
    with pytest.raises(PluginError, match="'same_name'.*could not be registered"):
        get_plugin_manager()


# ---- Registering by hand ----------------------------------------------------------------------


def test_unknown_hook_is_rejected_and_leaves_the_manager_clean():
    class Typo:
        @hookimpl
        def dynres_foo(self, ctx):
            return True

    pm = get_plugin_manager(load_plugins=False)
    plugin = Typo()
    with pytest.raises(PluginError, match="plugin 'typo-plugin' is invalid.*dynres_foo.*dynres.core.hookspecs"):
        register_plugin(pm, plugin, name="typo-plugin")
    assert not pm.is_registered(plugin)
    pm.check_pending()  # nothing half-registered left behind


def test_wrong_argument_name_is_rejected():
    class BadArgs:
        @hookimpl
        def dynres_should_activate_after_step(self, context):
            return True

    pm = get_plugin_manager(load_plugins=False)
    with pytest.raises(PluginError) as info:
        register_plugin(pm, BadArgs(), name="bad-args")
    msg = str(info.value)
    assert "'bad-args'" in msg and "dynres_should_activate_after_step" in msg and "'context'" in msg
    assert "accepts any of: ctx" in msg
    assert "\n" not in msg  # printed as one line by the CLI


def test_subset_of_arguments_is_accepted():
    seen = []

    class Partial:
        @hookimpl
        def dynres_decision_made(self, decision, fallback):
            seen.append((decision, fallback))

    pm = get_plugin_manager(load_plugins=False)
    register_plugin(pm, Partial(), name="partial")
    pm.hook.dynres_decision_made(
        decision="should_deactivate", value=True, ctx=make_ctx(), policy_name="x", fallback=False
    )
    assert seen == [("should_deactivate", False)]


def test_undecorated_dynres_function_is_rejected():
    class Forgot:
        def dynres_should_deactivate(self, ctx):
            return True

    pm = get_plugin_manager(load_plugins=False)
    with pytest.raises(PluginError, match="'forgot'.*'dynres_should_deactivate' without @dynres.core.hookimpl"):
        register_plugin(pm, Forgot(), name="forgot")


def test_same_plugin_name_twice_is_an_error():
    class A:
        @hookimpl
        def dynres_metrics_emitted(self, step):
            pass

    pm = get_plugin_manager(load_plugins=False)
    register_plugin(pm, A(), name="dup")
    with pytest.raises(PluginError, match="'dup'.*could not be registered"):
        register_plugin(pm, A(), name="dup")


# ---- BoundPolicy: decisions through the hooks --------------------------------------------------


def test_without_plugins_the_policy_answers():
    bp = bound()
    ctx = make_ctx()
    assert bp.name == "recorder"
    assert bp.should_deactivate(ctx) is False
    assert bp.deactivate_wait_samples(ctx) == 5
    assert bp.deactivate_grace_s(ctx) == 2.5
    assert bp.should_activate_after_step(ctx) is False
    assert bp.should_abandon_activation(ctx) is True
    assert bp.should_rebalance(ctx) is True
    assert bp.admit_extra_samples(ctx) == 3
    assert bp.update_after_step(ctx) is None
    assert calls(bp) == [h.removeprefix("dynres_") for h in DECISION_HOOKS]


def test_an_optional_decision_is_asked_only_when_written_or_hooked():
    class Plain(Policy):
        name = "plain"

        def should_deactivate(self, ctx):
            return True

        def deactivate_wait_samples(self, ctx):
            return 0

        def should_activate_after_step(self, ctx):
            return True

    assert bound().decides("should_abandon_activation")  # Recorder writes it
    plain = BoundPolicy(Plain(), get_plugin_manager(load_plugins=False))
    assert not plain.decides("should_abandon_activation") and not plain.decides_requests

    class GiveUp:
        @hookimpl
        def dynres_should_abandon_activation(self, ctx):
            return True

    register_plugin(plain.pm, GiveUp(), name="give-up")
    assert plain.decides("should_abandon_activation") and not plain.decides("should_rebalance")
    assert plain.should_abandon_activation(make_ctx()) is True


@pytest.mark.parametrize("method", [h.removeprefix("dynres_") for h in DECISION_HOOKS])
def test_decision_dispatches_by_method_name(method):
    bp = bound()
    bp.decision(method, make_ctx())
    assert calls(bp) == [method]


def test_firstresult_plugin_overrides_the_policy():
    class Override:
        @hookimpl
        def dynres_deactivate_wait_samples(self, ctx):
            return 99

        @hookimpl
        def dynres_should_activate_after_step(self, ctx):
            return True

    bp = bound(Override())
    ctx = make_ctx()
    assert bp.deactivate_wait_samples(ctx) == 99
    assert bp.should_activate_after_step(ctx) is True
    # The policy was never asked: the first non-None result ends the chain.
    assert "deactivate_wait_samples" not in calls(bp)
    assert bp.should_deactivate(ctx) is False  # hooks the plugin leaves alone reach the policy


def test_plugin_returning_none_defers_to_the_policy():
    class Abstain:
        @hookimpl
        def dynres_deactivate_wait_samples(self, ctx):
            return None

    bp = bound(Abstain())
    assert bp.deactivate_wait_samples(make_ctx()) == 5
    assert calls(bp) == ["deactivate_wait_samples"]


def test_wrapper_observes_and_overrides_the_policy_answer():
    observed = []

    class Wrapper:
        @hookimpl(wrapper=True)
        def dynres_deactivate_wait_samples(self, ctx):
            answer = yield
            observed.append(answer)
            return answer * 2 if ctx.queue_size == 0 else answer

    bp = bound(Wrapper())
    assert bp.deactivate_wait_samples(make_ctx(queue_size=0)) == 10
    assert bp.deactivate_wait_samples(make_ctx(queue_size=1)) == 5
    assert observed == [5, 5]


def test_wrapper_can_flip_a_bool_decision():
    class Flip:
        @hookimpl(wrapper=True)
        def dynres_should_deactivate(self, ctx):
            return not (yield)

    assert bound(Flip()).should_deactivate(make_ctx()) is True


def test_wrapper_sees_the_policy_raise():
    class Boom(Recorder):
        name = "boom"

        def should_deactivate(self, ctx):
            raise RuntimeError("policy bug")

    caught = []

    class Guard:
        @hookimpl(wrapper=True)
        def dynres_should_deactivate(self, ctx):
            try:
                return (yield)
            except RuntimeError as exc:
                caught.append(str(exc))
                return False

    pm = get_plugin_manager(load_plugins=False)
    register_plugin(pm, Guard(), name="guard")
    assert BoundPolicy(Boom(), pm).should_deactivate(make_ctx()) is False
    assert caught == ["policy bug"]


def test_policy_with_unknown_dynres_method_is_rejected():
    class Sneaky(Recorder):
        name = "sneaky"

        def dynres_foo(self, ctx):
            return True

    with pytest.raises(PolicyValidationError, match="'dynres_foo', which is not a dynres hook"):
        BoundPolicy(Sneaky(), get_plugin_manager(load_plugins=False))


def test_one_policy_per_manager():
    pm = get_plugin_manager(load_plugins=False)
    BoundPolicy(Recorder(), pm)
    with pytest.raises(PluginError, match="already carries 'dynres-policy:recorder'.*get_plugin_manager"):
        BoundPolicy(Recorder(), pm)


def test_default_manager_autoloads_plugins(make_dist):
    source = """
from dynres.core import hookimpl


@hookimpl
def dynres_should_rebalance(ctx):
    return False
"""
    make_dist("acme-norebalance", modules={"m": source}, plugins={"acme_norebalance": "m"})
    assert BoundPolicy(Recorder()).should_rebalance(make_ctx()) is False


def test_update_after_step_runs_every_implementation():
    """A plugin answering the update hook must not stop the policy from adapting."""

    class Chatty:
        @hookimpl
        def dynres_update_after_step(self, ctx):
            return "observed"

    bp = bound(Chatty())
    # The stray value is surfaced so the runtime can report it, and the policy still updated.
    assert bp.update_after_step(make_ctx()) == "observed"
    assert calls(bp) == ["update_after_step"]
