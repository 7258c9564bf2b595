"""predictive on one shared host: hybrid replicas add no throughput there, so it never lends them."""

from __future__ import annotations

from policies_helpers import make_ctx

from dynres.policies.predictive import PredictivePolicy
from dynres.runtime.sim import simulate

# Cheap switches and standalone replicas that leave the trainer waiting: on separate GPUs the
# hybrids pay here, so predictive lends them; on one shared host the same windows only cost.
PRESET = "seed-dynamic-16-16"
SHORT = {"steps": 10}


def test_on_a_shared_host_it_never_activates_beside_standalone_replicas() -> None:
    pol = PredictivePolicy()
    for step in (0, 1, 5):
        assert pol.should_activate_after_step(make_ctx(global_steps=step, shared_host=True)) is False


def test_on_a_shared_host_without_standalone_replicas_it_still_activates() -> None:
    # The hybrids are then the only producers: not lending them would stall the run.
    ctx = make_ctx(global_steps=0, shared_host=True, num_standalone_replicas=0)
    assert PredictivePolicy().should_activate_after_step(ctx) is True


def test_sim_on_a_shared_host_it_runs_as_fast_as_never_switching() -> None:
    separate = simulate(PRESET, policy="predictive", overrides=SHORT)
    assert separate.switches > 0  # the rule, not the workload, is what keeps it from switching below
    shared = {**SHORT, "cluster.shared_host": True}
    mine = simulate(PRESET, policy="predictive", overrides=shared)
    static = simulate(PRESET, policy="static_fully_async", overrides=shared)
    assert mine.switches == 0
    assert mine.end_to_end_s <= static.end_to_end_s * 1.001
    assert mine.report.samples.consumed == static.report.samples.consumed > 0
