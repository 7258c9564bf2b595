"""No actor's event loop is ever blocked: the coordinator and the replicas stay responsive.

Every actor runs a LoopLagMonitor that ticks every 10 ms and keeps the longest gap between two
ticks. A run with several hybrid deactivations must keep the coordinator's worst gap far
below the engines' own operation times; the same run with a proxy that calls ``ray.get`` (the
reference implementation's blocking call) must be caught by the same check.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

pytest.importorskip("ray")

from ray_sessions import local_ray

from dynres.runtime.backends.ray import Factory, RayCluster, RayReplica
from dynres.runtime.backends.ray.cluster import driver_node_id
from dynres.runtime.backends.ray.monitor import LoopLag
from dynres.runtime.realrun import load_run_config
from dynres.runtime.realrun.on_ray import CoordinatorActor

SLEEP_S = 1.0
"""How long a hybrid replica's sleep takes (seconds): what a blocking caller would freeze for."""
MAX_GAP_S = 0.4
"""Worst tolerated gap between two 10 ms ticks (seconds): a 2-core machine busy with a second test
suite showed a 289 ms gap with no blocking call, so the bound sits between that and the sleep."""

RUN: dict[str, Any] = {  # a run file's document
    "run": {"steps": 4, "seed": 1},
    "ray": {"slot": {"CPU": 0.1}},
    "engines": {
        "rollout": "fake",
        "trainer": "fake",
        "rollout_options": {
            "tokens_per_s": 100.0,
            "response_tokens": 40,
            "latency": {"sleep": SLEEP_S, "wake_up": 0.05, "abort": 0.05},
        },
        "trainer_options": {"phase_times": {"update_actor": 0.2}, "latency": {"offload": 0.05, "onload": 0.05}},
    },
    "async_training": {
        "use_dynamic_resource_scheduling": True,
        "trigger_parameter_sync_step": 2,
        "concurrent_samples_per_replica": 4,
        # fixed_ratio activates whenever the backlog is short, so the run switches every cycle
        # whatever the machine's speed (default's cost gate depends on measured wall times).
        "dynamic_schedule_policy": "fixed_ratio",
        "dynamic_schedule_policy_params": {"deactivate_ratio": 0.5},
    },
    "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 6}, "rollout": {"n": 2}},
    "rollout": {"nnodes": 1, "n_gpus_per_node": 1},
    "trainer": {"nnodes": 1, "n_gpus_per_node": 1},
}


class BlockingRayReplica(RayReplica):
    """The reference's defect on purpose: a synchronous ray.get inside the async coordinator."""

    async def sleep(self, level: int = 1) -> None:
        import ray

        ray.get(self.handle.sleep.remote(level))


def assert_responsive(name: str, lag: LoopLag, bound_s: float = MAX_GAP_S) -> None:
    """Fail when ``name``'s event loop went more than ``bound_s`` without running a tick."""
    assert lag.ticks > 10, f"{name}: the lag monitor barely ran ({lag.ticks} ticks)"
    assert lag.max_gap_s < bound_s, (
        f"{name}: event loop blocked for {lag.max_gap_s * 1000:.0f} ms (bound {bound_s * 1000:.0f} ms); "
        "something synchronous runs inside an async actor"
    )


@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with local_ray(num_cpus=2) as tmp:
        yield tmp


async def _run(blocking: bool):
    cfg = load_run_config(RUN)
    cluster = RayCluster(cfg.ray)
    s_f = Factory(
        "dynres.runtime.realrun.builders:build_replica",
        {"engine": "fake", "model_path": None, "options": RUN["engines"]["rollout_options"]},
    )
    system = await cluster.start(
        cfg.dynres_config(),
        standalone=s_f,
        hybrid=s_f,
        trainer=Factory(
            "dynres.runtime.realrun.builders:build_trainer",
            {"engine": "fake", "model_path": None, "options": RUN["engines"]["trainer_options"]},
        ),
    )
    hybrid = system.hybrid
    if blocking:
        hybrid = [BlockingRayReplica(r.replica_id, r.kind, r.handle, r._info) for r in system.hybrid]
    try:
        coord = cluster.spawn(CoordinatorActor, 0.01, node_id=driver_node_id())
        build = Factory("dynres.runtime.realrun.builders:build_spec", {"config": cfg.model_dump()})
        await asyncio.gather(*(r.loop_lag(reset=True) for r in system.replicas))
        report = await coord.run.remote(build, system.standalone, hybrid, system.trainer)
        lags = {"coordinator": await coord.loop_lag.remote()}
        for r in system.replicas:
            lags[r.replica_id] = await r.loop_lag()
        return report, lags
    finally:
        await cluster.shutdown()


@pytest.mark.slow
def test_no_actor_loop_blocks_during_deactivations(ray_session):
    report, lags = asyncio.run(_run(blocking=False))
    assert report.operations.deactivations >= 2, "the run must exercise several deactivations"
    assert report.operations.engine["sleep"].max_s >= SLEEP_S * 0.9
    for name, lag in lags.items():
        assert_responsive(name, lag)


@pytest.mark.slow
def test_the_check_catches_a_blocking_ray_get(ray_session):
    report, lags = asyncio.run(_run(blocking=True))
    assert report.operations.deactivations >= 1
    with pytest.raises(AssertionError, match="coordinator: event loop blocked"):
        assert_responsive("coordinator", lags["coordinator"])
    assert lags["coordinator"].max_gap_s >= SLEEP_S * 0.9
