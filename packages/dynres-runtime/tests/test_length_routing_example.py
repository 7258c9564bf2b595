"""The length-aware example policy (examples/policies/length_routing.py): responses its prompt's
history predicts long stay off the hybrid replicas, short ones still reach them; it passes the
conformance suite."""

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


def _run(policy) -> dict[str, _Replica]:
    bound = BoundPolicy(policy, get_plugin_manager(load_plugins=False))
    replicas = {
        "standalone": _Replica("standalone-0", ReplicaKind.STANDALONE),
        "hybrid": _Replica("hybrid-0", ReplicaKind.HYBRID),
    }
    decider = RequestDecider(bound, now=lambda: 0.0) if bound.decides_requests else None
    lb = LoadBalancer(seed=0, decider=decider)
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


def test_the_example_passes_the_conformance_suite() -> None:
    from dynres.testkit.checks import check_policy

    results = check_policy(SPEC, end_to_end=False, max_examples=10)
    assert results and all(r.status == "passed" for r in results), [r for r in results if r.status != "passed"]
