"""Controller: activation/deactivation ordering, concurrency, timeouts, failures, hooks, rebalance.

Every test that lets time pass runs on the virtual-time loop (``run_virtual``): the fakes'
token rates, latencies and the op timeouts then count loop time only, so how busy the machine
is cannot change which request finishes before an abort or a probe (on a real loop, a test
that slept 50 ms to catch a 300 ms request mid-flight failed when the process lost its core).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pytest

from dynres.core import get_plugin_manager, hookimpl
from dynres.core.errors import RuntimeStateError
from dynres.runtime.backends.fake import FakeReplica, FakeTrainEngine, OpRecord
from dynres.runtime.loop.controller import Controller, ControllerState
from dynres.runtime.loop.ops import OpRunner
from dynres.runtime.loop.routing import LoadBalancer
from dynres.runtime.protocols import GenerationRequest, Replica, WeightUpdate
from dynres.runtime.sim.virtual_time import run_virtual


class LoggingBalancer(LoadBalancer):
    """Writes routing membership changes into the shared op log (target ``balancer``)."""

    def __init__(self, log: list[OpRecord], **kw: Any) -> None:
        super().__init__(**kw)
        self.log = log

    def _note(self, op: str, rid: str) -> None:
        self.log.append(OpRecord(asyncio.get_running_loop().time(), "balancer", op, "end", rid))

    # add_replica / remove_replica go through these too.
    def add_replicas(self, replicas: Iterable[Replica]) -> None:
        batch = list(replicas)
        super().add_replicas(batch)
        for r in batch:
            self._note("add", r.replica_id)

    def remove_replicas(self, replica_ids: Iterable[str]) -> None:
        batch = list(replica_ids)
        super().remove_replicas(batch)
        for rid in batch:
            self._note("remove", rid)


class Cluster:
    def __init__(
        self,
        n_hybrid: int = 2,
        n_standalone: int = 1,
        *,
        latency: float = 0.0,
        timeout_s: float = 5.0,
        hybrid_kw: dict[int, dict[str, Any]] | None = None,
        pm: Any = None,
        on_change: Any = None,
        **replica_kw: Any,
    ) -> None:
        self.log: list[OpRecord] = []
        kw = {"tokens_per_s": 1000.0, "response_tokens": 300, **replica_kw}
        self.standalone = [FakeReplica(f"s{i}", log=self.log, **kw) for i in range(n_standalone)]
        self.hybrid = [
            FakeReplica(f"h{i}", "hybrid", log=self.log, latency=latency, **{**kw, **(hybrid_kw or {}).get(i, {})})
            for i in range(n_hybrid)
        ]
        self.engine = FakeTrainEngine(log=self.log, latency=latency)
        self.lb = LoggingBalancer(self.log, sticky_capacity=0, on_change=on_change)
        self.ops = OpRunner(timeout_s=timeout_s, now=lambda: asyncio.get_running_loop().time())
        self.ctl = Controller(
            balancer=self.lb,
            train_engine=self.engine,
            hybrid=self.hybrid,
            standalone=self.standalone,
            ops=self.ops,
            pm=pm,
            now=lambda: asyncio.get_running_loop().time(),
        )

    def register_standalone(self) -> None:
        for r in self.standalone:
            self.lb.add_replica(r)

    def idx(self, target: str, op: str, event: str, detail: str | None = None) -> int:
        for i, r in enumerate(self.log):
            if r.target == target and r.op == op and r.event == event and (detail is None or r.detail == detail):
                return i
        raise AssertionError(f"no {target} {op} {event} {detail or ''} in the op log")

    def violations(self) -> list[str]:
        return [v for r in [*self.standalone, *self.hybrid] for v in r.violations] + self.engine.violations


def req(i: int) -> GenerationRequest:
    return GenerationRequest(f"r{i}", f"s{i}", [1], 10_000)


UPDATE = WeightUpdate(version=3)


def test_activation_order_weights_before_routable_then_resume() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=3, latency=0.01)
        c.register_standalone()
        assert await c.ctl.activate(UPDATE)
        offload_end = c.idx("trainer", "offload", "end")
        for h in c.hybrid:
            rid = h.replica_id
            wake_w = c.idx(rid, "wake_up", "start", "weights")
            upd_start, upd_end = c.idx(rid, "update_weights", "start"), c.idx(rid, "update_weights", "end")
            wake_kv = c.idx(rid, "wake_up", "start", "kv_cache")
            add = c.idx("balancer", "add", "end", rid)
            resume = c.idx(rid, "resume", "start")
            assert offload_end < wake_w < upd_start < upd_end < wake_kv < add < resume
            assert h.weight_version == 3 and not h.paused and not h.sleeping
        assert c.ctl.state is ControllerState.HYBRID_ACTIVE
        assert sorted(c.lb.replica_ids) == ["h0", "h1", "h2", "s0"]
        assert c.ctl.last_activate_duration_s > 0
        assert c.violations() == []

    run_virtual(main)


def test_batched_deactivation_sleeps_at_once_and_hands_every_request_back_exactly_once() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=4, n_standalone=2)  # no op latency: sleep comes right after the abort
        c.lb.retry_batch = 1  # a slow re-queue: it goes on after the replicas went to sleep
        c.register_standalone()
        await c.ctl.activate(UPDATE)
        tasks = [asyncio.create_task(c.lb.generate(req(i))) for i in range(120)]
        await asyncio.sleep(0.05)
        on_hybrid = {r for h in c.hybrid for r in h.in_flight_ids}
        assert len(on_hybrid) > 40
        await c.ctl.deactivate()
        assert all(h.sleeping and not h.in_flight_ids for h in c.hybrid)
        results = await asyncio.gather(*tasks)
        # ... and yet every request finished exactly once, with every token, the aborted ones
        # continuing on a standalone replica from the output they had on a hybrid one.
        assert sorted(r.request_id for r in results) == sorted(f"r{i}" for i in range(120))
        done = Counter(x for r in [*c.standalone, *c.hybrid] for x in r.completed)
        assert set(done.values()) == {1} and len(done) == 120
        assert not any(x in on_hybrid for h in c.hybrid for x in h.completed)
        assert all(
            c.standalone[0].resumed_with.get(r, 0) + c.standalone[1].resumed_with.get(r, 0) > 0 for r in on_hybrid
        )
        assert all(list(r.token_ids) == list(range(300)) for r in results)
        assert c.violations() == []
        assert c.lb.requeue_pending == 0
        c.lb.check_invariants()
        # The replicas went to sleep before most aborted requests had started again.
        last_sleep = max(c.idx(h.replica_id, "sleep", "start") for h in c.hybrid)
        restarts = [
            i
            for i, r in enumerate(c.log)
            if r.op == "generate" and r.event == "start" and r.target.startswith("s") and "partial=0" not in r.detail
        ]
        assert len(restarts) == len(on_hybrid)
        assert sum(i > last_sleep for i in restarts) > len(on_hybrid) // 2

    run_virtual(main)


def test_deactivation_order_cut_abort_drain_sleep_onload() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=2, latency=0.01)
        c.register_standalone()
        await c.ctl.activate(UPDATE)
        tasks = [asyncio.create_task(c.lb.generate(req(i))) for i in range(9)]
        await asyncio.sleep(0.05)
        on_hybrid = [r for h in c.hybrid for r in h.in_flight_ids]
        assert on_hybrid  # the hybrid replicas have work to lose
        await c.ctl.deactivate()
        onload = c.idx("trainer", "onload", "start")
        for h in c.hybrid:
            rid = h.replica_id
            remove = c.idx("balancer", "remove", "end", rid)
            abort_start, abort_end = c.idx(rid, "abort", "start"), c.idx(rid, "abort", "end")
            sleep_start, sleep_end = c.idx(rid, "sleep", "start"), c.idx(rid, "sleep", "end")
            assert remove < abort_start < abort_end < sleep_start < sleep_end < onload
        assert c.ctl.state is ControllerState.STANDALONE_ONLY
        assert c.lb.replica_ids == ["s0"]
        assert c.ctl.last_deactivate_duration_s > 0
        assert not c.standalone[0].ops("abort")  # unlike the reference: standalone work is kept
        results = await asyncio.gather(*tasks)
        # every request finished exactly once, the aborted ones on the standalone replica with
        # the output they had on the hybrid replicas
        assert sorted(r.request_id for r in results) == sorted(f"r{i}" for i in range(9))
        done = Counter(x for r in [*c.standalone, *c.hybrid] for x in r.completed)
        assert set(done.values()) == {1}
        for rid in on_hybrid:
            assert c.standalone[0].resumed_with[rid] > 0
        assert all(list(r.token_ids) == list(range(300)) for r in results)
        assert c.violations() == []  # in particular: no sleep with requests in flight

    run_virtual(main)


def test_membership_changes_once_per_transition_and_requests_run_only_on_routable_replicas() -> None:
    async def main() -> None:
        seen: list[list[str]] = []  # the routable replicas each time the capacity is recomputed
        c: Cluster = Cluster(
            n_hybrid=8, n_standalone=2, latency=0.01, on_change=lambda: seen.append(sorted(c.lb.replica_ids))
        )
        c.register_standalone()
        seen.clear()
        await c.ctl.activate(UPDATE)
        hybrid_ids = [h.replica_id for h in c.hybrid]
        assert seen == [sorted(["s0", "s1", *hybrid_ids])]  # one recompute, all 8 already routable
        tasks = [asyncio.create_task(c.lb.generate(req(i))) for i in range(200)]
        await asyncio.sleep(0.05)
        on_hybrid = {r for h in c.hybrid for r in h.in_flight_ids}
        assert len(on_hybrid) > 100
        await c.ctl.deactivate()
        assert seen[1:] == [["s0", "s1"]]  # one recompute, after all 8 left
        results = await asyncio.gather(*tasks)
        # Nothing lost or doubled: every request completes once with all its tokens.
        assert sorted(r.request_id for r in results) == sorted(f"r{i}" for i in range(200))
        assert all(list(r.token_ids) == list(range(300)) for r in results)
        done = Counter(x for r in [*c.standalone, *c.hybrid] for x in r.completed)
        assert set(done.values()) == {1} and len(done) == 200
        # Every attempt on a hybrid replica started while it was routable.
        for rid in hybrid_ids:
            add, remove = c.idx("balancer", "add", "end", rid), c.idx("balancer", "remove", "end", rid)
            starts = [i for i, r in enumerate(c.log) if r.target == rid and r.op == "generate" and r.event == "start"]
            assert starts and all(add < i < remove for i in starts)
        assert c.violations() == []
        c.lb.check_invariants()

    run_virtual(main)


def test_operations_on_many_replicas_run_concurrently() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=6, latency=0.02)
        await c.ctl.activate(UPDATE)
        await c.ctl.deactivate()
        for op in ("wake_up", "update_weights", "resume", "abort", "sleep"):
            starts = [i for i, r in enumerate(c.log) if r.op == op and r.event == "start" and r.target.startswith("h")]
            ends = [i for i, r in enumerate(c.log) if r.op == op and r.event == "end" and r.target.startswith("h")]
            assert max(starts[:6]) < min(ends), f"{op} ran one replica after another"

    run_virtual(main)


def test_hung_sleep_times_out_names_the_replica_and_run_continues() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=2, timeout_s=0.1, hybrid_kw={1: {"hang_on": {"sleep"}}})
        c.register_standalone()
        await c.ctl.activate(UPDATE)
        await c.ctl.deactivate()
        assert c.ctl.state is ControllerState.STANDALONE_ONLY
        failure = [f for f in c.ops.failures if f.op == "sleep"]
        assert len(failure) == 1 and failure[0].target == "h1" and failure[0].timeout
        assert "h1" in c.ctl.quarantined
        assert not c.engine.offloaded  # the trainer got its GPUs back anyway
        assert await c.ctl.activate(UPDATE)  # the next activation uses the healthy replica only
        assert sorted(c.lb.replica_ids) == ["h0", "s0"]

    run_virtual(main)


def test_hung_abort_evicts_requests_to_standalone() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=1, timeout_s=0.1, hybrid_kw={0: {"hang_on": {"abort"}}})
        c.register_standalone()
        await c.ctl.activate(UPDATE)
        tasks = [asyncio.create_task(c.lb.generate(req(i))) for i in range(4)]
        await asyncio.sleep(0.02)
        assert c.hybrid[0].in_flight_ids
        await c.ctl.deactivate()
        results = await asyncio.gather(*tasks)
        assert {r.replica_id for r in results} == {"s0"}
        assert c.lb.counters.evicted >= 1
        assert any(f.op == "abort" and f.target == "h0" for f in c.ops.failures)
        # a replica whose abort hangs is never activated again (each deactivation would wait on it)
        assert "abort failed or hung" in c.ctl.quarantined["h0"]
        assert not c.hybrid[0].ops("sleep")  # not asked to sleep either: it would hang too
        assert not await c.ctl.activate(UPDATE)

    run_virtual(main)


def test_failed_wake_up_puts_that_replica_only_on_probation() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=2, hybrid_kw={0: {"fail_on": {"wake_up": RuntimeError}}})
        assert await c.ctl.activate(UPDATE)
        assert c.lb.replica_ids == ["h1"]
        assert "h0" in c.ctl.probation and "h0" not in c.ctl.quarantined
        assert [r.replica_id for r in c.ctl.usable_hybrid] == ["h1"]  # not before its backoff ends
        assert c.hybrid[0].ops("sleep")  # asked to give its memory back
        assert any(f.op == "wake_up" and f.target == "h0" for f in c.ops.failures)

    run_virtual(main)


def test_activation_with_every_replica_failing_gives_the_gpus_back() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=2, hybrid_kw={i: {"fail_on": {"update_weights": RuntimeError}} for i in range(2)})
        assert not await c.ctl.activate(UPDATE)
        assert c.ctl.state is ControllerState.STANDALONE_ONLY
        assert not c.engine.offloaded
        assert c.lb.replica_ids == []
        assert not await c.ctl.activate(UPDATE)  # nothing usable left: a no-op

    run_virtual(main)


def test_trainer_offload_failure_cancels_activation() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=2)
        c.engine.fail_on["offload"] = RuntimeError
        assert not await c.ctl.activate(UPDATE)
        assert c.ctl.state is ControllerState.STANDALONE_ONLY
        assert all(not h.ops("wake_up") for h in c.hybrid)

    run_virtual(main)


def test_state_transitions_are_reported_through_the_hook() -> None:
    seen: list[tuple[str, str]] = []

    class Observer:
        @hookimpl
        def dynres_state_transition(self, old_state: str, new_state: str, now: float) -> None:
            seen.append((old_state, new_state))

    pm = get_plugin_manager(load_plugins=False)
    pm.register(Observer())

    async def main() -> None:
        c = Cluster(n_hybrid=1, pm=pm)
        c.register_standalone()
        await c.ctl.activate(UPDATE)
        await c.ctl.rebalance()
        await c.ctl.deactivate()

    run_virtual(main)
    assert seen == [
        ("STANDALONE_ONLY", "ACTIVATING"),
        ("ACTIVATING", "HYBRID_ACTIVE"),
        ("HYBRID_ACTIVE", "REBALANCING"),
        ("REBALANCING", "HYBRID_ACTIVE"),
        ("HYBRID_ACTIVE", "DEACTIVATING"),
        ("DEACTIVATING", "STANDALONE_ONLY"),
    ]


def test_rebalance_aborts_only_requests_that_should_move() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=2, n_standalone=2, manual=True)
        c.register_standalone()
        tasks = [asyncio.create_task(c.lb.generate(req(i))) for i in range(8)]
        await asyncio.sleep(0.01)
        await c.ctl.activate(UPDATE)
        moved = await c.ctl.rebalance()
        await asyncio.sleep(0.01)
        assert moved == 4  # 4 + 4 on two replicas, 2 each on four replicas
        assert c.lb.in_flight_counts() == {"s0": 2, "s1": 2, "h0": 2, "h1": 2}
        aborts = [r for r in c.log if r.op == "abort" and r.event == "start"]
        assert {r.target for r in aborts} == {"s0", "s1"} and all(r.detail == "2 requests" for r in aborts)
        for r in [*c.standalone, *c.hybrid]:
            for rid in r.in_flight_ids:
                r.finish(rid)
        await asyncio.gather(*tasks)

    run_virtual(main)


def test_rebalance_after_activation_with_balanced_load_aborts_nothing() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=2, n_standalone=2, manual=True)
        c.register_standalone()
        await c.ctl.activate(UPDATE)
        assert await c.ctl.rebalance() == 0
        assert not [r for r in c.log if r.op == "abort"]

    run_virtual(main)


def test_weight_sync_failure_quarantines_standalone_and_moves_its_requests() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=0, n_standalone=2)
        c.register_standalone()
        tasks = [asyncio.create_task(c.lb.generate(req(i))) for i in range(4)]
        await asyncio.sleep(0.02)
        c.standalone[0].fail_on["update_weights"] = RuntimeError
        failed = await c.ctl.sync_weights(c.standalone, UPDATE)
        assert [r.replica_id for r in failed] == ["s0"]
        assert c.lb.replica_ids == ["s1"] and c.standalone[1].weight_version == 3
        results = await asyncio.gather(*tasks)
        assert all(list(r.token_ids) == list(range(300)) for r in results)

    run_virtual(main)


def test_transitions_in_the_wrong_state_are_errors() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=1)
        with pytest.raises(RuntimeStateError, match="cannot deactivate in controller state STANDALONE_ONLY"):
            await c.ctl.deactivate()
        with pytest.raises(RuntimeStateError, match="cannot rebalance"):
            await c.ctl.rebalance()
        await c.ctl.activate(UPDATE)
        with pytest.raises(RuntimeStateError, match="cannot activate in controller state HYBRID_ACTIVE"):
            await c.ctl.activate(UPDATE)

    run_virtual(main)


def test_standalone_replica_back_from_probation_with_the_newest_weights() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=0, n_standalone=2)
        c.ctl.probation_backoff_s = 0.05
        c.register_standalone()
        c.standalone[0].fail_on["update_weights"] = RuntimeError
        await c.ctl.sync_weights(c.standalone, UPDATE)
        assert c.lb.replica_ids == ["s1"] and c.ctl.probing
        c.standalone[0].fail_on.clear()
        newer = WeightUpdate(version=UPDATE.version + 1)
        await c.ctl.sync_weights([c.standalone[1]], newer)
        await asyncio.sleep(0.1)
        assert sorted(c.lb.replica_ids) == ["s0", "s1"]
        assert c.standalone[0].weight_version == newer.version  # never routable with old weights
        assert [e.event for e in c.ctl.replica_events] == ["probation", "back"]
        assert c.standalone[0].ops("health")

    run_virtual(main)


def test_probation_backoff_doubles_and_failed_probes_quarantine() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=0, n_standalone=2)
        c.ctl.probation_backoff_s = 0.01
        c.ctl.max_probes = 3
        c.register_standalone()
        c.standalone[0].fail_on["health"] = RuntimeError
        c.ctl.on_replica_failure("s0", RuntimeError("boom"))
        await asyncio.sleep(0.2)
        probes = [r.t for r in c.standalone[0].ops("health")]
        assert len(probes) == 3
        gaps = [b - a for a, b in itertools.pairwise(probes)]
        assert gaps[1] > 1.5 * gaps[0]  # the wait doubles
        assert "3 health probes failed" in c.ctl.quarantined["s0"]
        assert not c.ctl.probing and c.lb.replica_ids == ["s1"]

    run_virtual(main)


def test_a_lost_replica_is_quarantined_at_once_not_probed() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=0, n_standalone=2)
        c.register_standalone()
        c.standalone[0].lost_reason = "ActorDiedError: node gone"  # as the Ray proxy sets it
        c.ctl.on_replica_failure("s0", RuntimeError("actor died"))
        assert "the replica is lost (ActorDiedError: node gone)" in c.ctl.quarantined["s0"]
        assert not c.ctl.probing and c.lb.replica_ids == ["s1"]

    run_virtual(main)


@pytest.mark.parametrize("point", [0, 1, 2])
def test_an_abandoned_activation_stops_at_its_point_and_gives_everything_back(point: int) -> None:
    # give_up answers True at the point-th of the three places between the activation's phases
    # (after the offload, after the weights' wake-up, after the weight load).
    async def main() -> None:
        c = Cluster(n_hybrid=2, latency=0.01)
        c.register_standalone()
        asked: list[int] = []

        async def give_up() -> bool:
            asked.append(len(asked))
            return len(asked) - 1 == point

        assert not await c.ctl.activate(UPDATE, give_up)
        assert asked == list(range(point + 1))  # asked until it said yes, never after
        assert c.ctl.state is ControllerState.STANDALONE_ONLY and c.ctl.abandoned == 1 and c.ctl.activations == 0
        assert not c.engine.offloaded and c.ctl.last_abandoned_s > 0
        assert c.lb.replica_ids == ["s0"]  # no hybrid ever became routable
        for h in c.hybrid:
            woken = [r.detail for r in h.ops("wake_up")]
            assert woken == ([] if point == 0 else ["weights"]) and not h.ops("resume")
            assert bool(h.ops("update_weights")) == (point == 2)
            # What was woken sleeps again; the trainer's onload comes after.
            assert not h.weights_loaded and not h.kv_cache_allocated
            if point > 0:
                assert c.idx(h.replica_id, "sleep", "end") < c.idx("trainer", "onload", "end")
        assert c.violations() == []
        assert await c.ctl.activate(UPDATE)  # the next activation runs from the start
        assert all(h.weight_version == 3 and not h.sleeping for h in c.hybrid)

    run_virtual(main)


def test_an_activation_whose_give_up_says_no_runs_as_without_one() -> None:
    async def main() -> None:
        c = Cluster(n_hybrid=2, latency=0.01)
        c.register_standalone()

        async def never() -> bool:
            return False

        assert await c.ctl.activate(UPDATE, never)
        assert c.ctl.state is ControllerState.HYBRID_ACTIVE and c.ctl.abandoned == 0
        assert sorted(c.lb.replica_ids) == ["h0", "h1", "s0"]

    run_virtual(main)
