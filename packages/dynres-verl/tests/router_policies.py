"""Policies the router tests load as ``file.py:Class`` (as a router YAML names them)."""

from __future__ import annotations

from dynres.core import RequestContext
from dynres.policies.default import DefaultPolicy


class ShortToHybrids(DefaultPolicy):
    """Prompts under 100 tokens to the least loaded hybrid server, the rest by load."""

    name = "short_to_hybrids"

    def predict_length(self, request: RequestContext) -> float | None:
        return 4.0 * request.prompt_tokens

    def route(self, request: RequestContext) -> str | None:
        hybrids = [r for r in request.replicas if r.kind == "hybrid"]
        if hybrids and request.predicted_tokens is not None and request.predicted_tokens < 400:
            return min(hybrids, key=lambda r: r.in_flight).replica_id
        return None


class Wrong(DefaultPolicy):
    """Names a server that does not exist."""

    name = "wrong_router"

    def route(self, request: RequestContext) -> str | None:
        return "10.0.0.1:9999"
