"""Short simulator scenarios for end-to-end policy checks (each simulates in well under a second).

They are small on purpose: 2 trainer GPUs, at most 2 standalone replicas, batches of 8 prompts of
4 responses, 4-5 sync cycles. That is enough for a policy's decisions to matter (hybrid replicas
are switched, aborted and resumed) while keeping a whole conformance run in seconds. Each is a
plain mapping in the simulator's scenario format (``dynres.runtime.sim.scenario.Scenario``), so it
can be printed, edited and passed to ``dynres.runtime.sim.simulate`` or saved as YAML for
``dynres simulate``.

* ``tiny-mixed``: 2 standalone + 2 hybrid replicas, generation is the bottleneck, so lending the
  trainer's GPUs pays off;
* ``tiny-training-bound``: the same cluster with slow training, where lending GPUs cannot help
  and every switch is pure cost;
* ``tiny-only-hybrid``: no standalone replica at all (``rollout.nnodes: 0``), so the hybrid
  replicas are the only producers and must be activated every cycle.
"""

from __future__ import annotations

import copy
from typing import Any

from dynres.core.errors import ScenarioError, did_you_mean

__all__ = ["SHORT_SCENARIOS", "short_scenario", "short_scenario_names"]


def _tiny(*, description: str, rollout_gpus: int, step_s: float, steps: int) -> dict[str, Any]:
    return {
        "description": description,
        "steps": steps,
        "seed": 0,
        "async_training": {
            "use_dynamic_resource_scheduling": True,
            "trigger_parameter_sync_step": 2,
            "staleness_threshold": 0.5,
            "concurrent_samples_per_replica": 8,
            "partial_rollout": True,
        },
        "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 8}, "rollout": {"n": 4}},
        "cluster": {"trainer_gpus": 2, "rollout_gpus": rollout_gpus, "gpus_per_replica": 1},
        "workload": {
            "prompt_tokens": 128,
            # Long-tailed lengths (lognormal) so that aborts and partial rollouts really happen.
            "response": {"median_tokens": 1000, "max_tokens": 8000, "sigma": 0.8},
            "decode": {"peak_tokens_per_s": 1000},
            "train": {"step_s": step_s, "reference_gpus": 2},
        },
        # Switches cost a few seconds each, as on real hardware, so needless switching shows.
        "costs": {
            "weight_sync_s": 2.0,
            "sleep_s": 2.0,
            "wake_up_s": 2.0,
            "abort_s": 0.1,
            "trainer_offload_s": 2.0,
            "trainer_onload_s": 2.0,
        },
    }


SHORT_SCENARIOS: dict[str, dict[str, Any]] = {
    "tiny-mixed": _tiny(
        description="2 standalone + 2 hybrid replicas, generation-bound, 5 sync cycles",
        rollout_gpus=2,
        step_s=10.0,
        steps=5,
    ),
    "tiny-training-bound": _tiny(
        description="2 standalone + 2 hybrid replicas, training-bound, 4 sync cycles",
        rollout_gpus=2,
        step_s=100.0,
        steps=4,
    ),
    "tiny-only-hybrid": _tiny(
        description="2 hybrid replicas and no standalone replica (colocated), 4 sync cycles",
        rollout_gpus=0,
        step_s=10.0,
        steps=4,
    ),
}
"""Name -> scenario mapping, in the simulator's scenario format."""


def short_scenario_names() -> list[str]:
    """Names of the short scenarios, in the order the end-to-end checks run them."""
    return list(SHORT_SCENARIOS)


def short_scenario(name: str) -> dict[str, Any]:
    """A copy of the named short scenario (with its ``name`` set), ready for ``simulate``."""
    if name not in SHORT_SCENARIOS:
        raise ScenarioError(
            f"unknown short scenario {name!r}{did_you_mean(name, SHORT_SCENARIOS)}; choose one of "
            f"{', '.join(SHORT_SCENARIOS)}"
        )
    return {"name": name, **copy.deepcopy(SHORT_SCENARIOS[name])}
