"""Driver-side proxies: the Replica and TrainEngine protocols, served by Ray actors.

Every method is ``await handle.method.remote(...)``: awaiting an ``ObjectRef`` suspends the
calling coroutine instead of blocking the loop the way ``ray.get`` would. A :class:`RayReplica`
is also a :class:`~dynres.runtime.protocols.BatchedReplica`: ``submit`` hands the balancer a
future that the remote call's reply completes through one callback (no task per request), and
``abort_batch`` takes all of a deactivation's partial results back in one remote call. A dead actor (crashed
engine, lost node) surfaces as a :class:`BackendError` naming the replica and its node, which the
balancer treats as "retry this request elsewhere"; ``health()`` then reports it unhealthy.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynres.core.errors import BackendError
from dynres.runtime.backends.ray._ray import is_actor_lost, remote_cause, require_ray
from dynres.runtime.backends.ray.actors import ActorInfo
from dynres.runtime.backends.ray.monitor import LoopLag
from dynres.runtime.protocols import (
    GenerationRequest,
    GenerationResult,
    OperationCosts,
    ReplicaHealth,
    ReplicaKind,
    TrainStepResult,
    WeightUpdate,
)


class _ActorProxy:
    """Common call path: await a remote method, translate Ray's failures into dynres errors."""

    def __init__(self, name: str, handle: Any, info: ActorInfo | None) -> None:
        self._name = name
        self._handle = handle
        self._info = info
        self.lost_reason: str | None = None
        """Why the actor is gone (None while it is alive, as far as this proxy knows)."""

    @property
    def handle(self) -> Any:
        """The Ray actor handle."""
        return self._handle

    @property
    def node_id(self) -> str:
        """Ray node id the actor was placed on ("" before start)."""
        return self._info.node_id if self._info else ""

    @property
    def pid(self) -> int:
        """Process id of the actor (0 before start)."""
        return self._info.pid if self._info else 0

    def _where(self) -> str:
        return f"{self._name!r} on node {self.node_id[:12] or '?'}"

    async def _call(self, method: str, *args: Any) -> Any:
        ray = require_ray()
        ref = getattr(self._handle, method).remote(*args)
        try:
            return await ref
        except asyncio.CancelledError:
            # Our caller gave up (deactivation, Ctrl-C): stop the remote coroutine as well so it
            # does not keep generating for nobody. ray.cancel only sends a request; it never blocks.
            ray.cancel(ref)
            raise
        except Exception as exc:
            err = self._translate(method, exc)
            if err is exc:
                raise
            raise err from exc

    def _translate(self, method: str, exc: BaseException) -> BaseException:
        """The error to raise for a failed remote call: a lost actor becomes a BackendError naming it."""
        if is_actor_lost(exc):
            self.lost_reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            err = BackendError(
                f"actor {self._where()} is lost during {method}() ({self.lost_reason}); "
                "its node or process died, so its work is retried on the other replicas"
            )
            err.__cause__ = exc
            return err
        return remote_cause(exc)  # the hosted object's own error, one line; Ray's stays its __cause__

    async def loop_lag(self, reset: bool = False) -> LoopLag:
        """The actor's worst event-loop gap since its last reset."""
        return await self._call("loop_lag", reset)

    def kill(self) -> None:
        """Kill the actor now (no restart); a no-op for an actor that is already gone."""
        try:
            require_ray().kill(self._handle, no_restart=True)
        except Exception:
            pass

    async def shutdown(self) -> None:
        """Shut the engine down, then kill the actor."""
        try:
            if self.lost_reason is None:
                await self._call("shutdown")
        finally:
            self.kill()


@dataclass(frozen=True)
class SpawnSpec:
    """How a replica's actor was created, so that a dead one can be created again the same way."""

    name: str
    """The first actor's name; a recreated one is ``<name>-r<generation>`` (a dead actor's name
    stays taken until Ray has cleaned it up)."""
    options: Mapping[str, Any]
    """Ray actor options: resources, its placement group bundle, concurrency."""
    args: tuple[Any, ...]
    """Arguments of the ReplicaActor: replica id, kind, factory, lag interval."""
    generation: int = 0
    """How many times it was recreated (count)."""


class RayReplica(_ActorProxy):
    """A :class:`~dynres.runtime.protocols.Replica` whose engine lives in a Ray actor."""

    def __init__(self, replica_id: str, kind: ReplicaKind, handle: Any, info: ActorInfo | None = None) -> None:
        """Wrap a started ReplicaActor handle; ``info`` is what its ``start()`` returned."""
        super().__init__(replica_id, handle, info)
        self.replica_id = replica_id
        self.kind = ReplicaKind(kind)
        self.spawn: SpawnSpec | None = None
        """How its actor was created (None: not by RayCluster, so it cannot be recreated)."""
        self.generated_tokens = 0
        """Response tokens this replica produced (output beyond what requests arrived with; count)."""
        # Partial output each resumed request arrived with, by request id, until its result
        # comes back: only resumed requests have an entry, so a fresh request costs nothing here.
        self._carried: dict[str, int] = {}

    def __repr__(self) -> str:
        """Short description with id, kind and node."""
        return f"RayReplica({self.replica_id!r}, {self.kind.value}, node={self.node_id[:12]})"

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate in the actor; raise BackendError when the actor is lost."""
        return await self.submit(request)

    def submit(self, request: GenerationRequest) -> asyncio.Future[GenerationResult]:
        """Start ``request`` in the actor; the future completes with its result or error.

        Cancelling the future cancels the remote call. A request whose partial result went back
        in an :meth:`abort_batch` reply never completes here (the balancer delivers that result).
        """
        loop = asyncio.get_running_loop()
        fut = _RemoteFuture(loop=loop)
        fut.request_id = request.request_id
        if request.partial_token_ids:
            self._carried[request.request_id] = len(request.partial_token_ids)
        ref = self._handle.generate.remote(request)
        fut.ref = ref
        ref.future().add_done_callback(functools.partial(_from_ray_thread, loop, self._settle, fut))
        return fut

    def _count(self, result: GenerationResult) -> None:
        """Add the tokens ``result`` holds beyond the partial output its request arrived with."""
        self.generated_tokens += len(result.token_ids) - self._carried.pop(result.request_id, 0)

    def _settle(self, fut: _RemoteFuture, reply: Any) -> None:
        """Complete ``fut`` with the remote generate call's reply (on the loop's thread)."""
        fut.ref = None  # the remote call has ended: nothing to cancel there any more
        result = None if reply.cancelled() or reply.exception() is not None else reply.result()
        if result is None:  # no reply of its own (cancelled, failed, or in an abort_batch reply)
            self._carried.pop(fut.request_id, None)
        else:
            self._count(result)
        if fut.done():
            return
        if reply.cancelled():
            fut.cancel()
        elif (exc := reply.exception()) is not None:
            fut.set_exception(self._translate("generate", exc))
        elif result is not None:
            fut.set_result(result)

    async def abort_batch(self, request_ids: Sequence[str] | None = None) -> list[GenerationResult]:
        """Abort in the actor (None = all) and return every aborted request's partial result in one reply.

        A lost actor has nothing to hand back (returns []): its requests fail on their own.
        """
        try:
            results: list[GenerationResult] = await self._call(
                "abort_batch", list(request_ids) if request_ids is not None else None
            )
        except BackendError:
            if self.lost_reason is not None:
                return []
            raise
        for r in results:
            self._count(r)
        return results

    async def abort(self, request_ids: Sequence[str] | None = None) -> list[str]:
        """Abort in the actor; a lost actor has nothing left to abort (returns [])."""
        try:
            return await self._call("abort", list(request_ids) if request_ids is not None else None)
        except BackendError:
            if self.lost_reason is not None:
                return []
            raise

    async def pause(self) -> None:
        """Pause generation in the actor."""
        await self._call("pause")

    async def resume(self) -> None:
        """Resume generation in the actor."""
        await self._call("resume")

    async def sleep(self, level: int = 1) -> None:
        """Put the engine to sleep (release KV cache, offload weights)."""
        await self._call("sleep", level)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Wake the engine up."""
        await self._call("wake_up", list(tags) if tags is not None else None)

    async def update_weights(self, update: WeightUpdate) -> None:
        """Send a weight update (an object-store payload is fetched by the actor itself)."""
        await self._call("update_weights", update)

    async def health(self) -> ReplicaHealth:
        """The actor's health; a lost actor is reported unhealthy instead of raising."""
        try:
            return await self._call("health")
        except BackendError as exc:
            if self.lost_reason is None:
                raise
            return ReplicaHealth(healthy=False, detail=str(exc))

    def costs(self) -> OperationCosts:
        """Cost estimates the engine reported at start (cached; this call is synchronous)."""
        return self._info.costs if self._info else OperationCosts()


class _RemoteFuture(asyncio.Future):
    """The driver's future of one remote generate call; cancelling it cancels the call."""

    ref: Any = None
    request_id: str = ""

    def cancel(self, msg: Any = None) -> bool:
        ref, self.ref = self.ref, None
        done = super().cancel(msg)
        if done and ref is not None:
            require_ray().cancel(ref)  # sends a request; never blocks
        return done


def _from_ray_thread(loop: asyncio.AbstractEventLoop, settle: Any, fut: _RemoteFuture, reply: Any) -> None:
    """Ray completes a reply on its own thread: hand it to the loop's thread."""
    try:
        loop.call_soon_threadsafe(settle, fut, reply)
    except RuntimeError:  # the loop closed meanwhile (end of run): nobody waits for it
        pass


class RayTrainEngine(_ActorProxy):
    """A :class:`~dynres.runtime.protocols.TrainEngine` living in a Ray actor."""

    def __init__(self, handle: Any, info: ActorInfo | None = None) -> None:
        """Wrap a started TrainEngineActor handle."""
        super().__init__("trainer", handle, info)

    def __repr__(self) -> str:
        """Short description with the node."""
        return f"RayTrainEngine(node={self.node_id[:12]})"

    async def train_step(self, batch: Sequence[Any]) -> TrainStepResult:
        """Run a fit step in the actor."""
        return await self._call("train_step", list(batch))

    async def offload(self) -> None:
        """Offload the trainer's memory."""
        await self._call("offload")

    async def onload(self) -> None:
        """Onload the trainer's memory."""
        await self._call("onload")

    async def export_weights(self) -> WeightUpdate:
        """Export weights; the payload stays in the object store (an ObjectRef)."""
        return await self._call("export_weights")

    def costs(self) -> OperationCosts:
        """Cost estimates the engine reported at start (cached)."""
        return self._info.costs if self._info else OperationCosts()

    @property
    def can_save_state(self) -> bool:
        """True when the hosted engine saves and loads its state (as its actor reported at start)."""
        return bool(self._info and self._info.can_save_state)

    async def save_state(self, path: str) -> None:
        """Save the engine's state into folder ``path``, written by the actor on its own node."""
        await self._call("save_state", path)

    async def load_state(self, path: str) -> None:
        """Load the engine's state from folder ``path``, read by the actor on its own node."""
        await self._call("load_state", path)
