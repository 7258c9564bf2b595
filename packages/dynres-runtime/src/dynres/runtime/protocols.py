"""Backend protocols: what the controller, balancer and loops need from replicas and trainers.

The operations mirror what a vLLM ``AsyncLLM`` engine really offers (generate from token ids,
``abort``, ``pause_generation``/``resume_generation``, ``sleep(level)``/``wake_up(tags)``,
``reset_prefix_cache``, weight reload) and what a trainer engine can do (train step with
per-phase timings, offload/onload, export weights), so that the ``sim``, ``ray``, ``vllm`` and
``torch``/``megatron`` backends implement the same shapes.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable


class ReplicaKind(str, enum.Enum):
    """Where a replica lives: on dedicated rollout GPUs or on the trainer's GPUs."""

    STANDALONE = "standalone"
    HYBRID = "hybrid"


@dataclass(frozen=True)
class GenerationRequest:
    """One response to generate (a sample of ``rollout.n`` responses issues ``n`` requests)."""

    request_id: str
    """Unique id of this response's generation; stable across abort/retry (sticky-session key)."""
    sample_id: str
    """Id of the sample (prompt group) the response belongs to."""
    prompt_token_ids: Sequence[int]
    """Prompt tokens (any int sequence; the simulator uses ``range`` objects to stay cheap)."""
    max_tokens: int
    """Upper bound of generated tokens, partial output included (count)."""
    partial_token_ids: Sequence[int] = ()
    """Tokens generated before an abort; a resumed request continues after them (partial rollout)."""
    partial_logprobs: Sequence[float] = ()
    """Log-probs of ``partial_token_ids`` (one per token)."""
    temperature: float = 1.0
    """Sampling temperature (0 = greedy)."""
    seed: int | None = None
    """Sampling seed, for reproducible generations."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Backend-specific data (e.g. the simulator's modelled response length)."""
    prompt_id: str | None = None
    """The prompt's identity across epochs (PromptGroup.prompt_id; None: unknown)."""

    def resumed(self, partial_token_ids: Sequence[int], partial_logprobs: Sequence[float]) -> GenerationRequest:
        """Return a copy that resumes after ``partial_token_ids`` (all output so far)."""
        # A plain field copy instead of dataclasses.replace: this runs once per aborted request,
        # thousands of times in one deactivation, and replace() re-runs field introspection.
        new = object.__new__(GenerationRequest)
        new.__dict__.update(self.__dict__)
        new.__dict__["partial_token_ids"] = partial_token_ids
        new.__dict__["partial_logprobs"] = partial_logprobs
        return new


FinishReason = Literal["stop", "length", "abort"]
"""Why a generation ended: stop token, token limit, or aborted (resumable)."""


@dataclass(frozen=True)
class GenerationResult:
    """What a replica returns for a request; ``finish_reason == "abort"`` means resumable."""

    request_id: str
    """Id of the GenerationRequest this answers (unique within a run)."""
    token_ids: Sequence[int]
    """All generated tokens, the request's partial output included."""
    logprobs: Sequence[float]
    """Log-prob of each generated token."""
    finish_reason: FinishReason
    """Why generation ended."""
    replica_id: str
    """Replica that produced the last tokens."""
    weight_version: int = 0
    """Weight version the last tokens were generated with."""

    @property
    def aborted(self) -> bool:
        """True when the generation was aborted and can resume from ``token_ids``."""
        return self.finish_reason == "abort"


@dataclass(frozen=True)
class WeightUpdate:
    """Weights exported by a trainer for the replicas (payload is backend-specific)."""

    version: int
    """Weight version (the trainer's param version after the step)."""
    payload: Any = None
    """Backend data: buckets of tensors, a shared-memory path, or None in simulation."""
    nbytes: int = 0
    """Size of the weights (bytes)."""


@dataclass(frozen=True)
class OperationCosts:
    """A backend's own estimate of what each operation costs (seconds; None = unknown)."""

    sleep_s: float | None = None
    """Release KV cache and offload weights."""
    wake_up_s: float | None = None
    """Reload weights and KV cache."""
    abort_s: float | None = None
    """Abort all in-flight requests."""
    update_weights_s: float | None = None
    """Receive and load one weight update."""
    offload_s: float | None = None
    """Trainer: move parameters and optimizer state off the GPU."""
    onload_s: float | None = None
    """Trainer: bring them back."""
    export_weights_s: float | None = None
    """Trainer: export one weight update."""


@dataclass(frozen=True)
class ReplicaHealth:
    """Health of a replica as the replica reports it."""

    healthy: bool
    """False when the replica cannot serve (dead engine, lost node)."""
    in_flight: int = 0
    """Requests running on it (count)."""
    sleeping: bool = False
    """True while asleep."""
    detail: str = ""
    """Human-readable reason when unhealthy."""


@runtime_checkable
class Replica(Protocol):
    """An inference replica (one engine). Every operation is a coroutine; none blocks the loop."""

    replica_id: str
    """Unique id, used by the balancer and in logs."""
    kind: ReplicaKind
    """Standalone (own GPUs, always generating) or hybrid (shares the trainer's GPUs)."""

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate until stop/limit, or return early with ``finish_reason="abort"`` when aborted."""
        ...

    async def abort(self, request_ids: Sequence[str] | None = None) -> list[str]:
        """Abort the given requests (None = all in flight); return the ids that were aborted.

        Each aborted ``generate`` call returns (soon after) with ``finish_reason="abort"`` and
        all tokens generated so far; unknown or finished ids are ignored.
        """
        ...

    async def pause(self) -> None:
        """Stop scheduling new tokens but keep requests (vLLM ``pause_generation(mode="keep")``)."""
        ...

    async def resume(self) -> None:
        """Resume after :meth:`pause` (vLLM ``resume_generation``)."""
        ...

    async def sleep(self, level: int = 1) -> None:
        """Release KV cache (level 1 also offloads weights to CPU; level 2 discards them).

        Called only with no request in flight (the controller aborts and drains first). A
        replica that slept stays paused: ``wake_up`` reallocates memory but schedules nothing
        until :meth:`resume`, so the controller decides when it becomes productive.
        """
        ...

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Reallocate memory: ``tags`` among ``"weights"``, ``"kv_cache"`` (None = all).

        The controller wakes ``["weights"]``, loads the new weights, then wakes ``["kv_cache"]``.
        """
        ...

    async def update_weights(self, update: WeightUpdate) -> None:
        """Load a weight update and reset the prefix cache."""
        ...

    async def health(self) -> ReplicaHealth:
        """Report health, in-flight count and sleep state."""
        ...

    def costs(self) -> OperationCosts:
        """The replica's own estimate of each operation's cost."""
        ...

    async def shutdown(self) -> None:
        """Stop the engine and free its resources."""
        ...


def lost_reason(replica: object) -> str | None:
    """Why ``replica`` is gone for good (its actor, process or node died), from its optional
    ``lost_reason`` attribute; None while it may still answer (or when it does not say).

    A lost replica can never pass a health probe: the controller recreates it at once
    (:data:`ReplicaRestarter`) instead of probing it.
    """
    return getattr(replica, "lost_reason", None) or None


ReplicaRestarter = Callable[[Replica], Awaitable[Replica]]
"""Recreates a gone replica: called with the old one, returns a new one with the same
``replica_id`` and ``kind``, built from the same spec on a placement that fits (the old one is
released first) and started, but not yet loaded with the run's weights (the controller does that).
Raises when it cannot; the controller then retries after a backoff or quarantines it."""


def generated_tokens(replica: object) -> int | None:
    """Response tokens ``replica`` generated so far, from its optional ``generated_tokens`` counter.

    An engine that keeps the counter adds each request's new tokens (its output beyond the
    partial output it arrived with) when the request finishes or is aborted, so a replica that
    is deactivated (all its requests aborted) has counted all it produced. None when the engine
    keeps no such counter (count).
    """
    value = getattr(replica, "generated_tokens", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class BatchedReplica(Protocol):
    """Optional, on top of :class:`Replica`: requests as futures and an abort that answers once.

    A replica that has both methods lets the load balancer take a whole deactivation's aborted
    requests back in one reply per replica and hand them on a bounded number per loop
    iteration, instead of one wake-up per request at the moment of the abort (what keeps the
    coordinator's loop responsive with tens of thousands of requests in flight). Engines
    without them keep working unchanged: the balancer then awaits ``generate`` and ``abort``.
    """

    def submit(self, request: GenerationRequest) -> asyncio.Future[GenerationResult]:
        """Start generating ``request``; the future completes as ``generate`` would return or raise.

        Cancelling the future ends the request on the replica.
        """
        ...

    async def abort_batch(self, request_ids: Sequence[str] | None = None) -> Sequence[GenerationResult]:
        """Abort the given requests (None = all) and return their partial results in one reply.

        Each result has ``finish_reason="abort"`` and every token generated so far. The futures
        :meth:`submit` returned for these requests never complete: the caller delivers the
        results itself. Unknown or finished ids are left out.
        """
        ...


_BATCHED: dict[type, bool] = {}


def takes_batched_path(replica: object) -> bool:
    """True when ``replica`` is a :class:`BatchedReplica` to drive through ``submit`` and ``abort_batch``.

    Decided by the class (cached): both methods must be defined on it, not reached through
    ``__getattr__``. A subclass that overrides ``generate`` or ``abort`` below the class that
    defines them, or an instance whose ``generate`` or ``abort`` was replaced (a wrapper that
    injects faults), takes the plain path, so that code keeps running.
    """
    cls = type(replica)
    ok = _BATCHED.get(cls)
    if ok is None:
        mro = cls.__mro__

        def owner(name: str) -> int:
            return next((i for i, c in enumerate(mro) if name in c.__dict__), len(mro))

        ok = (
            owner("submit") < len(mro)
            and owner("abort_batch") < len(mro)
            and owner("generate") >= owner("submit")
            and owner("abort") >= owner("abort_batch")
        )
        _BATCHED[cls] = ok
    if ok:
        own = getattr(replica, "__dict__", None)
        return not (own and ("generate" in own or "abort" in own))
    return False


@dataclass(frozen=True)
class TrainStepResult:
    """What one trainer fit step reports."""

    phase_times: Mapping[str, float]
    """Seconds per phase (``reward``, ``old_log_prob``, ``ref``, ``adv``, ``update_actor``, ...)."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Training metrics (e.g. ``reward/mean``, ``loss``)."""


@runtime_checkable
class TrainEngine(Protocol):
    """The trainer side: fit steps, memory hand-over to hybrid replicas, weight export."""

    async def train_step(self, batch: Sequence[Any]) -> TrainStepResult:
        """Run one fit step on a batch of finished samples; report per-phase times.

        An error whose ``retryable`` attribute is true says the step changed nothing and may be
        run again: the runtime retries it once with the same batch. Any other error (or no
        answer within the op timeout) ends the run with a report and a checkpoint that holds
        the batch.
        """
        ...

    async def offload(self) -> None:
        """Free GPU memory held by parameters and optimizer state (so hybrid replicas can use it)."""
        ...

    async def onload(self) -> None:
        """Restore what :meth:`offload` freed, bit-exact."""
        ...

    async def export_weights(self) -> WeightUpdate:
        """Export the current weights as one update for the replicas."""
        ...

    def costs(self) -> OperationCosts:
        """The engine's own estimate of each operation's cost."""
        ...

    async def shutdown(self) -> None:
        """Release the engine's resources."""
        ...


@runtime_checkable
class CheckpointableTrainEngine(Protocol):
    """A train engine whose state (weights, optimizer, step counters) can be saved and loaded.

    A run checkpoint (:mod:`dynres.runtime.loop.checkpoint`) calls :meth:`save_state` between two
    cycles with a fresh directory, and a resumed run calls :meth:`load_state` on a freshly built
    engine before its first cycle. The directory must be one the engine's own process can write
    and read (on several nodes: shared storage).
    """

    async def save_state(self, path: str) -> None:
        """Write the weights, the optimizer state and the step counters into directory ``path``
        (it exists and is empty); an offloaded engine stays offloaded."""
        ...

    async def load_state(self, path: str) -> None:
        """Load what :meth:`save_state` wrote into ``path``; raise BackendError naming what does
        not fit (another model shape, a missing file)."""
        ...


def pass_outcome(out: asyncio.Future[Any], inner: asyncio.Future[Any]) -> None:
    """Give ``out`` the outcome of the finished ``inner`` (result, error or cancellation) unless it
    already has one: how a :class:`BatchedReplica` future reaches the future a caller waits on."""
    if out.done():
        return
    if inner.cancelled():
        out.cancel()
    elif (exc := inner.exception()) is not None:
        out.set_exception(exc)
    else:
        out.set_result(inner.result())
