"""A rollout load balancer for verl that routes by a dynres policy's request decisions.

verl (0.9) lets ``actor_rollout_ref.rollout.router_config_path`` name a YAML file whose
``router_class`` is the load balancer of the rollout servers; verl makes it a Ray actor and calls
it as ``router_class(servers, config)`` with the YAML's whole mapping. Point it at this class::

    # router.yaml
    router_class: dynres.verl.router.PolicyRouter
    policy: my_policy            # a dynres policy name, module:Class or file.py:Class
    params: {}                   # the policy's params (optional)
    seed: 0                      # seed of the least-in-flight tie-break (optional)

Every ``acquire_server`` without a valid sticky server asks the policy's ``predict_length`` and
``route`` (:mod:`dynres.core.requests`, through the same checks and fallbacks as the dynres
runtime's balancer); their None, an invalid answer or an exception leaves the choice to verl's own
rule, the least in flight with a random tie-break. A policy that writes neither method routes as
verl's default balancer does.

What verl's interface gives and what it does not:

* **Replica kind**: the servers verl hands over at construction are its standalone replicas; the
  servers it adds later (``add_servers``, an activation of its hybrid replicas) are hybrid. This is
  how verl's fully-async server manager uses its balancer.
* **Prompt length and token limit**: from ``prompt_ids`` and ``sampling_params`` (``max_tokens``;
  0 when verl does not pass it), the two fields this router asks verl to send.
* **Not available**: the sample a request belongs to (``sample_id`` is the request id), the tokens
  of earlier attempts (``generated_tokens`` and ``attempt`` are 0), and the lengths of finished
  siblings (verl's release carries no length, so ``sibling_lengths`` is empty). A length
  prediction here can use the prompt only.
* **Policy state**: verl builds this router in its own actor, with its own copy of the policy, so
  what the policy instance in verl's controller learns in ``update_after_step`` does not reach it.
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from dynres.core import BoundPolicy, get_plugin_manager, load_policy
from dynres.core.errors import ConfigError, did_you_mean
from dynres.core.requests import ReplicaLoad, RequestContext, RequestDecisions

logger = logging.getLogger("dynres.verl.router")

KEYS = ("router_class", "policy", "params", "seed", "max_cache_size")
"""The keys a router YAML may have (``router_class`` is verl's own)."""

DEFAULT_CACHE = 10_000
"""Sticky entries kept by default (count; the least recently used go first)."""


class PolicyRouter:
    """verl's rollout load balancer, routing by a dynres policy (verl's RequestLoadBalancer protocol)."""

    def __init__(self, servers: Mapping[str, Any], config: Mapping[str, Any]) -> None:
        """Route over ``servers`` (id -> actor handle, verl's standalone servers) as ``config`` says."""
        unknown = sorted(set(config) - set(KEYS))
        if unknown:
            raise ConfigError(
                f"router config key {unknown[0]!r} is unknown{did_you_mean(unknown[0], KEYS)}; "
                f"valid keys: {', '.join(KEYS)}"
            )
        name = config.get("policy")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(
                "router config needs 'policy': the dynres policy whose route/predict_length decide "
                "(a name, module:Class or file.py:Class), e.g. policy: predictive"
            )
        seed, cache = config.get("seed", 0), config.get("max_cache_size", DEFAULT_CACHE)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"router config 'seed' must be an integer, not {seed!r}")
        if not isinstance(cache, int) or isinstance(cache, bool) or cache < 1:
            raise ConfigError(f"router config 'max_cache_size' must be an integer >= 1, not {cache!r}")
        policy = BoundPolicy(load_policy(name.strip(), config.get("params")), get_plugin_manager())
        self.decisions = RequestDecisions(policy, logger) if policy.decides_requests else None
        """The checked calls of the policy's request decisions; None when it makes none."""
        self._servers: dict[str, Any] = dict(servers)
        self._kind: dict[str, str] = {sid: "standalone" for sid in servers}
        self._inflight: dict[str, int] = {sid: 0 for sid in servers}
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._cache = cache
        self._rng = random.Random(seed)
        self._t0 = time.monotonic()

    # ---- Routing ------------------------------------------------------------------------------

    def acquire_server(
        self, request_id: str, prompt_ids: Any = None, sampling_params: Mapping[str, Any] | None = None
    ) -> tuple[str, Any]:
        """The server for ``request_id`` (its sticky one while registered, else the policy's or the
        least loaded), counted as in flight until :meth:`release_server`."""
        sid = self._sticky.get(request_id)
        if sid is not None and sid in self._inflight:
            self._sticky.move_to_end(request_id)
        else:
            if not self._inflight:
                raise RuntimeError("no rollout server is registered in the dynres PolicyRouter; add servers first")
            sid = self._choose(request_id, prompt_ids, sampling_params)
            self._sticky[request_id] = sid
            if len(self._sticky) > self._cache:
                self._sticky.popitem(last=False)
        self._inflight[sid] += 1
        return sid, self._servers[sid]

    def _choose(self, request_id: str, prompt_ids: Any, sampling_params: Mapping[str, Any] | None) -> str:
        if self.decisions is not None:
            max_tokens = (sampling_params or {}).get("max_tokens") or 0
            picked = self.decisions.choose(
                RequestContext(
                    request_id=request_id,
                    sample_id=request_id,
                    prompt_tokens=len(prompt_ids) if prompt_ids is not None else 0,
                    generated_tokens=0,
                    max_tokens=int(max_tokens),
                    attempt=0,
                    sibling_lengths=(),
                    replicas=tuple(ReplicaLoad(s, self._kind[s], n) for s, n in self._inflight.items()),  # type: ignore[arg-type]  # _kind holds only the two kinds
                    now=time.monotonic() - self._t0,
                )
            )
            if picked is not None:
                return picked
        low = min(self._inflight.values())
        return self._rng.choice([s for s, n in self._inflight.items() if n == low])

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        """A request on ``server_id`` ended (unknown or idle servers are ignored)."""
        if self._inflight.get(server_id, 0) > 0:
            self._inflight[server_id] -= 1

    def require_acquire_fields(self) -> list[str]:
        """The ``generate()`` fields verl sends to :meth:`acquire_server`: the prompt and sampling params."""
        return ["prompt_ids", "sampling_params"]

    def require_release_fields(self) -> list[str]:
        """Nothing beyond ``server_id`` is needed at release."""
        return []

    # ---- Membership -----------------------------------------------------------------------------

    def add_servers(self, servers: Mapping[str, Any]) -> None:
        """Register ``servers`` (verl adds its hybrid servers at an activation) as hybrid."""
        for sid, handle in servers.items():
            self._servers[sid] = handle
            self._inflight[sid] = 0
            self._kind[sid] = "hybrid"

    def remove_servers(self, server_ids: list[str]) -> None:
        """Stop routing to ``server_ids``; their sticky entries become invalid."""
        for sid in server_ids:
            self._inflight.pop(sid, None)
            self._servers.pop(sid, None)
            self._kind.pop(sid, None)

    def clear_sticky_cache(self) -> dict[str, Any]:
        """Forget every sticky entry (verl's rebalance); the cleared count and the loads."""
        cleared = len(self._sticky)
        self._sticky.clear()
        return {"cleared_entries": cleared, "server_loads": dict(self._inflight)}

    # ---- Status ---------------------------------------------------------------------------------

    def get_inflight_count(self, server_id: str) -> int:
        """Requests in flight on ``server_id`` (count; 0 when unknown)."""
        return self._inflight.get(server_id, 0)

    def get_all_servers(self) -> list[str]:
        """Ids of the registered servers."""
        return list(self._inflight)

    def get_total_inflight(self) -> int:
        """Requests in flight on all registered servers (count)."""
        return sum(self._inflight.values())

    def get_status(self) -> dict[str, Any]:
        """Loads, kinds and what the policy's request decisions did (counts), for debugging."""
        counters = self.decisions.counters if self.decisions is not None else None
        return {
            "servers": dict(self._inflight),
            "total_inflight": self.get_total_inflight(),
            "active_servers": len(self._inflight),
            "kinds": dict(self._kind),
            "request_decisions": None if counters is None else vars(counters).copy(),
        }
