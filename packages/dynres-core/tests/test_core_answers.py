"""The table of valid policy answers and its checker (dynres.core.answers)."""

from __future__ import annotations

from typing import Any

import pytest

from dynres.core import CYCLE_METHODS, ScheduleContext
from dynres.core.answers import ANSWERS, check_answer, clamp_answer, safe_answer


def test_the_table_covers_every_policy_method_in_call_order() -> None:
    assert tuple(ANSWERS) == CYCLE_METHODS


@pytest.mark.parametrize(
    ("method", "value", "expected"),
    [
        ("should_deactivate", True, True),
        ("should_rebalance", False, False),
        ("should_activate_after_step", True, True),
        ("deactivate_wait_samples", 0, 0),
        ("deactivate_wait_samples", 12, 12),
        ("update_after_step", None, None),
    ],
)
def test_valid_answers_pass_unchanged(method: str, value: Any, expected: Any) -> None:
    checked = check_answer(method, value)
    assert checked.ok and checked.type_ok and checked.reason == ""
    assert checked.value == expected and type(checked.value) is type(expected)


@pytest.mark.parametrize(
    ("method", "value", "reason"),
    [
        ("should_deactivate", 0, "expected bool, got int"),
        ("should_deactivate", None, "expected bool, got NoneType"),
        ("should_rebalance", "yes", "expected bool, got str"),
        ("deactivate_wait_samples", True, "expected int >= 0, got bool"),
        ("deactivate_wait_samples", 3.0, "expected int >= 0, got float"),
        ("update_after_step", 0, "expected None, got int"),
    ],
)
def test_wrong_types_are_rejected_with_the_expected_type(method: str, value: Any, reason: str) -> None:
    checked = check_answer(method, value)
    assert not checked.ok and not checked.type_ok
    assert checked.reason == reason
    assert checked.value is value


def test_a_negative_wait_has_the_right_type_but_is_out_of_range() -> None:
    checked = check_answer("deactivate_wait_samples", -1)
    assert checked.type_ok and not checked.ok
    assert checked.reason == "expected int >= 0, got -1"


def test_numpy_scalars_are_accepted_and_normalised_to_python_types() -> None:
    np = pytest.importorskip("numpy")
    yes = check_answer("should_deactivate", np.bool_(True))
    assert yes.ok and yes.value is True
    wait = check_answer("deactivate_wait_samples", np.int64(7))
    assert wait.ok and wait.value == 7 and type(wait.value) is int
    unsigned = check_answer("deactivate_wait_samples", np.uint8(3))
    assert unsigned.ok and type(unsigned.value) is int
    negative = check_answer("deactivate_wait_samples", np.int32(-2))
    assert negative.type_ok and not negative.ok and "got -2" in negative.reason


def test_numpy_floats_and_arrays_are_rejected() -> None:
    np = pytest.importorskip("numpy")
    assert check_answer("deactivate_wait_samples", np.float64(3.0)).reason == "expected int >= 0, got numpy.float64"
    assert not check_answer("should_deactivate", np.array([True])).type_ok
    assert not check_answer("should_deactivate", np.int64(1)).type_ok


def test_an_unknown_method_is_a_caller_bug() -> None:
    with pytest.raises(KeyError):
        check_answer("should_explode", True)


def _ctx(standalone: int) -> ScheduleContext:
    return ScheduleContext(
        required_samples=10,
        trigger_parameter_sync_step=2,
        staleness_threshold=0.5,
        num_standalone_replicas=standalone,
        num_hybrid_replicas=2,
    )


@pytest.mark.parametrize(
    ("standalone", "method", "safe"),
    [
        (2, "should_deactivate", True),
        (2, "deactivate_wait_samples", 0),
        (2, "should_activate_after_step", False),
        (0, "should_activate_after_step", True),  # only-hybrid: nothing else would generate
        (2, "should_rebalance", False),
        (2, "update_after_step", None),
    ],
)
def test_safe_answers(standalone: int, method: str, safe: Any) -> None:
    assert safe_answer(method, _ctx(standalone)) == safe


@pytest.mark.parametrize(
    ("standalone", "method", "value", "expected"),
    [
        (2, "deactivate_wait_samples", 0, 0),
        (2, "deactivate_wait_samples", 30, 30),  # step_required 20 + buffer 10
        (2, "deactivate_wait_samples", 31, 30),
        (0, "deactivate_wait_samples", 5, 20),  # only-hybrid: at least a cycle's samples
        (0, "should_activate_after_step", False, True),
        (2, "should_activate_after_step", False, False),
        (2, "should_deactivate", False, False),
    ],
)
def test_safety_clamps(standalone: int, method: str, value: Any, expected: Any) -> None:
    new, reason = clamp_answer(method, value, _ctx(standalone))
    assert new == expected
    assert bool(reason) == (new != value)


@pytest.mark.parametrize(
    ("value", "ok", "normalised"),
    [(0, True, 0.0), (2.5, True, 2.5), (-0.1, False, -0.1), (float("nan"), False, None), (True, False, True)],
)
def test_the_grace_is_a_finite_non_negative_number_of_seconds(value, ok, normalised) -> None:
    checked = check_answer("deactivate_grace_s", value)
    assert checked.ok is ok
    if normalised is not None:
        assert checked.value == normalised and type(checked.value) is type(normalised)


def test_the_grace_never_outlasts_the_latest_cycle_and_falls_back_to_none() -> None:
    ctx = _ctx(2).model_copy(update={"global_steps": 3, "last_cycle_time_s": 40.0})
    value, reason = clamp_answer("deactivate_grace_s", 100.0, ctx)
    assert value == 40.0 and "last_cycle_time_s=40.0" in reason
    assert clamp_answer("deactivate_grace_s", 10.0, ctx) == (10.0, "")
    assert clamp_answer("deactivate_grace_s", 5.0, _ctx(2))[0] == 0.0  # nothing measured yet
    assert safe_answer("deactivate_grace_s", ctx) == 0.0


@pytest.mark.parametrize(("value", "ok"), [(0, True), (7, True), (-1, False), (2.0, False), (True, False)])
def test_extra_admission_is_a_whole_non_negative_sample_count(value: Any, ok: bool) -> None:
    assert check_answer("admit_extra_samples", value).ok is ok


def test_extra_admission_is_at_most_one_cycles_batch_and_falls_back_to_none() -> None:
    ctx = _ctx(2)
    value, reason = clamp_answer("admit_extra_samples", ctx.step_required_samples + 5, ctx)
    assert value == ctx.step_required_samples and f"step_required={ctx.step_required_samples}" in reason
    assert clamp_answer("admit_extra_samples", ctx.step_required_samples, ctx) == (ctx.step_required_samples, "")
    assert safe_answer("admit_extra_samples", ctx) == 0
