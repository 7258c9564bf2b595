"""Ray backend: proxies satisfy the protocols, weights travel by object reference, lost actors."""

from __future__ import annotations

import asyncio
import sys

import pytest

pytest.importorskip("ray")

from ray_sessions import local_ray

from dynres.core.config import load_config
from dynres.core.errors import BackendError, ConfigError, MissingExtraError
from dynres.runtime.backends.ray import (
    Factory,
    RayCluster,
    RayClusterConfig,
    RayReplica,
    RayTrainEngine,
)
from dynres.runtime.protocols import (
    GenerationRequest,
    Replica,
    ReplicaKind,
    TrainEngine,
    WeightUpdate,
)

DYN = load_config(
    {
        "async_training": {"use_dynamic_resource_scheduling": True},
        "rollout": {"nnodes": 1, "n_gpus_per_node": 2},
        "trainer": {"nnodes": 1, "n_gpus_per_node": 1},
    }
)


class _WeightsTrainer:
    """A train engine exporting a real payload (to check it reaches replicas by reference)."""

    def __init__(self) -> None:
        from dynres.runtime.backends.fake import FakeTrainEngine

        self._inner = FakeTrainEngine(phase_times={"update_actor": 0.01})

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def train_step(self, batch):
        return await self._inner.train_step(batch)

    async def offload(self):
        await self._inner.offload()

    async def onload(self):
        await self._inner.onload()

    async def export_weights(self):
        update = await self._inner.export_weights()
        return WeightUpdate(update.version, payload={"w": list(range(1000))}, nbytes=8000)

    def costs(self):
        return self._inner.costs()

    async def shutdown(self):
        await self._inner.shutdown()


class _PayloadReplica:
    """A fake replica that remembers the payload it received."""

    def __init__(self, replica_id, kind, **kw):
        from dynres.runtime.backends.fake import FakeReplica

        self._inner = FakeReplica(replica_id, kind, **kw)
        self.replica_id = replica_id
        self.kind = self._inner.kind
        self.payload = None

    async def generate(self, request):
        return await self._inner.generate(request)

    async def abort(self, request_ids=None):
        return await self._inner.abort(request_ids)

    async def pause(self):
        await self._inner.pause()

    async def resume(self):
        await self._inner.resume()

    async def sleep(self, level=1):
        await self._inner.sleep(level)

    async def wake_up(self, tags=None):
        await self._inner.wake_up(tags)

    async def update_weights(self, update):
        self.payload = update.payload
        await self._inner.update_weights(update)
        if update.payload is not None and not isinstance(update.payload, dict):
            raise BackendError(f"payload arrived as {type(update.payload).__name__}, not resolved")

    async def health(self):
        h = await self._inner.health()
        # Report what arrived through `detail` so the test can see it without extra methods.
        return type(h)(
            h.healthy, h.in_flight, h.sleeping, detail=f"payload_len={len((self.payload or {}).get('w', []))}"
        )

    def costs(self):
        return self._inner.costs()

    async def shutdown(self):
        await self._inner.shutdown()


@pytest.fixture(scope="module")
def ray_session():
    import ray

    # Classes defined in this test module travel by value: Ray workers cannot import it.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with local_ray(num_cpus=2) as tmp:
        yield tmp


def _start(standalone, hybrid, trainer):
    cluster = RayCluster(RayClusterConfig(slot={"CPU": 0.1}))
    system = asyncio.run(cluster.start(DYN, standalone=standalone, hybrid=hybrid, trainer=trainer))
    return cluster, system


@pytest.mark.slow
def test_proxies_satisfy_protocols_and_round_trip(ray_session):
    cluster, system = _start(
        Factory("dynres.runtime.backends.fake:FakeReplica", {"tokens_per_s": 2000.0, "response_tokens": 8}),
        Factory(_PayloadReplica, {"tokens_per_s": 2000.0, "response_tokens": 8}),
        Factory(_WeightsTrainer),
    )

    async def scenario():
        assert [r.replica_id for r in system.standalone] == ["standalone-0", "standalone-1"]
        assert [r.kind for r in system.hybrid] == [ReplicaKind.HYBRID]
        for r in system.replicas:
            assert isinstance(r, RayReplica) and isinstance(r, Replica)
            assert r.node_id
        assert isinstance(system.trainer, RayTrainEngine) and isinstance(system.trainer, TrainEngine)
        r0 = system.standalone[0]
        res = await r0.generate(GenerationRequest("s0/0", "s0", [1, 2, 3], max_tokens=8))
        assert res.finish_reason in ("stop", "length") and list(res.token_ids) == list(range(8))
        assert res.replica_id == "standalone-0"
        # A hybrid fake starts asleep: wake it, resume, then the full lifecycle.
        h = system.hybrid[0]
        await h.wake_up(None)
        await h.resume()
        step = await system.trainer.train_step(["x", "y"])
        assert step.phase_times["update_actor"] == pytest.approx(0.01)
        await system.trainer.offload()
        await system.trainer.onload()
        update = await system.trainer.export_weights()
        import ray

        assert isinstance(update.payload, ray.ObjectRef), "weights must travel by reference"
        await asyncio.gather(*(r.update_weights(update) for r in system.replicas))
        assert (await h.health()).detail == "payload_len=1000"
        await h.pause()
        assert await h.abort(None) == []
        await h.sleep(1)
        assert (await h.health()).sleeping
        assert system.trainer.costs() is not None and r0.costs() is not None
        lag = await r0.loop_lag()
        assert lag.ticks > 0

    try:
        asyncio.run(scenario())
    finally:
        assert asyncio.run(cluster.shutdown()) == []


def test_abort_reaches_a_generating_actor(ray_session):
    cluster, system = _start(
        Factory("dynres.runtime.backends.fake:FakeReplica", {"tokens_per_s": 10.0, "response_tokens": 1000}),
        None,
        Factory("dynres.runtime.backends.fake:FakeTrainEngine"),
    )

    async def scenario():
        r = system.standalone[0]
        reqs = [GenerationRequest(f"a{i}/0", f"a{i}", [1], max_tokens=1000) for i in range(20)]
        tasks = [asyncio.ensure_future(r.generate(q)) for q in reqs]
        await asyncio.sleep(0.5)
        aborted = await r.abort(None)
        results = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert sorted(aborted) == sorted(q.request_id for q in reqs)
        assert all(x.aborted and 0 < len(x.token_ids) < 1000 for x in results)

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(cluster.shutdown())


def test_lost_actor_is_a_backend_error_naming_the_replica(ray_session):
    import ray

    cluster, system = _start(
        Factory("dynres.runtime.backends.fake:FakeReplica", {"tokens_per_s": 10.0, "response_tokens": 1000}),
        None,
        Factory("dynres.runtime.backends.fake:FakeTrainEngine"),
    )

    async def scenario():
        victim = system.standalone[1]
        pending = asyncio.ensure_future(victim.generate(GenerationRequest("k/0", "k", [1], 1000)))
        await asyncio.sleep(0.3)
        ray.kill(victim.handle, no_restart=True)
        with pytest.raises(BackendError, match="standalone-1.*lost"):
            await asyncio.wait_for(pending, 30)
        health = await victim.health()
        assert not health.healthy and "standalone-1" in health.detail
        assert await victim.abort(None) == []  # nothing left to abort on a dead replica
        # The other replica is untouched.
        res = await system.standalone[0].generate(GenerationRequest("ok/0", "ok", [1], 5))
        assert not res.aborted

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(cluster.shutdown())


def test_factory_errors_name_the_target(ray_session):
    cluster = RayCluster(RayClusterConfig(slot={"CPU": 0.1}))
    with pytest.raises(ConfigError, match="has no attribute .nosuch."):
        asyncio.run(
            cluster.start(
                DYN,
                standalone=Factory("dynres.runtime.backends.fake:nosuch"),
                hybrid=None,
                trainer=Factory("dynres.runtime.backends.fake:FakeTrainEngine"),
            )
        )
    asyncio.run(cluster.shutdown())


def test_unplaceable_slot_times_out_with_a_clear_error(ray_session):
    cluster = RayCluster(RayClusterConfig(slot={"CPU": 0.1, "no_such_accelerator": 1}, placement_timeout_s=1))
    with pytest.raises(BackendError, match="placement groups not ready.*add nodes"):
        asyncio.run(
            cluster.start(
                DYN,
                standalone=Factory("dynres.runtime.backends.fake:FakeReplica"),
                hybrid=None,
                trainer=Factory("dynres.runtime.backends.fake:FakeTrainEngine"),
            )
        )
    asyncio.run(cluster.shutdown())


def test_missing_ray_names_the_extra(monkeypatch):
    from dynres.runtime.backends.ray import _ray

    _ray.require_ray.cache_clear()
    monkeypatch.setitem(sys.modules, "ray", None)
    try:
        with pytest.raises(MissingExtraError, match=r"dynres-runtime\[ray\]"):
            _ray.require_ray()
    finally:
        _ray.require_ray.cache_clear()


def test_cluster_config_rejects_typos_and_empty_slots():
    from dynres.core.config import validate_model

    with pytest.raises(ConfigError, match="did you mean 'address'"):
        validate_model(RayClusterConfig, {"adress": "auto"}, "ray")
    with pytest.raises(ConfigError, match="reserve some resource"):
        validate_model(RayClusterConfig, {"slot": {"CPU": 0}}, "ray")


@pytest.mark.slow
@pytest.mark.parametrize("hybrid_target", ["dynres.runtime.backends.fake:FakeReplica", _PayloadReplica])
def test_deactivation_takes_the_batched_path_and_keeps_partial_output(ray_session, hybrid_target):
    """A real deactivation on Ray replicas: one abort_batch reply per replica, every request
    finishes exactly once elsewhere, resumed from the output it had (both a hosted replica
    with abort_batch and one with only abort, which the actor batches itself)."""
    from dynres.runtime.loop.controller import Controller
    from dynres.runtime.loop.ops import OpRunner
    from dynres.runtime.loop.routing import LoadBalancer

    kw = {"tokens_per_s": 40.0, "response_tokens": 80}
    cluster, system = _start(
        Factory("dynres.runtime.backends.fake:FakeReplica", kw),
        Factory(hybrid_target, kw),
        Factory("dynres.runtime.backends.fake:FakeTrainEngine"),
    )

    async def scenario():
        loop = asyncio.get_running_loop()
        (h,) = system.hybrid
        lb = LoadBalancer(seed=0)
        assert lb.can_batch_abort(h), "a Ray replica must take the batched path"
        for r in system.standalone:
            lb.add_replica(r)
        ctl = Controller(
            balancer=lb,
            train_engine=system.trainer,
            hybrid=system.hybrid,
            standalone=system.standalone,
            ops=OpRunner(timeout_s=30.0, now=loop.time),
            now=loop.time,
        )
        assert await ctl.activate(WeightUpdate(1))
        reqs = [GenerationRequest(f"b{i}/0", f"b{i}", [1], max_tokens=80) for i in range(12)]
        tasks = [asyncio.ensure_future(lb.generate(q)) for q in reqs]
        await asyncio.sleep(0.8)  # every request has output by now (40 tokens/s)
        on_hybrid = set(lb.running_on(h.replica_id))
        assert on_hybrid, "the hybrid replica took no request"
        await ctl.deactivate()
        assert ctl.ops.failures == [] and not ctl.quarantined
        results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert sorted(r.request_id for r in results) == sorted(q.request_id for q in reqs)
        assert all(list(r.token_ids) == list(range(80)) and not r.aborted for r in results)
        assert {r.replica_id for r in results if r.request_id in on_hybrid} <= {s.replica_id for s in system.standalone}
        # Each moved request went on from the tokens it had: resumed, never restarted.
        assert lb.counters.aborted == len(on_hybrid) == lb.counters.resumed
        assert lb.counters.restarted == 0 and lb.counters.duplicates == 0 and lb.counters.completed == 12
        # The proxies count what each replica produced (the context's per-kind token fields):
        # every token of the 12 x 80 exactly once, the hybrid's share counted from its reply.
        assert h.generated_tokens > 0
        assert h.generated_tokens + sum(r.generated_tokens for r in system.standalone) == 12 * 80

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(cluster.shutdown())
