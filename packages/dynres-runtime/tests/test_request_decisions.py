"""The policy's per-request decisions (predict_length, route) in the shared load balancer."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import pytest

from dynres.core import RequestContext, ScheduleContext, get_plugin_manager, hookimpl
from dynres.core.plugins import BoundPolicy
from dynres.policies.default import DefaultPolicy
from dynres.runtime.loop.routing import LoadBalancer
from dynres.runtime.loop.routing.decider import RequestDecider
from dynres.runtime.protocols import GenerationRequest, GenerationResult, ReplicaKind
from dynres.runtime.sim import simulate

SHORT = {"steps": 4}
PRESET = "seed-dynamic-16-16"


class NoOpinion(DefaultPolicy):
    """Asked about every routing, answers None: must route exactly as the built-in rule."""

    name = "no_opinion"

    def route(self, request: RequestContext) -> str | None:
        return None


class StandaloneOnly(DefaultPolicy):
    """Routes everything to the least loaded standalone replica; records what the runtime measured."""

    name = "standalone_only"

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self.hybrid_tokens: list[int] = []
        self.standalone_tokens: list[int] = []

    def route(self, request: RequestContext) -> str | None:
        standalone = [r for r in request.replicas if r.kind == "standalone"]
        return min(standalone, key=lambda r: r.in_flight).replica_id if standalone else None

    def update_after_step(self, ctx: ScheduleContext) -> None:
        super().update_after_step(ctx)
        self.hybrid_tokens.append(ctx.last_hybrid_tokens)
        self.standalone_tokens.append(ctx.last_standalone_tokens)


class Garbage(DefaultPolicy):
    """Every request decision is wrong in a different way, by request."""

    name = "garbage"

    def predict_length(self, request: RequestContext) -> float | None:
        return math.nan

    def route(self, request: RequestContext) -> str | None:
        if hash(request.request_id) % 2:
            raise RuntimeError("routing table not loaded")
        return "no-such-replica"


class SiblingRecorder(DefaultPolicy):
    """Predicts the siblings' mean; keeps every context it was asked about."""

    name = "sibling_recorder"

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self.seen: list[RequestContext] = []

    def predict_length(self, request: RequestContext) -> float | None:
        return sum(request.sibling_lengths) / len(request.sibling_lengths) if request.sibling_lengths else None

    def route(self, request: RequestContext) -> str | None:
        self.seen.append(request)
        return None


def test_a_policy_answering_none_routes_exactly_as_the_built_in_rule() -> None:
    base = simulate(PRESET, overrides=SHORT)
    asked = simulate(PRESET, policy=NoOpinion, overrides=SHORT)
    assert base.report.request_decisions is None  # the built-in policy is never asked
    assert asked.report.request_decisions is not None and asked.report.request_decisions.asked > 1000
    assert asked.end_to_end_s == base.end_to_end_s
    assert asked.report.samples == base.report.samples
    assert [c.metrics for c in asked.report.cycles] == [c.metrics for c in base.report.cycles]


def test_a_policy_that_routes_keeps_the_hybrids_idle_and_loses_nothing() -> None:
    base = StandaloneOnly()
    pinned = simulate(PRESET, policy=base, overrides=SHORT)
    free = simulate(PRESET, policy=SiblingRecorder, overrides=SHORT)  # same switching, built-in routing
    assert pinned.report.final_state == free.report.final_state
    assert any(c.activated for c in pinned.report.cycles)  # hybrids were up, and got nothing
    assert sum(base.hybrid_tokens) == 0 and sum(base.standalone_tokens) > 0
    decisions = pinned.report.request_decisions
    assert decisions is not None and decisions.routed == decisions.asked > 0
    s = pinned.report.samples
    assert s.consumed == free.report.samples.consumed and s.duplicates == 0 and s.failed == 0


def test_wrong_answers_fall_back_to_the_built_in_rule_with_one_warning_each(caplog) -> None:
    base = simulate(PRESET, overrides=SHORT)
    with caplog.at_level(logging.WARNING, logger="dynres.runtime.loop.routing"):
        bad = simulate(PRESET, policy=Garbage, overrides=SHORT)
    d = bad.report.request_decisions
    assert d is not None and d.routed == 0 and d.predicted == 0
    assert d.route_fallbacks == d.length_fallbacks == d.asked > 0
    # Nothing routed by the policy: the routing, and so the run, is the built-in one.
    assert bad.end_to_end_s == base.end_to_end_s
    warnings = [r.getMessage() for r in caplog.records if "garbage" in r.getMessage()]
    assert len(warnings) == 2
    assert any("predict_length returned nan" in w for w in warnings)
    assert any("route" in w and ("no-such-replica" in w or "routing table not loaded" in w) for w in warnings)


def test_length_predictions_see_the_finished_siblings_of_the_same_sample() -> None:
    policy = SiblingRecorder()
    r = simulate(PRESET, policy=policy, overrides=SHORT)
    with_siblings = [c for c in policy.seen if c.sibling_lengths]
    assert with_siblings  # retries after aborts, at least, come after some siblings finished
    n = r.scenario.responses_per_sample
    for c in with_siblings:
        assert all(0 < t <= c.max_tokens for t in c.sibling_lengths)
        assert c.predicted_tokens == pytest.approx(sum(c.sibling_lengths) / len(c.sibling_lengths))
        assert len(c.sibling_lengths) < n  # the request itself has not finished
    decisions = r.report.request_decisions
    assert decisions is not None and decisions.predicted == len(with_siblings)


# ---- The balancer alone ----------------------------------------------------------------------------


class _Replica:
    def __init__(self, rid: str, kind: ReplicaKind) -> None:
        self.replica_id = rid
        self.kind = kind
        self.served: list[str] = []

    async def generate(self, req: GenerationRequest) -> GenerationResult:
        self.served.append(req.request_id)
        await asyncio.sleep(0)
        return GenerationResult(req.request_id, [1] * 5, [0.0] * 5, "stop", self.replica_id)


class _Plugin:
    """A plugin overriding the policy's routing: everything to hybrid-0."""

    @hookimpl
    def dynres_route_request(self, request: RequestContext) -> str | None:
        return "hybrid-0" if "hybrid-0" in request.replica_ids() else None


def test_a_plugin_route_overrides_the_policy_and_the_policy_alone_is_not_asked() -> None:
    pm = get_plugin_manager(load_plugins=False)
    plain = BoundPolicy(DefaultPolicy(), get_plugin_manager(load_plugins=False))
    assert not plain.decides_requests  # no method, no plugin: the balancer gets no decider
    pm.register(_Plugin())
    bound = BoundPolicy(DefaultPolicy(), pm)
    assert bound.decides_requests
    replicas = [_Replica("standalone-0", ReplicaKind.STANDALONE), _Replica("hybrid-0", ReplicaKind.HYBRID)]
    lb = LoadBalancer(seed=0, decider=RequestDecider(bound, now=lambda: 0.0))
    lb.add_replicas(replicas)  # type: ignore[arg-type]  # generate() is all that routing needs

    async def main() -> None:
        await asyncio.gather(*(lb.generate(GenerationRequest(f"r{i}", "s0", [1, 2], 16)) for i in range(6)))

    asyncio.run(main())
    assert replicas[1].served == [f"r{i}" for i in range(6)] and replicas[0].served == []
    assert lb.decider is not None and lb.decider.counters.routed == 6
