"""A ready-made set of fakes sharing one op log, and prompts for them."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dynres.runtime.backends.fake.faults import OpRecord
from dynres.runtime.backends.fake.replica import FakeReplica
from dynres.runtime.backends.fake.train import FakeTrainEngine
from dynres.runtime.protocols import GenerationRequest, ReplicaKind


def fake_prompts(
    count: int | None = None,
    *,
    n: int = 1,
    prompt_tokens: int = 16,
    max_tokens: int = 1024,
    response_tokens: int | Callable[[int], int] | None = None,
    prefix: str = "p",
) -> Iterator[Any]:
    """Yield PromptGroups ``p0, p1, ...`` (endless when ``count`` is None).

    :param count: groups to yield (None = endless).
    :param n: responses per group (count).
    :param prompt_tokens: prompt length (tokens).
    :param max_tokens: response token limit (tokens).
    :param response_tokens: response length for fakes (tokens), or a function of the group
        index; None lets each FakeReplica use its own default.
    :param prefix: sample id prefix.
    """
    from itertools import count as _count

    from dynres.runtime.samples import PromptGroup

    indices = _count() if count is None else range(count)
    for i in indices:
        extra: dict[str, Any] = {}
        if response_tokens is not None:
            extra["response_tokens"] = response_tokens(i) if callable(response_tokens) else response_tokens
        yield PromptGroup(
            sample_id=f"{prefix}{i}",
            prompt_token_ids=range(prompt_tokens),
            n=n,
            max_tokens=max_tokens,
            extra=extra,
        )


class FakeCluster:
    """Standalone and hybrid fake replicas plus a fake trainer sharing one op log."""

    def __init__(
        self,
        n_standalone: int = 2,
        n_hybrid: int = 2,
        *,
        tokens_per_s: float = 2000.0,
        response_tokens: int | Callable[[GenerationRequest], int] = 20,
        latency: float | Mapping[str, float] = 0.0,
        phase_times: Mapping[str, float] | None = None,
        train_latency: float | Mapping[str, float] = 0.0,
        log_generate: bool = True,
    ) -> None:
        """Build ``n_standalone`` standalone (``s0``...) and ``n_hybrid`` hybrid (``h0``...) replicas.

        Replica arguments (tokens/s, response tokens, latency in seconds) apply to all replicas;
        ``phase_times`` (seconds per phase) and ``train_latency`` (seconds) to the trainer.
        """
        self.log: list[OpRecord] = []
        """Calls of every replica and the trainer in one list, in the order they happened."""
        kw: dict[str, Any] = {
            "tokens_per_s": tokens_per_s,
            "response_tokens": response_tokens,
            "latency": latency,
            "log": self.log,
            "log_generate": log_generate,
        }
        self.standalone = [FakeReplica(f"s{i}", ReplicaKind.STANDALONE, **kw) for i in range(n_standalone)]
        """Replicas on their own GPUs (``s0``...), awake from the start."""
        self.hybrid = [FakeReplica(f"h{i}", ReplicaKind.HYBRID, **kw) for i in range(n_hybrid)]
        """Replicas on the trainer's GPUs (``h0``...), asleep until the controller activates them."""
        self.engine = FakeTrainEngine(
            phase_times=phase_times if phase_times is not None else {"update_actor": 0.005},
            latency=train_latency,
            log=self.log,
        )
        """The fake train engine, logging into the same op log as the replicas."""
        self.retired: list[FakeReplica] = []
        """Replicas :meth:`restart` replaced, in order (their violations still count)."""
        self._kw = kw

    async def restart(self, old: Any) -> FakeReplica:
        """A :data:`~dynres.runtime.protocols.ReplicaRestarter`: a fresh replica with ``old``'s id,
        kind and arguments (a hybrid one starts asleep), in ``old``'s place in this cluster."""
        new = FakeReplica(old.replica_id, old.kind, **self._kw)
        for pool in (self.standalone, self.hybrid):
            pool[:] = [new if r is old else r for r in pool]
        self.retired.append(old)
        return new

    @property
    def replicas(self) -> list[FakeReplica]:
        """All replicas, standalone first."""
        return [*self.standalone, *self.hybrid]

    def violations(self) -> list[str]:
        """Every lifecycle violation recorded by any fake (must be empty)."""
        return [v for r in [*self.replicas, *self.retired] for v in r.violations] + self.engine.violations
