"""The length-aware example policy (examples/policies/length_routing.py): without partial rollout,
responses its prompt's history predicts long stay off the hybrid replicas, short ones still reach
them; with partial rollout it routes as the built-in rule; it passes the conformance suite."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dynres.core import get_plugin_manager
from dynres.core.loading import resolve_policy_class
from dynres.core.plugins import BoundPolicy
from dynres.policies.default import DefaultPolicy
from dynres.runtime.loop.routing import LoadBalancer
from dynres.runtime.loop.routing.decider import RequestDecider
from dynres.runtime.protocols import GenerationRequest, GenerationResult, ReplicaKind

REPO = Path(__file__).resolve().parents[3]
SPEC = f"{REPO / 'examples' / 'policies' / 'length_routing.py'}:LengthRouting"
LONG, SHORT = 40, 2
EPOCHS = 5
JUDGED = 3
"""Epochs from this one on are routed after the policy's warm-up (16 predictions, 8 per epoch from the second)."""


class _Replica:
    """Generates a prompt's fixed length (``p-long``: LONG tokens, others SHORT), slowly enough that
    requests overlap and the load of every replica matters."""

    def __init__(self, rid: str, kind: ReplicaKind) -> None:
        self.replica_id = rid
        self.kind = kind
        self.served: list[GenerationRequest] = []

    async def generate(self, req: GenerationRequest) -> GenerationResult:
        self.served.append(req)
        n = LONG if req.prompt_id == "p-long" else SHORT
        await asyncio.sleep(0.001 * n)
        return GenerationResult(req.request_id, [1] * n, [0.0] * n, "stop", self.replica_id)


def _run(policy, *, partial_rollout: bool = False) -> dict[str, _Replica]:
    bound = BoundPolicy(policy, get_plugin_manager(load_plugins=False))
    replicas = {
        "standalone": _Replica("standalone-0", ReplicaKind.STANDALONE),
        "hybrid": _Replica("hybrid-0", ReplicaKind.HYBRID),
    }
    decider = RequestDecider(bound, now=lambda: 0.0) if bound.decides_requests else None
    lb = LoadBalancer(seed=0, partial_rollout=partial_rollout, decider=decider)
    lb.add_replicas(list(replicas.values()))  # type: ignore[arg-type]  # generate() is all routing needs

    async def epoch(e: int) -> None:
        reqs = [
            GenerationRequest(f"s{e}-{p}/{i}", f"s{e}-{p}", [1, 2], 64, prompt_id=p)
            for p in ("p-long", "p-short")
            for i in range(4)
        ]
        await asyncio.gather(*(lb.generate(r) for r in reqs))

    async def main() -> None:
        for e in range(EPOCHS):
            await epoch(e)

    asyncio.run(main())
    return replicas


def _later_epochs(replica: _Replica, prompt: str) -> int:
    return sum(
        1 for r in replica.served if r.prompt_id == prompt and int(r.sample_id[1 : r.sample_id.index("-")]) >= JUDGED
    )


def test_long_responses_stay_off_the_hybrids_once_their_prompt_was_seen() -> None:
    routed = _run(resolve_policy_class(SPEC)())
    built_in = _run(DefaultPolicy())
    # The built-in rule spreads by count, so long responses land on the hybrid too.
    assert _later_epochs(built_in["hybrid"], "p-long") > 0
    # Once earlier epochs showed p-long long, none of its responses goes to the hybrid ...
    assert _later_epochs(routed["hybrid"], "p-long") == 0
    assert _later_epochs(routed["standalone"], "p-long") == 4 * (EPOCHS - JUDGED)
    # ... while short work still does: the hybrid is not left idle.
    assert _later_epochs(routed["hybrid"], "p-short") > 0


def test_with_partial_rollout_it_routes_as_the_built_in_rule() -> None:
    # A cut response resumes elsewhere then, so keeping it off the hybrid saves nothing.
    routed = _run(resolve_policy_class(SPEC)(), partial_rollout=True)
    built_in = _run(DefaultPolicy())
    for kind in ("standalone", "hybrid"):
        assert [r.request_id for r in routed[kind].served] == [r.request_id for r in built_in[kind].served]


def test_the_example_passes_the_conformance_suite() -> None:
    from dynres.testkit.checks import check_policy

    results = check_policy(SPEC, end_to_end=False, max_examples=10)
    assert results and all(r.status == "passed" for r in results), [r for r in results if r.status != "passed"]


def test_in_the_simulator_it_loses_less_work_without_partial_rollout_and_nothing_changes_with_it() -> None:
    from dynres.runtime.sim import simulate

    policy = resolve_policy_class(SPEC)
    # Prompts that come back (64 of them, cycled) make a prompt's history a prediction.
    pooled = {"steps": 4, "workload.response.prompt_pool": 64}
    base = simulate("seed-no-partial-16-16", overrides=pooled)
    routed = simulate("seed-no-partial-16-16", policy=policy, overrides=pooled)
    decisions = routed.report.request_decisions
    assert decisions is not None and decisions.routed > 0
    assert routed.gap_causes["lost_work"] < 0.9 * base.gap_causes["lost_work"]
    assert routed.end_to_end_s < base.end_to_end_s
    assert routed.report.samples.consumed == base.report.samples.consumed and routed.report.samples.duplicates == 0
    # With partial rollout a cut response resumes elsewhere: the run is the built-in one.
    assert (
        simulate("seed-dynamic-16-16", policy=policy, overrides=pooled).end_to_end_s
        == simulate("seed-dynamic-16-16", overrides=pooled).end_to_end_s
    )


def test_a_resumed_run_judges_long_against_the_scale_it_had_learned() -> None:
    import json

    from dynres.core import ReplicaLoad, RequestContext

    cls = resolve_policy_class(SPEC)
    learned = cls()
    _run(learned)  # 5 epochs: means of 40- and 2-token prompts
    restored = cls()
    restored.load_state_dict(json.loads(json.dumps(learned.state_dict())))
    assert restored.state_dict() == learned.state_dict()
    request = RequestContext(
        request_id="s9-p/0",
        sample_id="s9-p",
        prompt_tokens=2,
        generated_tokens=0,
        max_tokens=64,
        attempt=0,
        sibling_lengths=(),
        replicas=(ReplicaLoad("standalone-0", "standalone", 3), ReplicaLoad("hybrid-0", "hybrid", 0)),
        now=0.0,
        predicted_tokens=float(LONG),
        prompt_id="p-long",
        prompt_lengths=(LONG,),
        partial_rollout=False,
    )
    # A policy that forgot the scale is back in its warm-up and leaves the long response to the
    # built-in rule (the idle hybrid); the restored one keeps it on the standalone replica.
    assert cls().route(request) is None
    assert restored.route(request) == learned.route(request) == "standalone-0"
