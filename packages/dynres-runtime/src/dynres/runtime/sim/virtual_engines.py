"""The ``sim`` backend: a replica and a train engine whose operations take modelled time.

Both implement the protocols of :mod:`dynres.runtime.protocols` and only ever wait with
asyncio primitives on the running loop's clock, so on the simulator's virtual-time loop a
6-hour run takes seconds, while on an ordinary loop they behave like slow real engines (handy in
tests of the runtime).

**Replica model** (formulas in :mod:`dynres.runtime.sim.workload`). The ``c`` requests running on a
replica share its throughput equally: each advances at ``rate(c) = peak / (c + c_half)`` work
units per second (a work unit is one decoded token; prefilling a token costs ``prefill_cost``
units). Instead of a timer per token, the replica keeps one number ``S``, the work every running
request has received since the replica started (``dS/dt = rate(c)``, piecewise constant between
events), and a heap of the ``S`` value at which each request finishes. Starting, finishing or
aborting a request is one heap operation and one timer: the simulation is event-driven and costs
O(log c) per event however long the responses are.

**Shared host** (``cluster.shared_host``): replicas attached to one :class:`SharedHost` divide its
capacity; each one's peak is scaled by ``min(1, C / sum of the generating replicas' peaks)``.
Whenever a replica starts or stops generating, every replica on the host is brought up to date at
the old rates first and rescheduled at the new ones, so the event-driven model stays exact.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynres.core.errors import BackendError, ReplicaUnavailableError
from dynres.runtime.protocols import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    OperationCosts,
    ReplicaHealth,
    ReplicaKind,
    TrainStepResult,
    WeightUpdate,
)
from dynres.runtime.samples import Repeat
from dynres.runtime.sim.workload import host_scale, per_request_rate, request_work

RESPONSE_TOKENS_KEY = "sim_response_tokens"
"""Key of ``GenerationRequest.extra`` holding the modelled response length (tokens)."""

_EPS = 1e-9


@dataclass
class _Job:
    """One request running on a :class:`SimReplica`."""

    request: GenerationRequest
    prefix: int
    """Tokens generated before this attempt (partial rollout)."""
    target: int
    """Total tokens the response will have when it finishes."""
    prefill_work: float
    """Work units of (re-)prefill at the start of this attempt."""
    start_s: float
    """Replica service ``S`` when the attempt started (work units)."""
    finish_s: float
    """``S`` at which it finishes (work units)."""
    future: asyncio.Future[GenerationResult]
    seq: int
    active: bool = True


@dataclass(frozen=True)
class SimReplicaCosts:
    """Durations of a simulated replica's control operations (seconds)."""

    sleep_s: float = 0.0
    """Release KV cache and offload weights (seconds)."""
    wake_up_s: float = 0.0
    """Reload weights and KV cache (seconds; half of it per tag)."""
    abort_s: float = 0.0
    """Abort in-flight requests (seconds)."""
    update_weights_s: float = 0.0
    """Receive and load a weight update (seconds)."""


class SharedHost:
    """One host's generation capacity, divided among the replicas generating on it (a CPU-only machine)."""

    def __init__(self, capacity_tokens_per_s: float) -> None:
        """A host that generates at most ``capacity_tokens_per_s`` (tokens/s) over all its replicas."""
        if capacity_tokens_per_s <= 0:
            raise ValueError("SharedHost needs capacity_tokens_per_s > 0")
        self.capacity_tokens_per_s = float(capacity_tokens_per_s)
        """C: most tokens/s all replicas on the host generate together (tokens/s)."""
        self.replicas: list[SimReplica] = []
        """The replicas sharing the host."""
        self.scale = 1.0
        """Factor on each generating replica's peak now (fraction, <= 1)."""

    def attach(self, replica: SimReplica) -> None:
        """Put ``replica`` on this host."""
        replica.host = self
        self.replicas.append(replica)

    def advance(self, now: float) -> None:
        """Bring every replica's served work up to ``now`` at the current rates."""
        for r in self.replicas:
            r._advance(now)

    def refresh(self) -> bool:
        """Recompute :attr:`scale` from the replicas generating now; True if it changed."""
        busy = sum(r.peak_tokens_per_s for r in self.replicas if r._jobs and not r.paused)
        scale = host_scale(self.capacity_tokens_per_s, busy)
        changed = scale != self.scale
        self.scale = scale
        return changed

    def reschedule(self, loop: asyncio.AbstractEventLoop) -> None:
        """Re-arm every replica's next-finish timer at the new rates."""
        for r in self.replicas:
            r._loop = loop
            r._reschedule(loop)


class SimReplica:
    """A simulated inference replica: processor-shared decode on the loop's (virtual) clock."""

    def __init__(
        self,
        replica_id: str,
        kind: ReplicaKind = ReplicaKind.STANDALONE,
        *,
        peak_tokens_per_s: float,
        c_half: float,
        prefill_cost: float = 0.0,
        costs: SimReplicaCosts | None = None,
        response_tokens: Callable[[GenerationRequest], int] | None = None,
        asleep: bool = False,
    ) -> None:
        """A replica with saturated throughput ``peak_tokens_per_s`` (tokens/s) and half-point ``c_half``.

        ``response_tokens(request)`` gives a response's modelled length when the request's
        ``extra`` has no ``sim_response_tokens`` (default: its ``max_tokens``). ``asleep``
        starts it asleep (hybrid replicas start that way).
        """
        if peak_tokens_per_s <= 0 or c_half < 0:
            raise ValueError("SimReplica needs peak_tokens_per_s > 0 and c_half >= 0")
        self.replica_id = replica_id
        """Id the balancer routes by (``standalone-0``, ``hybrid-0``, ...)."""
        self.kind = kind
        """Standalone (own GPUs) or hybrid (shares the trainer's GPUs; starts asleep)."""
        self.peak_tokens_per_s = float(peak_tokens_per_s)
        """Saturated aggregate throughput (tokens/s)."""
        self.c_half = float(c_half)
        """Concurrency at half of peak throughput (requests)."""
        self.prefill_cost = float(prefill_cost)
        """Work of prefilling one token (decode tokens)."""
        self.op_costs = costs or SimReplicaCosts()
        """Durations of sleep, wake-up, abort and weight update (seconds)."""
        self._response_tokens = response_tokens
        self.weight_version = 0
        """Version of the weights it generates with (count of weight updates loaded)."""
        self.sleeping = asleep
        """True while asleep (no generation accepted)."""
        self.paused = False
        """True while paused (requests kept, no progress)."""
        self.closed = False
        """True after shutdown."""
        # Counters (diagnostics and the lower-bound cross-check).
        self.finished = 0
        """Requests finished (count)."""
        self.aborted = 0
        """Request attempts aborted (count)."""
        self.sleep_aborts = 0
        """Requests still running when sleep was called, aborted by it (count; should stay 0)."""
        self.work_done = 0.0
        """Work served, prefill included (decode-token equivalents)."""
        self.decode_tokens = 0
        """Response tokens produced (tokens)."""
        self.work_by_request: dict[str, float] = {}
        """Work served to each request id over all its attempts here, prefill included
        (decode-token equivalents); the gap decomposition's lost work reads it."""
        self._jobs: dict[str, _Job] = {}
        self._heap: list[tuple[float, int, _Job]] = []
        self._seq = itertools.count()
        self._service = 0.0  # S: work each running request has received (work units)
        self._t_last = 0.0  # loop time S was last brought up to date (seconds)
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._woken: set[str] = set() if asleep else {"weights", "kv_cache"}
        self.host: SharedHost | None = None
        """The shared host it generates on (None = its own GPUs; set by :meth:`SharedHost.attach`)."""

    # ---- Processor-sharing core ---------------------------------------------------------

    def _rate(self) -> float:
        if self.paused:
            return 0.0
        peak = self.peak_tokens_per_s if self.host is None else self.peak_tokens_per_s * self.host.scale
        return per_request_rate(len(self._jobs), peak, self.c_half)

    def _before(self, now: float) -> None:
        # Before a change of this replica's requests: on a shared host every replica's rate may
        # change with it, so all of them are brought up to date at the old rates.
        if self.host is None:
            self._advance(now)
        else:
            self.host.advance(now)

    def _after(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.host is not None and self.host.refresh():
            self.host.reschedule(loop)
        else:
            self._reschedule(loop)

    def _advance(self, now: float) -> None:
        dt = now - self._t_last
        if dt > 0 and self._jobs:
            rate = self._rate()
            self._service += dt * rate
            self.work_done += dt * rate * len(self._jobs)
        self._t_last = now

    def _reschedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        heap = self._heap
        while heap and not heap[0][2].active:
            heapq.heappop(heap)
        if not heap:
            return
        rate = self._rate()
        if rate <= 0:
            return
        delay = max(0.0, (heap[0][0] - self._service) / rate)
        self._timer = loop.call_at(self._t_last + delay, self._on_timer)

    def _on_timer(self) -> None:
        loop = self._loop
        assert loop is not None
        self._timer = None
        self._before(loop.time())
        heap = self._heap
        limit = self._service + _EPS * max(1.0, self._service)
        while heap and (not heap[0][2].active or heap[0][0] <= limit):
            _, _, job = heapq.heappop(heap)
            if job.active:
                self._finish(job)
        self._after(loop)

    def _finish(self, job: _Job) -> None:
        job.active = False
        del self._jobs[job.request.request_id]
        self.finished += 1
        self._served(job, job.finish_s - job.start_s)
        self.decode_tokens += job.target - job.prefix
        req = job.request
        reason: FinishReason = "length" if job.target >= req.max_tokens else "stop"
        if not job.future.done():
            job.future.set_result(
                GenerationResult(
                    request_id=req.request_id,
                    token_ids=range(job.target),
                    logprobs=Repeat(job.target, 0.0),
                    finish_reason=reason,
                    replica_id=self.replica_id,
                    weight_version=self.weight_version,
                )
            )

    def _abort_job(self, job: _Job) -> None:
        job.active = False
        del self._jobs[job.request.request_id]
        self.aborted += 1
        self._served(job, min(job.finish_s, self._service) - job.start_s)
        done = self._service - job.start_s - job.prefill_work
        generated = min(job.target - job.prefix, max(0, math.floor(done + _EPS)))
        self.decode_tokens += generated
        total = job.prefix + generated
        if not job.future.done():
            job.future.set_result(
                GenerationResult(
                    request_id=job.request.request_id,
                    token_ids=range(total),
                    logprobs=Repeat(total, 0.0),
                    finish_reason="abort",
                    replica_id=self.replica_id,
                    weight_version=self.weight_version,
                )
            )

    def _served(self, job: _Job, work: float) -> None:
        rid = job.request.request_id
        self.work_by_request[rid] = self.work_by_request.get(rid, 0.0) + max(0.0, work)

    def _target_tokens(self, request: GenerationRequest) -> int:
        value = request.extra.get(RESPONSE_TOKENS_KEY) if request.extra else None
        if value is None:
            value = self._response_tokens(request) if self._response_tokens else request.max_tokens
        return max(1, min(int(value), int(request.max_tokens)))

    # ---- Replica protocol ---------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Run ``request`` until it finishes (stop/length) or is aborted (``finish_reason="abort"``)."""
        if self.closed or self.sleeping:
            state = "shut down" if self.closed else "asleep"
            raise ReplicaUnavailableError(
                f"replica {self.replica_id!r} is {state} and cannot generate {request.request_id!r}; "
                "route requests only to awake replicas"
            )
        if request.request_id in self._jobs:
            raise BackendError(
                f"replica {self.replica_id!r} is already generating {request.request_id!r}; a "
                "request id may run on one replica at a time"
            )
        loop = self._loop = asyncio.get_running_loop()
        self._before(loop.time())
        prefix = len(request.partial_token_ids)
        target = max(self._target_tokens(request), prefix)
        prefill = self.prefill_cost * (len(request.prompt_token_ids) + prefix)
        work = request_work(len(request.prompt_token_ids), prefix, target, self.prefill_cost)
        job = _Job(
            request=request,
            prefix=prefix,
            target=target,
            prefill_work=prefill,
            start_s=self._service,
            finish_s=self._service + work,
            future=loop.create_future(),
            seq=next(self._seq),
        )
        self._jobs[request.request_id] = job
        heapq.heappush(self._heap, (job.finish_s, job.seq, job))
        self._after(loop)
        try:
            return await job.future
        except asyncio.CancelledError:
            if job.active:
                self._before(loop.time())
                self._abort_job(job)
                self._after(loop)
            raise

    async def abort(self, request_ids: Sequence[str] | None = None) -> list[str]:
        """Abort the given requests (None = all); their ``generate`` returns at once with the partial output."""
        loop = self._loop = asyncio.get_running_loop()
        self._before(loop.time())
        ids = list(self._jobs) if request_ids is None else [r for r in request_ids if r in self._jobs]
        for rid in ids:
            self._abort_job(self._jobs[rid])
        self._after(loop)
        if self.op_costs.abort_s > 0:
            await asyncio.sleep(self.op_costs.abort_s)
        return ids

    async def pause(self) -> None:
        """Stop decoding; running requests keep their progress."""
        loop = self._loop = asyncio.get_running_loop()
        self._before(loop.time())
        self.paused = True
        self._after(loop)

    async def resume(self) -> None:
        """Continue decoding after :meth:`pause`."""
        loop = self._loop = asyncio.get_running_loop()
        self._before(loop.time())
        self.paused = False
        self._after(loop)

    async def sleep(self, level: int = 1) -> None:
        """Free the GPU: abort anything still running (counted in ``sleep_aborts``), then sleep."""
        if self._jobs:
            self.sleep_aborts += len(self._jobs)
            await self.abort(None)
        self.sleeping = True
        self._woken.clear()
        if self.op_costs.sleep_s > 0:
            await asyncio.sleep(self.op_costs.sleep_s)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Reload ``tags`` (``"weights"``, ``"kv_cache"``; None = both); half the wake-up cost each."""
        wanted = {"weights", "kv_cache"} if tags is None else set(tags)
        unknown = wanted - {"weights", "kv_cache"}
        if unknown:
            raise BackendError(
                f"replica {self.replica_id!r}: unknown wake_up tag {sorted(unknown)[0]!r}; use "
                "'weights' and/or 'kv_cache'"
            )
        todo = wanted - self._woken
        if todo and self.op_costs.wake_up_s > 0:
            await asyncio.sleep(self.op_costs.wake_up_s * len(todo) / 2)
        self._woken |= wanted
        if self._woken >= {"weights", "kv_cache"}:
            self.sleeping = False

    async def update_weights(self, update: WeightUpdate) -> None:
        """Take ``update_weights_s`` seconds, then serve with ``update.version``."""
        if self.op_costs.update_weights_s > 0:
            await asyncio.sleep(self.op_costs.update_weights_s)
        self.weight_version = update.version

    async def health(self) -> ReplicaHealth:
        """Healthy unless shut down; in-flight count and sleep state."""
        return ReplicaHealth(healthy=not self.closed, in_flight=len(self._jobs), sleeping=self.sleeping)

    def costs(self) -> OperationCosts:
        """The modelled durations of the control operations."""
        c = self.op_costs
        return OperationCosts(
            sleep_s=c.sleep_s, wake_up_s=c.wake_up_s, abort_s=c.abort_s, update_weights_s=c.update_weights_s
        )

    async def shutdown(self) -> None:
        """Abort everything and refuse further work."""
        if self._jobs:
            await self.abort(None)
        self.closed = True

    @property
    def in_flight(self) -> int:
        """Requests running now (count)."""
        return len(self._jobs)

    @property
    def generated_tokens(self) -> int:
        """Response tokens produced, counted when a request finishes or is aborted (see
        :func:`~dynres.runtime.protocols.generated_tokens`; tokens)."""
        return self.decode_tokens

    def __repr__(self) -> str:
        """Id, kind and load."""
        return f"SimReplica({self.replica_id!r}, {self.kind.value}, in_flight={len(self._jobs)})"


# ---- Trainer ---------------------------------------------------------------------------------


def sample_tokens(sample: Any) -> float:
    """Tokens a trainer processes for one batch item: prompt + response tokens of each response.

    Accepts a :class:`dynres.runtime.samples.Sample` (or anything with ``group.prompt_token_ids``
    and ``responses[*].token_ids``) or a plain number of tokens.
    """
    if isinstance(sample, (int, float)):
        return float(sample)
    group = getattr(sample, "group", None)
    responses = getattr(sample, "responses", None)
    if group is None or responses is None:
        raise BackendError(
            f"SimTrainEngine cannot count the tokens of a {type(sample).__name__}; pass Sample "
            "objects (or token counts)"
        )
    prompt = len(group.prompt_token_ids)
    return float(sum(prompt + len(r.token_ids) for r in responses))


@dataclass(frozen=True)
class SimTrainCosts:
    """Durations of the simulated trainer's memory and weight operations (seconds)."""

    offload_s: float = 0.0
    """Move parameters and optimizer state off the GPUs (seconds)."""
    onload_s: float = 0.0
    """Bring them back (seconds)."""
    export_weights_s: float = 0.0
    """Export one weight update (seconds)."""


class SimTrainEngine:
    """A simulated trainer: a fit step takes ``step_seconds(batch tokens)`` of loop time."""

    def __init__(
        self,
        *,
        step_seconds: Callable[[float], float],
        phase_fractions: Mapping[str, float] | None = None,
        costs: SimTrainCosts | None = None,
        tokens_of: Callable[[Any], float] = sample_tokens,
    ) -> None:
        """``step_seconds(tokens)`` is the compute time of a batch of ``tokens`` tokens (seconds)."""
        self._step_seconds = step_seconds
        self.phase_fractions = dict(phase_fractions or {"update_actor": 1.0})
        """Split of a step's compute time over trainer phases (fractions)."""
        self.op_costs = costs or SimTrainCosts()
        """Durations of offload, onload and export (seconds)."""
        self._tokens_of = tokens_of
        self.version = 0
        """Weight version: number of updates exported (count)."""
        self.offloaded = False
        """True while parameters are off the GPUs."""
        self.steps = 0
        """Fit steps run (count)."""
        self.compute_s = 0.0
        """Sum of fit-step compute times (seconds)."""
        self.tokens = 0.0
        """Tokens trained on (tokens)."""
        self.batch_sizes: list[int] = []
        """Samples per fit step, in order (count each)."""

    async def train_step(self, batch: Sequence[Any]) -> TrainStepResult:
        """Take the modelled compute time of ``batch`` and report it split over phases."""
        if self.offloaded:
            raise BackendError(
                "SimTrainEngine.train_step called while the trainer is offloaded (hybrid replicas "
                "hold its GPUs); onload before training"
            )
        tokens = float(sum(self._tokens_of(s) for s in batch))
        seconds = float(self._step_seconds(tokens))
        if seconds > 0:
            await asyncio.sleep(seconds)
        self.steps += 1
        self.compute_s += seconds
        self.tokens += tokens
        self.batch_sizes.append(len(batch))
        phases = {p: seconds * f for p, f in self.phase_fractions.items()}
        return TrainStepResult(phase_times=phases, metrics={"sim/batch_tokens": tokens})

    async def offload(self) -> None:
        """Free the trainer's GPU memory for hybrid replicas (takes ``offload_s``)."""
        if self.op_costs.offload_s > 0:
            await asyncio.sleep(self.op_costs.offload_s)
        self.offloaded = True

    async def onload(self) -> None:
        """Take the GPU memory back (takes ``onload_s``)."""
        if self.op_costs.onload_s > 0:
            await asyncio.sleep(self.op_costs.onload_s)
        self.offloaded = False

    async def export_weights(self) -> WeightUpdate:
        """Export the next weight version (takes ``export_weights_s``)."""
        if self.op_costs.export_weights_s > 0:
            await asyncio.sleep(self.op_costs.export_weights_s)
        self.version += 1
        return WeightUpdate(version=self.version)

    def costs(self) -> OperationCosts:
        """The modelled durations of offload, onload and export."""
        c = self.op_costs
        return OperationCosts(offload_s=c.offload_s, onload_s=c.onload_s, export_weights_s=c.export_weights_s)

    async def shutdown(self) -> None:
        """Nothing to release."""
        return None
