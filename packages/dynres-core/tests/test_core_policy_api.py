"""The Policy base class and validate_policy_class."""

from __future__ import annotations

import pytest
from core_helpers import make_ctx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dynres.core import CYCLE_METHODS, POLICY_METHODS, TAIL_METHODS, Policy, ScheduleContext
from dynres.core.errors import PolicyParamsError, PolicyValidationError
from dynres.core.hookspecs import DECISION_HOOKS
from dynres.core.policy import REQUIRED_METHODS, validate_policy_class


class Floor(Policy):
    """A minimal valid policy used throughout these tests."""

    name = "floor"

    class Params(Policy.Params):
        floor: float = Field(0.5, ge=0.0, le=1.0)
        window: int = Field(3, ge=1)

    params: Params

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        return ctx.is_hybrid_active

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        return int(self.params.floor * ctx.step_required_samples)

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        return ctx.surplus_samples < self.params.floor * ctx.step_required_samples


def test_method_order_matches_the_decision_hooks():
    assert tuple(h.removeprefix("dynres_") for h in DECISION_HOOKS) == CYCLE_METHODS
    assert set(POLICY_METHODS) | set(TAIL_METHODS) == set(CYCLE_METHODS)
    assert set(REQUIRED_METHODS) < set(POLICY_METHODS)


def test_base_class_supplies_rebalance_update_and_state():
    p = Floor()
    ctx = make_ctx(is_hybrid_active=True)
    assert p.should_rebalance(ctx) is False
    p.update_after_step(ctx)  # a no-op (its None return is the signature's)
    assert p.state_dict() == {}
    p.load_state_dict({})
    assert p.deactivate_wait_samples(ctx) == 16
    assert "floor" in repr(p) and "0.5" in repr(p)


def test_stateless_policy_rejects_state():
    with pytest.raises(PolicyValidationError, match="'floor' keeps no state.*\\['ratio'\\]"):
        Floor().load_state_dict({"ratio": 0.3})


def test_validate_policy_class_accepts_a_good_class():
    assert validate_policy_class(Floor) is Floor


# ---- Params ---------------------------------------------------------------------------------


def test_params_default_mapping_and_instance():
    assert Floor().params == Floor.Params()
    assert Floor({"floor": 0.25}).params.floor == 0.25
    given = Floor.Params(floor=0.75)
    assert Floor(given).params is given


def test_params_from_another_model_are_revalidated():
    class Other(BaseModel):
        floor: float = 0.1

    assert Floor(Other()).params.floor == 0.1


def test_params_are_frozen():
    with pytest.raises(ValidationError):
        Floor().params.floor = 0.9  # type: ignore[misc]  # the wrong type is the point of the test


def test_params_typo_names_the_field_and_suggests():
    with pytest.raises(PolicyParamsError) as info:
        Floor({"flor": 0.5})
    msg = str(info.value)
    assert "policy 'floor'" in msg
    assert "unknown param 'flor' (did you mean 'floor'?)" in msg
    assert "valid params: floor, window" in msg


def test_params_out_of_range_names_the_field_and_value():
    with pytest.raises(PolicyParamsError, match=r"param 'floor': .*less than or equal to 1.*got 2"):
        Floor({"floor": 2})
    with pytest.raises(PolicyParamsError, match=r"param 'window'"):
        Floor({"window": 0})


def test_params_of_the_wrong_kind():
    with pytest.raises(PolicyParamsError, match="params must be a mapping or Floor.Params, not list"):
        Floor([("floor", 0.5)])  # type: ignore[arg-type]  # the wrong type is the point of the test


# ---- Class validation -----------------------------------------------------------------------


def _policy(name: str = "probe", **methods: object) -> type:
    body: dict[str, object] = {
        "name": name,
        "should_deactivate": lambda self, ctx: False,
        "deactivate_wait_samples": lambda self, ctx: 0,
        "should_activate_after_step": lambda self, ctx: False,
    }
    body.update(methods)
    return type("Probe", (Policy,), body)


def test_not_a_policy_subclass():
    class Lookalike:
        name = "lookalike"

    for obj in (Lookalike, Lookalike(), "floor", Floor()):
        with pytest.raises(PolicyValidationError, match="is not a subclass of dynres.core.Policy"):
            validate_policy_class(obj)


@pytest.mark.parametrize("name", ["", "Floor", "my-policy", "9lives", None, 3])
def test_bad_registry_name(name):
    with pytest.raises(PolicyValidationError, match="lower_snake_case"):
        validate_policy_class(_policy(name=name))


def test_missing_required_methods_are_named():
    cls = type("Half", (Policy,), {"name": "half", "should_deactivate": lambda self, ctx: False})
    with pytest.raises(
        PolicyValidationError,
        match="does not implement deactivate_wait_samples, should_activate_after_step",
    ):
        validate_policy_class(cls)


@pytest.mark.parametrize(
    ("method", "func", "shown"),
    [
        ("should_deactivate", lambda self, global_steps, ctx: False, "should_deactivate(self, global_steps, ctx)"),
        ("should_deactivate", lambda self: False, "should_deactivate(self)"),
        ("deactivate_wait_samples", lambda self, *, ctx: 0, "deactivate_wait_samples(self, ctx)"),
        ("should_rebalance", lambda self, ctx, extra: True, "should_rebalance(self, ctx, extra)"),
        ("update_after_step", lambda self: None, "update_after_step(self)"),
    ],
)
def test_wrong_signature_names_method_and_expected_signature(method, func, shown):
    with pytest.raises(PolicyValidationError) as info:
        validate_policy_class(_policy(**{method: func}))
    msg = str(info.value)
    assert shown in msg
    assert f"def {method}(self, ctx: ScheduleContext)" in msg


def test_optional_extra_parameters_are_allowed():
    cls = _policy(should_deactivate=lambda self, ctx, verbose=False: False)
    assert validate_policy_class(cls) is cls


@pytest.mark.parametrize("wrap", [staticmethod, classmethod])
def test_static_and_class_methods_are_rejected(wrap):
    with pytest.raises(PolicyValidationError, match="must be a plain method"):
        validate_policy_class(_policy(should_deactivate=wrap(lambda ctx: False)))


def test_non_callable_method_is_rejected():
    with pytest.raises(PolicyValidationError, match="should_rebalance must be a method"):
        validate_policy_class(_policy(should_rebalance=True))


def test_unknown_dynres_method_is_rejected_with_a_suggestion():
    with pytest.raises(PolicyValidationError) as info:
        validate_policy_class(_policy(dynres_should_deactivat=lambda self, ctx: True))
    msg = str(info.value)
    assert "'dynres_should_deactivat', which is not a dynres hook" in msg
    assert "did you mean 'dynres_should_deactivate'?" in msg
    assert "hooks belong in a plugin" in msg


def test_any_dynres_method_is_rejected_even_a_real_hook_name():
    # A policy writes plain methods; a hook name on a policy would never be called.
    with pytest.raises(PolicyValidationError, match="dynres_foo"):
        validate_policy_class(_policy(dynres_foo=lambda self: None))


def test_params_must_subclass_policy_params():
    class Loose(BaseModel):
        x: int = 1

    with pytest.raises(PolicyValidationError, match="Params must subclass Policy.Params"):
        validate_policy_class(_policy(Params=Loose))


def test_params_must_keep_extra_forbid():
    class Permissive(Policy.Params):
        model_config = ConfigDict(extra="allow")

    with pytest.raises(PolicyValidationError, match="extra='forbid'"):
        validate_policy_class(_policy(Params=Permissive))
