"""ScheduleContext: validation, computed fields, immutability and serialisation."""

from __future__ import annotations

import math

import pytest
from core_helpers import make_ctx
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dynres.core import ScheduleContext
from dynres.core.context import COMPUTED_FIELDS

COUNT_FIELDS = [
    "global_steps",
    "total_generated_samples",
    "expected_samples",
    "queue_size",
    "in_flight_samples",
    "num_standalone_replicas",
    "num_hybrid_replicas",
    "num_active_replicas",
]
SECONDS_FIELDS = [
    "now",
    "last_activate_duration_s",
    "last_deactivate_duration_s",
    "generation_rate",
    "consumption_rate",
    "last_train_time_s",
    "last_cycle_time_s",
    "staleness_threshold",
]


# ---- Computed fields -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("required", "trigger", "staleness", "step_required", "buffer"),
    [
        (8, 4, 0.1, 32, 3),  # 3.2 truncates to 3
        (32, 1, 0.1, 32, 3),
        (16, 4, 0.5, 64, 32),
        (1, 1, 0.0, 1, 0),
        (10, 3, 1.0, 30, 30),
        (7, 2, 0.25, 14, 3),  # 3.5 truncates to 3
    ],
)
def test_step_required_and_buffer_samples(required, trigger, staleness, step_required, buffer):
    ctx = make_ctx(required_samples=required, trigger_parameter_sync_step=trigger, staleness_threshold=staleness)
    assert ctx.step_required_samples == step_required
    assert ctx.buffer_samples == buffer


def test_buffer_samples_uses_the_cycle_not_expected_samples():
    # The reference documents buffer = expected x staleness; dynres defines it per cycle.
    small = make_ctx(expected_samples=0, staleness_threshold=0.5)
    large = make_ctx(expected_samples=10_000, global_steps=5, staleness_threshold=0.5)
    assert small.buffer_samples == large.buffer_samples == 16


@pytest.mark.parametrize(("standalone", "hybrid", "only_hybrid"), [(0, 4, True), (1, 4, False), (3, 0, False)])
def test_only_hybrid_means_no_standalone_replicas(standalone, hybrid, only_hybrid):
    ctx = make_ctx(num_standalone_replicas=standalone, num_hybrid_replicas=hybrid)
    assert ctx.only_hybrid is only_hybrid


def test_surplus_may_be_negative():
    assert make_ctx(total_generated_samples=10, expected_samples=32).surplus_samples == -22
    assert make_ctx(total_generated_samples=40, expected_samples=32).surplus_samples == 8


def test_computed_fields_appear_in_dumps():
    dumped = make_ctx().model_dump()
    assert set(COMPUTED_FIELDS) <= set(dumped)
    assert dumped["step_required_samples"] == 32


# ---- Validation -------------------------------------------------------------------------------


@pytest.mark.parametrize("field", COUNT_FIELDS)
def test_negative_counts_are_rejected(field):
    with pytest.raises(ValidationError, match=field):
        make_ctx(**{field: -1})


@pytest.mark.parametrize("field", SECONDS_FIELDS)
def test_negative_times_and_rates_are_rejected(field):
    with pytest.raises(ValidationError, match=field):
        make_ctx(**{field: -0.5})


@pytest.mark.parametrize("field", ["required_samples", "trigger_parameter_sync_step"])
def test_cycle_sizes_must_be_positive(field):
    with pytest.raises(ValidationError, match=field):
        make_ctx(**{field: 0})


@pytest.mark.parametrize(
    "field", ["required_samples", "trigger_parameter_sync_step", "num_standalone_replicas", "num_hybrid_replicas"]
)
def test_cluster_shape_is_required(field):
    fields = dict(required_samples=8, trigger_parameter_sync_step=4, num_standalone_replicas=2, num_hybrid_replicas=2)
    del fields[field]
    with pytest.raises(ValidationError, match=field):
        ScheduleContext(**fields)


@pytest.mark.parametrize(("times", "samples"), [((1.0,), ()), ((), (3,)), ((1.0, 2.0), (3,))])
def test_mismatched_wait_lists_are_rejected(times, samples):
    with pytest.raises(ValidationError, match="one entry per collection") as info:
        make_ctx(step_wait_times=times, step_wait_samples=samples)
    assert "step_wait_times" in str(info.value) and "step_wait_samples" in str(info.value)


def test_negative_wait_entries_are_rejected():
    with pytest.raises(ValidationError, match="step_wait_times must be >= 0"):
        make_ctx(step_wait_times=(1.0, -2.0), step_wait_samples=(1, 1))
    with pytest.raises(ValidationError, match="step_wait_samples must be >= 0"):
        make_ctx(step_wait_times=(1.0, 2.0), step_wait_samples=(1, -1))


def test_zero_replicas_are_rejected():
    with pytest.raises(ValidationError, match="at least one replica"):
        make_ctx(num_standalone_replicas=0, num_hybrid_replicas=0)


def test_more_active_replicas_than_exist_is_rejected():
    with pytest.raises(ValidationError, match="num_active_replicas=5 exceeds"):
        make_ctx(num_active_replicas=5)
    assert make_ctx(num_active_replicas=4).num_active_replicas == 4


def test_hybrid_active_needs_hybrid_replicas():
    with pytest.raises(ValidationError, match="no hybrid replicas"):
        make_ctx(num_hybrid_replicas=0, is_hybrid_active=True)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("field", ["now", "last_activate_duration_s", "generation_rate"])
def test_non_finite_numbers_are_rejected(field, bad):
    with pytest.raises(ValidationError, match=field):
        make_ctx(**{field: bad})


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_wait_times_are_rejected(bad):
    # NaN passes every ">= 0" comparison check, so it needs rejecting on its own.
    with pytest.raises(ValidationError, match="step_wait_times"):
        make_ctx(step_wait_times=(bad,), step_wait_samples=(1,))


def test_unknown_fields_are_rejected():
    with pytest.raises(ValidationError, match="queue_sise"):
        make_ctx(queue_sise=3)


def test_context_is_frozen():
    ctx = make_ctx()
    with pytest.raises(ValidationError):
        ctx.queue_size = 5  # type: ignore[misc]  # the wrong type is the point of the test
    with pytest.raises(ValidationError):
        ctx.step_required_samples = 5  # type: ignore[misc]  # the wrong type is the point of the test


# ---- Serialisation ---------------------------------------------------------------------------


def test_json_round_trip_gives_an_equal_context():
    ctx = make_ctx(
        global_steps=3,
        now=12.5,
        total_generated_samples=100,
        expected_samples=96,
        step_wait_times=(0.5, 0.0, 1.25, 0.0),
        step_wait_samples=(2, 0, 3, 0),
        is_hybrid_active=True,
        num_active_replicas=4,
        last_activate_duration_s=2.0,
    )
    assert ScheduleContext.model_validate_json(ctx.model_dump_json()) == ctx
    assert ScheduleContext.model_validate(ctx.model_dump()) == ctx
    assert ScheduleContext(**ctx.model_dump()) == ctx


@pytest.mark.parametrize(
    ("field", "value"), [("step_required_samples", 31), ("buffer_samples", 4), ("only_hybrid", True)]
)
def test_computed_field_on_input_must_agree(field, value):
    data = make_ctx().model_dump()
    data[field] = value
    with pytest.raises(ValidationError, match=f"{field}=.* disagrees"):
        ScheduleContext.model_validate(data)


counts = st.integers(min_value=0, max_value=10_000)


@st.composite
def contexts(draw: st.DrawFn) -> ScheduleContext:
    """Random valid contexts (the shape only; the policy tests have a richer strategy)."""
    n = draw(st.integers(0, 6))
    standalone = draw(st.integers(0, 8))
    hybrid = draw(st.integers(0 if standalone else 1, 8))
    return ScheduleContext(
        global_steps=draw(counts),
        required_samples=draw(st.integers(1, 512)),
        trigger_parameter_sync_step=draw(st.integers(1, 16)),
        staleness_threshold=draw(st.floats(0, 2)),
        total_generated_samples=draw(counts),
        expected_samples=draw(counts),
        step_wait_times=tuple(draw(st.lists(st.floats(0, 1e4), min_size=n, max_size=n))),
        step_wait_samples=tuple(draw(st.lists(counts, min_size=n, max_size=n))),
        num_standalone_replicas=standalone,
        num_hybrid_replicas=hybrid,
        is_hybrid_active=draw(st.booleans()) and hybrid > 0,
    )


@settings(max_examples=150, deadline=None)
@given(contexts())
def test_random_contexts_survive_json_and_keep_their_derivations(ctx):
    again = ScheduleContext.model_validate_json(ctx.model_dump_json())
    assert again == ctx
    assert ctx.step_required_samples == ctx.required_samples * ctx.trigger_parameter_sync_step
    assert ctx.buffer_samples == int(ctx.step_required_samples * ctx.staleness_threshold)
    assert ctx.only_hybrid == (ctx.num_standalone_replicas == 0)
