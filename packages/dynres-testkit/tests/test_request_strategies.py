"""The request-context strategies and the answer checkers the balancer and the suite share."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from dynres.core.requests import RequestContext, check_length_answer, check_route_answer
from dynres.testkit.strategies import edge_requests, request_contexts, sample_context


@settings(max_examples=50, deadline=None)
@given(request=request_contexts(), pick=st.integers(0, 100))
def test_every_routable_id_is_a_valid_route_and_nothing_else_is(request: RequestContext, pick: int) -> None:
    rid = request.replicas[pick % len(request.replicas)].replica_id
    assert check_route_answer(rid, request.replicas) == (rid, "")
    assert check_route_answer(None, request.replicas) == (None, "")
    for wrong in (rid + "x", 0, b"standalone-0"):
        value, reason = check_route_answer(wrong, request.replicas)
        assert value is None and reason
    assert 0 <= request.generated_tokens < request.max_tokens
    assert all(t <= request.max_tokens for t in request.sibling_lengths)


def test_length_answers_are_finite_token_counts_or_none() -> None:
    assert check_length_answer(None) == (None, "")
    assert check_length_answer(12) == (12.0, "")
    for wrong in (-1.0, math.nan, math.inf, True, "12"):
        value, reason = check_length_answer(wrong)
        assert value is None and reason


def test_edge_requests_route_over_the_cycles_replicas() -> None:
    active = edge_requests(sample_context(num_standalone_replicas=2, num_hybrid_replicas=3, is_hybrid_active=True))
    assert [len(r.replicas) for r in active] == [5] * 5
    # One request comes with its prompt's earlier lengths, as a prompt source that names prompts gives.
    assert [r.request_id for r in active if r.prompt_lengths] == ["seen-prompt"]
    assert all((r.prompt_id is None) == (not r.prompt_lengths) for r in active)
    idle = edge_requests(sample_context(num_standalone_replicas=2, num_hybrid_replicas=3, is_hybrid_active=False))
    assert {r.kind for r in idle[0].replicas} == {"standalone"}
