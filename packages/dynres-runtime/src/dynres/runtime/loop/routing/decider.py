"""The policy's per-request decisions in the load balancer: predict a length, choose a replica.

:class:`RequestDecider` builds the :class:`~dynres.core.requests.RequestContext` of a request that
has no valid sticky replica and asks the policy through :class:`dynres.core.requests.RequestDecisions`
(its checks and fallbacks: a bad routing answer must never lose or stall a request). The balancer
gets a decider only when the policy decides requests
(:attr:`dynres.core.BoundPolicy.decides_requests`), so a policy that does not pays nothing.

It also keeps what a length prediction needs that no single request carries: the lengths of the
finished responses of each sample, for the samples seen most recently, and of each prompt's earlier
samples (requests whose prompt source names the prompt, ``prompt_id``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping

from dynres.core import BoundPolicy
from dynres.core.requests import ReplicaLoad, RequestContext, RequestDecisionCounters, RequestDecisions
from dynres.runtime.protocols import GenerationRequest, Replica

logger = logging.getLogger("dynres.runtime.loop.routing")

SAMPLES_KEPT = 4096
"""Samples whose finished response lengths are kept for length predictions (count; oldest go first)."""
PROMPTS_KEPT = 4096
"""Prompts whose earlier response lengths are kept for length predictions (count; least recent go first)."""
LENGTHS_PER_PROMPT = 16
"""Most recent finished response lengths kept per prompt (count)."""


class RequestDecider:
    """Asks the bound policy where a request goes; None leaves the choice to the built-in rule."""

    def __init__(self, policy: BoundPolicy, now: Callable[[], float]) -> None:
        """Ask ``policy``; ``now`` is the run clock (seconds since run start) put in each context."""
        self.decisions = RequestDecisions(policy, logger)
        """The checked calls of the policy's request decisions."""
        self._now = now
        self._siblings: OrderedDict[str, list[int]] = OrderedDict()
        # Per prompt, (sample id, length) of its last finished responses: the context leaves out
        # the request's own sample, whose lengths are its siblings.
        self._prompts: OrderedDict[str, deque[tuple[str, int]]] = OrderedDict()

    @property
    def counters(self) -> RequestDecisionCounters:
        """Routings asked, answered and fallen back (counts, for the report)."""
        return self.decisions.counters

    def finished(self, sample_id: str, tokens: int, prompt_id: str | None = None) -> None:
        """A response of ``sample_id`` (of prompt ``prompt_id``, when known) finished with ``tokens`` tokens in all."""
        lengths = self._siblings.get(sample_id)
        if lengths is None:
            lengths = self._siblings[sample_id] = []
            if len(self._siblings) > SAMPLES_KEPT:
                self._siblings.popitem(last=False)
        lengths.append(tokens)
        if prompt_id is None:
            return
        history = self._prompts.get(prompt_id)
        if history is None:
            history = self._prompts[prompt_id] = deque(maxlen=LENGTHS_PER_PROMPT)
            if len(self._prompts) > PROMPTS_KEPT:
                self._prompts.popitem(last=False)
        else:
            self._prompts.move_to_end(prompt_id)
        history.append((sample_id, tokens))

    def prompt_lengths(self, req: GenerationRequest) -> tuple[int, ...]:
        """Finished lengths of the earlier samples of ``req``'s prompt, oldest first (tokens)."""
        if req.prompt_id is None:
            return ()
        return tuple(n for sid, n in self._prompts.get(req.prompt_id, ()) if sid != req.sample_id)

    def choose(
        self,
        req: GenerationRequest,
        attempt: int,
        replicas: Mapping[str, Replica],
        in_flight: Mapping[str, int],
        partial_rollout: bool,
    ) -> str | None:
        """The replica id the policy chooses for ``req`` among ``replicas`` (None: the built-in rule).

        :param attempt: earlier attempts of the request (count).
        :param in_flight: routable replica id -> requests running on it (count).
        :param partial_rollout: whether an aborted request resumes from its output (the balancer's setting).
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
                prompt_id=req.prompt_id,
                prompt_lengths=self.prompt_lengths(req),
                partial_rollout=partial_rollout,
            )
        )
