"""The context strategies produce valid, self-consistent contexts and honour their pins."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from pydantic import ValidationError

from dynres.core import ScheduleContext
from dynres.testkit.strategies import context_sequences, sample_context, schedule_contexts

FAST = settings(max_examples=60, deadline=None, database=None, derandomize=True)


def _consistent(ctx: ScheduleContext) -> None:
    # Revalidating the dump proves the context is one pydantic accepts, not a model_construct.
    assert ScheduleContext.model_validate(ctx.model_dump()) == ctx
    assert ctx.expected_samples == ctx.step_required_samples * ctx.global_steps
    assert 0 <= ctx.queue_size <= max(0, ctx.surplus_samples)
    assert ctx.surplus_samples <= ctx.step_required_samples + ctx.buffer_samples
    hybrid = ctx.num_hybrid_replicas if ctx.is_hybrid_active else 0
    assert ctx.num_active_replicas == ctx.num_standalone_replicas + hybrid
    if ctx.global_steps == 0:
        assert ctx.step_wait_samples == () and ctx.last_cycle_time_s == 0.0
    else:
        assert len(ctx.step_wait_samples) == ctx.trigger_parameter_sync_step
        assert all((t > 0) == (n > 0) for t, n in zip(ctx.step_wait_times, ctx.step_wait_samples, strict=False))
        assert all(n <= ctx.required_samples for n in ctx.step_wait_samples)
        assert ctx.last_cycle_time_s >= ctx.last_train_time_s


@FAST
@given(schedule_contexts())
def test_contexts_are_consistent(ctx: ScheduleContext) -> None:
    _consistent(ctx)


@FAST
@given(schedule_contexts(only_hybrid=True, is_hybrid_active=False))
def test_only_hybrid_inactive_pin(ctx: ScheduleContext) -> None:
    assert ctx.only_hybrid and not ctx.is_hybrid_active
    assert ctx.num_active_replicas == 0 and ctx.in_flight_samples == 0
    _consistent(ctx)


@FAST
@given(schedule_contexts(only_hybrid=False, is_hybrid_active=True, first_cycle=False))
def test_mixed_active_pin(ctx: ScheduleContext) -> None:
    assert not ctx.only_hybrid and ctx.is_hybrid_active and ctx.global_steps >= 1
    _consistent(ctx)


@FAST
@given(schedule_contexts(first_cycle=True))
def test_first_cycle_pin(ctx: ScheduleContext) -> None:
    assert ctx.global_steps == 0 and ctx.expected_samples == 0


@FAST
@given(context_sequences(min_size=2, max_size=6))
def test_sequences_describe_one_run(contexts: list[ScheduleContext]) -> None:
    assert 2 <= len(contexts) <= 6
    first = contexts[0]
    for before, after in itertools.pairwise(contexts):
        assert after.global_steps == before.global_steps + 1
        assert after.total_generated_samples >= before.total_generated_samples
        for field in (
            "required_samples",
            "trigger_parameter_sync_step",
            "num_standalone_replicas",
            "num_hybrid_replicas",
            "staleness_threshold",
        ):
            assert getattr(after, field) == getattr(first, field)
    for ctx in contexts:
        _consistent(ctx)


def test_sample_context_is_valid_and_overridable() -> None:
    ctx = sample_context()
    _consistent(ctx)
    assert ctx.is_hybrid_active and not ctx.only_hybrid
    colocated = sample_context(num_standalone_replicas=0, is_hybrid_active=False)
    assert colocated.only_hybrid and colocated.num_active_replicas == 0
    assert sample_context(global_steps=0, step_wait_times=(), step_wait_samples=()).expected_samples == 0
    with pytest.raises(ValidationError):
        sample_context(queue_size=-1)
