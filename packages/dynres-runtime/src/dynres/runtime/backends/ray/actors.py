"""The Ray actors of the Ray backend: one per replica and one for the train engine.

Each actor is an *async* actor: its methods are coroutines served on one asyncio loop, so many
``generate`` calls run concurrently and an ``abort`` reaches a replica while it is generating.
Nothing inside blocks that loop: hosted objects are awaited, object-store reads use ``await ref``
and object-store writes run in a worker thread. Every actor carries a :class:`LoopLagMonitor`
so that tests (and operators) can prove it.

A replica actor answers ``abort_batch`` for any hosted replica: one reply with every aborted
request's partial result, so the driver's balancer takes a deactivation back in one message per
replica (see :class:`~dynres.runtime.protocols.BatchedReplica`). A hosted replica that has
``abort_batch`` itself is asked directly; for one that has only ``abort`` the actor aborts, waits
for the aborted ``generate`` calls and collects their results. Either way the ``generate`` calls
whose results went into the reply return ``None`` to the driver, which drops them.

The classes are plain Python; :func:`dynres.runtime.backends.ray._ray.remote_class` turns them
into Ray actor classes on first use, so importing this module never imports Ray.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from dynres.core.errors import BackendError, RuntimeStateError
from dynres.runtime.backends.ray._ray import require_ray
from dynres.runtime.backends.ray.factory import Factory
from dynres.runtime.backends.ray.monitor import LoopLag, LoopLagMonitor
from dynres.runtime.protocols import (
    CheckpointableTrainEngine,
    GenerationRequest,
    GenerationResult,
    OperationCosts,
    Replica,
    ReplicaHealth,
    TrainEngine,
    TrainStepResult,
    WeightUpdate,
    pass_outcome,
    takes_batched_path,
)


@dataclass(frozen=True)
class ActorInfo:
    """Where an actor runs and what its hosted object reports, returned by ``start``."""

    name: str
    """Replica id, or ``"trainer"``."""
    node_id: str
    """Ray node id (hex) the actor runs on."""
    pid: int
    """Process id of the actor."""
    costs: OperationCosts
    """The hosted object's own cost estimates."""
    build_s: float
    """Wall time the factory took to build the hosted object (seconds)."""
    can_save_state: bool = False
    """The hosted object saves and loads its state (a CheckpointableTrainEngine)."""


def _node_id() -> str:
    return require_ray().get_runtime_context().get_node_id()


async def _resolve_payload(update: WeightUpdate) -> WeightUpdate:
    """Fetch a weight payload that travels as an object-store reference (without blocking)."""
    ray = require_ray()
    if isinstance(update.payload, ray.ObjectRef):
        return replace(update, payload=await update.payload)
    return update


class _Hosted:
    """Shared plumbing: build the hosted object once, monitor the loop, answer lag queries."""

    def __init__(self, name: str, factory: Factory, lag_interval_s: float) -> None:
        self._name = name
        self._factory = factory
        self._obj: Any = None
        self._monitor = LoopLagMonitor(lag_interval_s)
        self._start_lock: asyncio.Lock | None = None

    async def _build(self, **identity: Any) -> ActorInfo:
        self._monitor.start()
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            t0 = time.perf_counter()
            if self._obj is None:
                self._obj = await self._factory.build(**identity)
            build_s = time.perf_counter() - t0
        saves = isinstance(self._obj, CheckpointableTrainEngine)
        return ActorInfo(self._name, _node_id(), os.getpid(), self._obj.costs(), build_s, saves)

    def _hosted(self) -> Any:
        if self._obj is None:
            raise RuntimeStateError(f"actor {self._name!r} was used before start(); call start() first")
        return self._obj

    async def loop_lag(self, reset: bool = False) -> LoopLag:
        """Worst event-loop gap of this actor since the last reset (see LoopLagMonitor)."""
        self._monitor.start()
        return self._monitor.snapshot(reset=reset)

    async def ping(self) -> str:
        """Answer with this actor's node id (liveness and placement checks)."""
        return _node_id()


class ReplicaActor(_Hosted):
    """Hosts one :class:`Replica` (vLLM engine, fake, simulated) in its own process."""

    def __init__(self, replica_id: str, kind: str, factory: Factory, lag_interval_s: float = 0.01) -> None:
        """Remember how to build the replica; :meth:`start` builds it."""
        super().__init__(replica_id, factory, lag_interval_s)
        self._kind = kind
        # request id -> (the hosted replica's future or task, what the generate call returns, the
        # callback that passes one on to the other)
        self._calls: dict[
            str, tuple[asyncio.Future[GenerationResult], asyncio.Future[GenerationResult | None], Any]
        ] = {}

    async def start(self) -> ActorInfo:
        """Build the replica (``factory(replica_id=..., kind=..., **kwargs)``); idempotent."""
        info = await self._build(replica_id=self._name, kind=self._kind)
        replica = self._obj
        if not isinstance(replica, Replica):
            raise BackendError(
                f"replica {self._name!r}: factory {self._factory.target!r} built a "
                f"{type(replica).__name__}, which does not implement the Replica protocol"
            )
        return info

    async def generate(self, request: GenerationRequest) -> GenerationResult | None:
        """Generate one response (see Replica.generate); None when it went back in an abort_batch reply."""
        hosted = self._hosted()
        rid = request.request_id
        inner: asyncio.Future[GenerationResult] = (
            hosted.submit(request) if takes_batched_path(hosted) else asyncio.ensure_future(hosted.generate(request))
        )
        out: asyncio.Future[GenerationResult | None] = asyncio.get_running_loop().create_future()
        cb = functools.partial(pass_outcome, out)
        inner.add_done_callback(cb)
        self._calls[rid] = (inner, out, cb)
        try:
            return await out
        finally:
            if not inner.done():
                inner.cancel()  # the driver cancelled this call
            if self._calls.get(rid, (None, None, None))[1] is out:
                del self._calls[rid]

    async def abort_batch(self, request_ids: Sequence[str] | None = None) -> list[GenerationResult]:
        """Abort requests (None = all in flight) and return their partial results in one reply."""
        hosted = self._hosted()
        if takes_batched_path(hosted):
            results = list(await hosted.abort_batch(request_ids))
        else:
            ids = list(self._calls) if request_ids is None else [r for r in request_ids if r in self._calls]
            calls = [self._calls[r] for r in ids]
            for inner, _, cb in calls:
                inner.remove_done_callback(cb)  # the results are collected here instead
            try:
                await hosted.abort(ids)
            finally:
                ended = await asyncio.gather(*(inner for inner, _, _ in calls), return_exceptions=True)
            results = []
            for (inner, out, _), res in zip(calls, ended, strict=True):
                if isinstance(res, GenerationResult) and res.finish_reason == "abort":
                    results.append(res)
                else:  # it finished (or failed) before the abort reached it: its own call answers
                    pass_outcome(out, inner)
        for res in results:
            call = self._calls.get(res.request_id)
            if call is not None and not call[1].done():
                call[1].set_result(None)
        return results

    async def abort(self, request_ids: Sequence[str] | None = None) -> list[str]:
        """Abort requests, None = all in flight; return the aborted ids."""
        return list(await self._hosted().abort(request_ids))

    async def pause(self) -> None:
        """Stop scheduling new tokens, keep requests."""
        await self._hosted().pause()

    async def resume(self) -> None:
        """Resume after pause."""
        await self._hosted().resume()

    async def sleep(self, level: int = 1) -> None:
        """Release KV cache (and offload weights at level 1)."""
        await self._hosted().sleep(level)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Reallocate weights and/or KV cache."""
        await self._hosted().wake_up(tags)

    async def update_weights(self, update: WeightUpdate) -> None:
        """Load a weight update; an object-store payload is fetched here, not on the driver."""
        await self._hosted().update_weights(await _resolve_payload(update))

    async def health(self) -> ReplicaHealth:
        """The replica's own health report."""
        return await self._hosted().health()

    async def shutdown(self) -> None:
        """Stop the engine (the caller kills the actor afterwards)."""
        if self._obj is not None:
            await self._obj.shutdown()
        await self._monitor.stop()


class TrainEngineActor(_Hosted):
    """Hosts the :class:`TrainEngine` in its own process, on the trainer's placement bundle."""

    def __init__(self, factory: Factory, lag_interval_s: float = 0.01) -> None:
        """Remember how to build the engine; :meth:`start` builds it."""
        super().__init__("trainer", factory, lag_interval_s)

    async def start(self) -> ActorInfo:
        """Build the train engine (``factory(**kwargs)``); idempotent."""
        info = await self._build()
        if not isinstance(self._obj, TrainEngine):
            raise BackendError(
                f"trainer: factory {self._factory.target!r} built a {type(self._obj).__name__}, "
                "which does not implement the TrainEngine protocol"
            )
        return info

    async def train_step(self, batch: Sequence[Any]) -> TrainStepResult:
        """Run one fit step on ``batch``."""
        return await self._hosted().train_step(batch)

    async def offload(self) -> None:
        """Free accelerator memory for the hybrid replicas."""
        await self._hosted().offload()

    async def onload(self) -> None:
        """Restore what offload freed."""
        await self._hosted().onload()

    async def export_weights(self) -> WeightUpdate:
        """Export weights; a payload goes to the object store once and replicas fetch it directly.

        The update handed back carries an ``ObjectRef`` instead of the tensors, so the weights
        never travel through the coordinator, and N replicas read one stored copy.
        """
        update = await self._hosted().export_weights()
        if update.payload is None:
            return update
        ray = require_ray()
        # ray.put copies the payload into shared memory: run it off the loop so a large
        # model does not stall this actor's other calls.
        ref = await asyncio.to_thread(ray.put, update.payload)
        return replace(update, payload=ref)

    async def save_state(self, path: str) -> None:
        """Save the engine's state into folder ``path`` (on this actor's node)."""
        await self._checkpointable("save_state").save_state(path)

    async def load_state(self, path: str) -> None:
        """Load the engine's state from folder ``path`` (on this actor's node)."""
        await self._checkpointable("load_state").load_state(path)

    def _checkpointable(self, op: str) -> Any:
        hosted = self._hosted()
        if not isinstance(hosted, CheckpointableTrainEngine):
            raise BackendError(f"trainer: {type(hosted).__name__} has no {op}(); it cannot be checkpointed")
        return hosted

    async def shutdown(self) -> None:
        """Release the engine."""
        if self._obj is not None:
            await self._obj.shutdown()
        await self._monitor.stop()
