"""The small fully-async config the loop tests run on, and a run of fakes on it (a helper of the
runtime's tests).

Replicas of 2 GPUs, mini-batches of 4 prompts with 2 responses each, a sync every 2 fit steps and
a staleness of 0.5: small enough that a fake run takes milliseconds, large enough that samples
cross syncs, hybrid replicas switch and the queue holds a buffer.
"""

from __future__ import annotations

from typing import Any

from dynres.core import DynresConfig, get_plugin_manager, load_config, load_policy
from dynres.runtime.loop.driver import FullyAsyncRun, RunSpec


def small_config(
    *,
    trainer_gpus: int = 2,
    standalone_nodes: int = 1,
    rollout_gpus_per_node: int = 2,
    mini: int = 4,
    n: int = 2,
    **async_training: Any,
) -> DynresConfig:
    """The config with dynamic scheduling on; ``async_training`` keys override its defaults."""
    return load_config(
        {
            "async_training": {
                "use_dynamic_resource_scheduling": True,
                "trigger_parameter_sync_step": 2,
                "staleness_threshold": 0.5,
                "concurrent_samples_per_replica": 4,
                **async_training,
            },
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": mini}, "rollout": {"n": n}},
            "rollout": {"nnodes": standalone_nodes, "n_gpus_per_node": rollout_gpus_per_node},
            "trainer": {"nnodes": 1, "n_gpus_per_node": trainer_gpus},
        }
    )


def small_run(cluster: Any, prompts: Any, *, config: DynresConfig, **spec: Any) -> FullyAsyncRun:
    """A run of ``cluster``'s fakes on ``config`` with ``default`` deactivating at once (ratio 1.0),
    no installed plugins and no switch calibration; ``spec`` adds or overrides RunSpec fields."""
    return FullyAsyncRun(
        RunSpec(
            config=config,
            policy=load_policy("default", {"deactivate_ratio": 1.0}),
            standalone=cluster.standalone,
            hybrid=cluster.hybrid,
            train_engine=cluster.engine,
            prompts=prompts,
            plugin_manager=get_plugin_manager(load_plugins=False),
            **{"calibration_switches": 0, **spec},
        )
    )
