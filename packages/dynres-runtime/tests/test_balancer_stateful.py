"""Stateful property test: balancer + controller under random arrivals, progress, aborts and switches.

Invariants checked after every step: in-flight counts are consistent and never negative, no
request runs on a replica that is out of routing, no fake recorded a lifecycle violation. At the
end every request is driven to completion and must have completed exactly once.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dynres.runtime.backends.fake import FakeReplica, FakeTrainEngine
from dynres.runtime.loop.controller import Controller, ControllerState
from dynres.runtime.loop.ops import OpRunner
from dynres.runtime.loop.routing import LoadBalancer
from dynres.runtime.protocols import GenerationRequest, GenerationResult, WeightUpdate
from dynres.runtime.sim.virtual_time import VirtualTimeLoop


class GuardedReplica(FakeReplica):
    """A manual fake that records any generate call arriving while it is out of routing."""

    balancer: LoadBalancer

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if not self.balancer.has_replica(self.replica_id):
            self.violations.append(f"{request.request_id} routed to {self.replica_id} out of routing")
        return await super().generate(request)


class BalancerControllerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # Loop time is virtual: the op timeouts count loop time, never how busy the machine is.
        self.loop = VirtualTimeLoop()
        self.lb = LoadBalancer(seed=0, sticky_capacity=64)
        self.standalone = [GuardedReplica(f"s{i}", manual=True, response_tokens=50) for i in range(2)]
        self.hybrid = [GuardedReplica(f"h{i}", "hybrid", manual=True, response_tokens=50) for i in range(3)]
        for r in [*self.standalone, *self.hybrid]:
            r.balancer = self.lb
        self.engine = FakeTrainEngine()
        self.ctl = Controller(
            balancer=self.lb,
            train_engine=self.engine,
            hybrid=self.hybrid,
            ops=OpRunner(timeout_s=5.0, now=self.loop.time),
            now=self.loop.time,
        )
        self.tasks: dict[str, asyncio.Task[GenerationResult]] = {}
        self.next_id = 0
        self.version = 0

    @property
    def replicas(self) -> list[GuardedReplica]:
        return [*self.standalone, *self.hybrid]

    def settle(self) -> None:
        # Let every ready callback run (aborted requests return and are routed again).
        for _ in range(6):
            self.loop.run_until_complete(asyncio.sleep(0))

    def running(self) -> list[tuple[GuardedReplica, str]]:
        return [(r, rid) for r in self.replicas for rid in r.in_flight_ids]

    @initialize(n_standalone=st.integers(min_value=0, max_value=2))
    def setup(self, n_standalone: int) -> None:
        for r in self.standalone[:n_standalone]:
            self.lb.add_replica(r)

    @rule(k=st.integers(min_value=1, max_value=5))
    def arrive(self, k: int) -> None:
        for _ in range(k):
            rid = f"r{self.next_id}"
            self.next_id += 1
            req = GenerationRequest(rid, rid, [1], 100)
            self.tasks[rid] = self.loop.create_task(self.lb.generate(req))
        self.settle()

    @precondition(lambda self: bool(self.running()))
    @rule(data=st.data(), tokens=st.integers(min_value=1, max_value=60))
    def progress(self, data: st.DataObject, tokens: int) -> None:
        replica, rid = data.draw(st.sampled_from(self.running()))
        replica.advance(rid, tokens)
        self.settle()

    @precondition(lambda self: bool(self.running()))
    @rule(data=st.data())
    def abort_one(self, data: st.DataObject) -> None:
        replica, rid = data.draw(st.sampled_from(self.running()))
        self.loop.run_until_complete(replica.abort([rid]))
        self.settle()

    @precondition(lambda self: self.ctl.state is ControllerState.STANDALONE_ONLY)
    @rule()
    def activate(self) -> None:
        self.version += 1
        assert self.loop.run_until_complete(self.ctl.activate(WeightUpdate(self.version)))
        self.settle()

    @precondition(lambda self: self.ctl.state is ControllerState.HYBRID_ACTIVE)
    @rule()
    def deactivate(self) -> None:
        self.loop.run_until_complete(self.ctl.deactivate())
        self.settle()

    @precondition(lambda self: self.ctl.state is ControllerState.HYBRID_ACTIVE)
    @rule()
    def rebalance(self) -> None:
        self.loop.run_until_complete(self.ctl.rebalance())
        self.settle()

    @invariant()
    def counts_are_consistent(self) -> None:
        self.lb.check_invariants()
        assert all(c >= 0 for c in self.lb.in_flight_counts().values())

    @invariant()
    def nothing_runs_out_of_routing(self) -> None:
        for r in self.replicas:
            if not self.lb.has_replica(r.replica_id):
                assert r.in_flight_ids == [], f"{r.replica_id} out of routing still runs {r.in_flight_ids}"
            assert r.violations == []

    def teardown(self) -> None:
        try:
            if self.lb.num_replicas == 0:
                self.lb.add_replica(self.standalone[0])
            for _ in range(10_000):
                self.settle()
                running = self.running()
                if not running:
                    if all(t.done() for t in self.tasks.values()):
                        break
                    continue
                for r, rid in running:
                    r.finish(rid)
            results = {rid: t.result() for rid, t in self.tasks.items()}
            assert all(not res.aborted and res.request_id == rid for rid, res in results.items())
            assert all(len(res.token_ids) == 50 for res in results.values())
            done = Counter(x for r in self.replicas for x in r.completed)
            assert set(done) == set(self.tasks) and set(done.values()) <= {1}
            assert self.lb.counters.duplicates == 0
            assert self.lb.total_in_flight == 0
        finally:
            for t in self.tasks.values():
                t.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()


TestBalancerController = BalancerControllerMachine.TestCase
TestBalancerController.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
