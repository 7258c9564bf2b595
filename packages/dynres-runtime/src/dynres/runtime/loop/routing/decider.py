"""The policy's per-request decisions in the load balancer: predict a length, choose a replica.

:class:`RequestDecider` builds the :class:`~dynres.core.requests.RequestContext` of a request that
has no valid sticky replica, asks the bound policy's ``predict_length`` then ``route`` (through
their hooks, so plugins can override them), checks each answer with the core's checkers and
falls back to ``None`` (the built-in least-in-flight choice) on an exception or an invalid answer:
a bad routing answer must never lose or stall a request. Each method warns once and counts every
fallback. The balancer creates a decider only when the policy decides requests
(:attr:`dynres.core.BoundPolicy.decides_requests`), so a policy that does not pays nothing.

It also keeps what a length prediction needs that no single request carries: the lengths of the
finished responses of each sample, for the samples seen most recently.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from dynres.core import BoundPolicy
from dynres.core.requests import ReplicaLoad, RequestContext, check_length_answer, check_route_answer
from dynres.runtime.protocols import GenerationRequest, Replica

logger = logging.getLogger("dynres.runtime.loop.routing")

SAMPLES_KEPT = 4096
"""Samples whose finished response lengths are kept for length predictions (count; oldest go first)."""


@dataclass
class RequestDecisionCounters:
    """What the policy's request decisions did (counts since the balancer was created)."""

    asked: int = 0
    """Routings the policy was asked about (requests without a valid sticky replica)."""
    routed: int = 0
    """Routings where the policy chose the replica (a valid non-None ``route`` answer)."""
    predicted: int = 0
    """Routings with a length prediction (a valid non-None ``predict_length`` answer)."""
    length_fallbacks: int = 0
    """``predict_length`` calls that raised or answered outside the table (used as None)."""
    route_fallbacks: int = 0
    """``route`` calls that raised or answered outside the table (routed by the built-in rule)."""


class RequestDecider:
    """Asks the bound policy where a request goes; None leaves the choice to the built-in rule."""

    def __init__(self, policy: BoundPolicy, now: Callable[[], float]) -> None:
        """Ask ``policy``; ``now`` is the run clock (seconds since run start) put in each context."""
        self.policy = policy
        self.counters = RequestDecisionCounters()
        """Routings asked, answered and fallen back (counts, for the report)."""
        self._now = now
        self._siblings: OrderedDict[str, list[int]] = OrderedDict()
        self._warned: set[str] = set()

    def finished(self, sample_id: str, tokens: int) -> None:
        """A response of ``sample_id`` finished with ``tokens`` tokens in all."""
        lengths = self._siblings.get(sample_id)
        if lengths is None:
            lengths = self._siblings[sample_id] = []
            if len(self._siblings) > SAMPLES_KEPT:
                self._siblings.popitem(last=False)
        lengths.append(tokens)

    def choose(
        self, req: GenerationRequest, attempt: int, replicas: Mapping[str, Replica], in_flight: Mapping[str, int]
    ) -> str | None:
        """The replica id the policy chooses for ``req`` among ``replicas`` (None: the built-in rule).

        :param attempt: earlier attempts of the request (count).
        :param in_flight: routable replica id -> requests running on it (count).
        """
        self.counters.asked += 1
        loads = tuple(ReplicaLoad(rid, r.kind.value, in_flight[rid]) for rid, r in replicas.items())
        ctx = RequestContext(
            request_id=req.request_id,
            sample_id=req.sample_id,
            prompt_tokens=len(req.prompt_token_ids),
            generated_tokens=len(req.partial_token_ids),
            max_tokens=req.max_tokens,
            attempt=attempt,
            sibling_lengths=tuple(self._siblings.get(req.sample_id, ())),
            replicas=loads,
            now=self._now(),
        )
        predicted = self._ask("predict_length", ctx)
        if predicted is not None:
            tokens, reason = check_length_answer(predicted)
            if reason:
                self._fallback("predict_length", reason)
            elif tokens is not None:
                self.counters.predicted += 1
                ctx = replace(ctx, predicted_tokens=tokens)
        answer = self._ask("route", ctx)
        if answer is None:
            return None
        rid, reason = check_route_answer(answer, loads)
        if reason:
            self._fallback("route", reason)
            return None
        self.counters.routed += 1
        return rid

    def _ask(self, method: str, ctx: RequestContext) -> object:
        try:
            return getattr(self.policy, method)(ctx)
        except Exception as exc:  # third-party code: anything may come out
            self._fallback(method, f"raised {type(exc).__name__}: {exc}")
            return None

    def _fallback(self, method: str, reason: str) -> None:
        if method == "route":
            self.counters.route_fallbacks += 1
        else:
            self.counters.length_fallbacks += 1
        if method not in self._warned:
            self._warned.add(method)
            logger.warning(
                "policy %r %s %s; this request is routed as if it had answered None (least in flight), "
                "and later fallbacks of %s are only counted (report.json request_decisions.%s)",
                self.policy.name,
                method,
                reason,
                method,
                "route_fallbacks" if method == "route" else "length_fallbacks",
            )
