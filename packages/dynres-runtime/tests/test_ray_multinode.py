"""Multi-node Ray: placement follows the node pools, and a replica whose node is lost comes back
on another node, losing no sample.

A ``ray.cluster_utils.Cluster`` with four nodes on this machine: the head (driver, coordinator,
trainer and the hybrid replica), two rollout nodes with one standalone replica each (custom
resources pin each rollout placement group to a rollout node) and a spare rollout node with
nothing on it. Mid-rollout one busy rollout node is removed: its replica's requests must be
retried on the survivors, Ray moves its placement group to the spare node, the replica is
recreated there (``respawn_replica``) with the current weights and serves again, every
admitted sample is still accounted for, and the report names the replica and the cause.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("ray")

from ray_sessions import multi_node_cluster

from dynres.runtime.backends.ray import Factory, RayCluster
from dynres.runtime.backends.ray.cluster import driver_node_id
from dynres.runtime.realrun import load_run_config
from dynres.runtime.realrun.on_ray import CoordinatorActor

ROLLOUT = {"tokens_per_s": 40.0, "response_tokens": 24, "latency": {"sleep": 0.05, "wake_up": 0.05}}
RUN: dict[str, Any] = {  # a run file's document
    "run": {"steps": 6, "seed": 3},
    "ray": {
        "trainer_slot": {"CPU": 0.2, "trainer_slot": 1},
        "standalone_slot": {"CPU": 0.2, "rollout_slot": 1},
    },
    "engines": {
        "rollout": "fake",
        "trainer": "fake",
        "rollout_options": ROLLOUT,
        "trainer_options": {"phase_times": {"update_actor": 0.3}},
    },
    "async_training": {
        "use_dynamic_resource_scheduling": True,
        "trigger_parameter_sync_step": 2,
        "concurrent_samples_per_replica": 4,
    },
    "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 6}, "rollout": {"n": 2}},
    "rollout": {"nnodes": 2, "n_gpus_per_node": 1},
    "trainer": {"nnodes": 1, "n_gpus_per_node": 1},
}


@pytest.mark.slow
def test_losing_a_rollout_node_recreates_its_replica_on_the_spare_node_and_loses_nothing():
    head = {"num_cpus": 2, "resources": {"trainer_slot": 1}}
    workers = [{"num_cpus": 1, "resources": {"rollout_slot": 1}} for _ in range(3)]
    with multi_node_cluster(head, workers) as (cluster, nodes):
        asyncio.run(_scenario(cluster, nodes))


async def _scenario(cluster, nodes):
    cfg = load_run_config(RUN)
    rc = RayCluster(cfg.ray)
    replica = Factory(
        "dynres.runtime.realrun.builders:build_replica", {"engine": "fake", "model_path": None, "options": ROLLOUT}
    )
    trainer = Factory(
        "dynres.runtime.realrun.builders:build_trainer",
        {"engine": "fake", "model_path": None, "options": RUN["engines"]["trainer_options"]},
    )
    system = await rc.start(cfg.dynres_config(), standalone=replica, hybrid=replica, trainer=trainer)
    try:
        head_id = driver_node_id()
        by_node = {n.node_id: n for n in nodes}
        s0, s1 = system.standalone
        # Placement: standalone replicas on two rollout nodes, hybrid with the trainer.
        assert {s0.node_id, s1.node_id} < set(by_node)
        [spare] = set(by_node) - {s0.node_id, s1.node_id}
        assert system.trainer is not None and system.hybrid[0].node_id == system.trainer.node_id == head_id

        coord = rc.spawn(CoordinatorActor, 0.01, node_id=head_id)
        where = await coord.ping.remote()
        assert where == head_id, (where, head_id, [n.node_id for n in nodes])
        restart = "dynres.runtime.backends.ray.cluster:respawn_replica"
        build = Factory("dynres.runtime.realrun.builders:build_spec", {"config": cfg.model_dump(), "restart": restart})
        run = asyncio.ensure_future(_await(coord.run.remote(build, system.standalone, system.hybrid, system.trainer)))

        # Wait until the first cycle is done and standalone-1 is busy, then pull its node.
        while not await coord.events.remote(0):
            await asyncio.sleep(0.1)
        status = await coord.status.remote()
        assert "standalone-1" in status["routable"]
        await asyncio.to_thread(cluster.remove_node, by_node[s1.node_id], False)

        report = await asyncio.wait_for(run, 120)
        s = report.samples
        assert len(report.cycles) == RUN["run"]["steps"], report.stopped_early
        # The lost replica was recreated, on the spare node, and nothing was quarantined.
        assert not report.quarantined, report.quarantined
        [restart] = report.replica_restarts
        assert restart.replica == "standalone-1" and "lost" in restart.cause, restart
        assert restart.seconds_to_return is not None and restart.seconds_to_return < 30, restart
        assert any(f.target == "standalone-1" for f in report.op_failures), report.op_failures
        [new] = [p for p in await coord.replicas.remote() if p.replica_id == "standalone-1"]
        assert new.node_id == spare and new.lost_reason is None
        assert await new.handle.ping.remote() == spare
        # Its requests went elsewhere: nothing failed, nothing produced twice, all accounted for.
        assert s.failed == 0 and s.duplicates == 0
        assert s.admitted == s.generated + s.partial_at_end, s
        assert s.generated == s.consumed + s.dropped_stale + s.queued_at_end
        # Cycles after the loss still trained full batches.
        assert all(c.samples_consumed > 0 for c in report.cycles[1:])
        assert s0.lost_reason is None
        await new.shutdown()
    finally:
        await rc.shutdown()


async def _await(ref):
    return await ref
