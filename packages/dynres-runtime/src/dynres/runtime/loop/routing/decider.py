"""The policy's per-request decisions in the load balancer: predict a length, choose a replica.

:class:`RequestDecider` builds the :class:`~dynres.core.requests.RequestContext` of a request that
has no valid sticky replica and asks the policy through :class:`dynres.core.requests.RequestDecisions`
(its checks and fallbacks: a bad routing answer must never lose or stall a request). The balancer
gets a decider only when the policy decides requests
(:attr:`dynres.core.BoundPolicy.decides_requests`), so a policy that does not pays nothing.

It also keeps what a length prediction needs that no single request carries: the lengths of the
finished responses of each sample, for the samples seen most recently.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping

from dynres.core import BoundPolicy
from dynres.core.requests import ReplicaLoad, RequestContext, RequestDecisionCounters, RequestDecisions
from dynres.runtime.protocols import GenerationRequest, Replica

logger = logging.getLogger("dynres.runtime.loop.routing")

SAMPLES_KEPT = 4096
"""Samples whose finished response lengths are kept for length predictions (count; oldest go first)."""


class RequestDecider:
    """Asks the bound policy where a request goes; None leaves the choice to the built-in rule."""

    def __init__(self, policy: BoundPolicy, now: Callable[[], float]) -> None:
        """Ask ``policy``; ``now`` is the run clock (seconds since run start) put in each context."""
        self.decisions = RequestDecisions(policy, logger)
        """The checked calls of the policy's request decisions."""
        self._now = now
        self._siblings: OrderedDict[str, list[int]] = OrderedDict()

    @property
    def counters(self) -> RequestDecisionCounters:
        """Routings asked, answered and fallen back (counts, for the report)."""
        return self.decisions.counters

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
        return self.decisions.choose(
            RequestContext(
                request_id=req.request_id,
                sample_id=req.sample_id,
                prompt_tokens=len(req.prompt_token_ids),
                generated_tokens=len(req.partial_token_ids),
                max_tokens=req.max_tokens,
                attempt=attempt,
                sibling_lengths=tuple(self._siblings.get(req.sample_id, ())),
                replicas=tuple(ReplicaLoad(rid, r.kind.value, in_flight[rid]) for rid, r in replicas.items()),
                now=self._now(),
            )
        )
