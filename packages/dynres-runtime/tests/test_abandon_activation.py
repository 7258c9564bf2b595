"""should_abandon_activation: an activation whose batch is already queued can be given up.

sample-1-053 of the development draws (seed 1) is the case that asked for it: its start
activation loads the weights into the hybrids for about as long as the 101 s startup sync, while
the standalone replicas complete the first batch 4.7 s into it, so without the decision the
trainer waits for the rest of the switch and then for the deactivation before its first fit step.
"""

from __future__ import annotations

import itertools
from typing import Any, ClassVar

from dynres.core import ScheduleContext
from dynres.policies.default import DefaultPolicy
from dynres.policies.predictive import PredictivePolicy
from dynres.runtime.loop.controller import ControllerState
from dynres.runtime.sim import simulate
from dynres.runtime.sim.sampling import sample_scenarios
from dynres.testkit.strategies import edge_runs

OFF = {"async_training.dynamic_schedule_policy_params.abandon_queued_activation": False}
ABANDONED = (ControllerState.ACTIVATING.value, ControllerState.STANDALONE_ONLY.value)
"""A timeline transition only an abandoned (or wholly failed) activation makes."""


def draw_053() -> dict[str, Any]:
    return next(itertools.islice(sample_scenarios(seed=1, count=54), 53, None))[0]


def abandons(result: Any) -> list[Any]:
    """The should_abandon_activation decisions of a run (startup and cycles), in order."""
    decisions = [*result.report.startup_decisions, *(d for c in result.report.cycles for d in c.decisions)]
    return [d for d in decisions if d.method == "should_abandon_activation"]


def intact(result: Any) -> bool:
    """Every cycle trained, nothing failed, nothing trained twice."""
    s = result.report.samples
    return s.failed == 0 and s.duplicates == 0 and len(result.report.cycles) == 20


def test_predictive_gives_up_the_blind_start_activation_and_the_run_is_faster() -> None:
    scenario = draw_053()
    on = simulate(scenario, policy="predictive", seed=0)
    off = simulate(scenario, policy="predictive", seed=0, overrides=OFF)
    assert on.report.operations.abandoned_activations >= 1 and off.report.operations.abandoned_activations == 0
    assert abandons(on)[0].value is True and not any(d.value for d in abandons(off))
    # The trainer trains the queued batch instead of waiting for both switches.
    assert on.report.end_to_end_s < 0.97 * off.report.end_to_end_s
    assert intact(on) and intact(off)
    # No hybrid became routable in the given-up activation.
    transitions = [(t.old, t.new) for t in on.report.timeline]
    assert ABANDONED in transitions and ABANDONED not in [(t.old, t.new) for t in off.report.timeline]


class AlwaysGiveUp(DefaultPolicy):
    """verl's default that gives up every activation it is offered; notes what it saw."""

    name = "always_give_up"
    seen: ClassVar[list[tuple[int, int, float]]] = []
    elsewhere: ClassVar[list[float]] = []

    def should_abandon_activation(self, ctx: ScheduleContext) -> bool:
        AlwaysGiveUp.seen.append((ctx.queue_size, ctx.required_samples, ctx.activation_elapsed_s))
        return True

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        AlwaysGiveUp.elsewhere.append(ctx.activation_elapsed_s)
        return super().should_activate_after_step(ctx)


def test_it_is_asked_once_the_batch_is_queued_and_only_of_a_policy_that_writes_it() -> None:
    scenario = draw_053()
    plain = simulate(scenario, policy="default", seed=0)
    assert abandons(plain) == [] and plain.report.operations.abandoned_activations == 0
    assert ABANDONED not in [(t.old, t.new) for t in plain.report.timeline]
    AlwaysGiveUp.seen.clear()
    AlwaysGiveUp.elsewhere.clear()
    giving_up = simulate(scenario, policy=AlwaysGiveUp, seed=0)
    asked = abandons(giving_up)
    assert asked and all(d.value is True for d in asked)
    assert giving_up.report.operations.abandoned_activations == len(asked) == len(AlwaysGiveUp.seen)
    # Each time the next collection's samples were queued, and the context said how long the
    # activation had run (the first time at least the trainer's offload; outside one it is 0).
    assert all(queued >= required for queued, required, _ in AlwaysGiveUp.seen)
    assert all(elapsed > 0 for _, _, elapsed in AlwaysGiveUp.seen)
    assert AlwaysGiveUp.elsewhere and set(AlwaysGiveUp.elsewhere) == {0.0}
    # The cycles that gave one up report the time it took.
    assert sum(c.activation_abandoned_s > 0 for c in giving_up.report.cycles) == sum(
        d.value for c in giving_up.report.cycles for d in c.decisions if d.method == "should_abandon_activation"
    )
    assert intact(giving_up)


def test_predictive_never_gives_up_in_an_only_hybrid_cluster() -> None:
    policy = PredictivePolicy()
    contexts = [ctx for run in edge_runs(only_hybrid=True) for ctx in run]
    assert contexts and not any(policy.should_abandon_activation(ctx) for ctx in contexts)
    # A start activation whose batch and wait target are queued: given up beside standalone
    # replicas, finished where the hybrids are the only ones that can generate.
    start = ScheduleContext(
        global_steps=0,
        required_samples=4,
        trigger_parameter_sync_step=1,
        staleness_threshold=0.5,
        partial_rollout=True,
        queue_size=40,
        num_standalone_replicas=2,
        num_hybrid_replicas=2,
    )
    assert policy.should_abandon_activation(start) is True
    alone = start.model_copy(update={"num_standalone_replicas": 0})
    assert alone.only_hybrid
    assert policy.should_abandon_activation(alone) is False


def test_an_activation_whose_batch_is_not_queued_is_never_offered() -> None:
    # seed-dynamic-16-16 starts most windows with a short queue: the activations during which no
    # collection's samples became queued run to the end, even for a policy that gives up all it can.
    AlwaysGiveUp.seen.clear()
    r = simulate("seed-dynamic-16-16", policy=AlwaysGiveUp, seed=0, overrides={"steps": 8})
    ops = r.report.operations
    assert ops.abandoned_activations == len(AlwaysGiveUp.seen) > 0 and ops.activations > 0
    assert all(queued >= required for queued, required, _ in AlwaysGiveUp.seen)
    assert r.report.samples.failed == 0 and r.report.samples.duplicates == 0 and len(r.report.cycles) == 8
