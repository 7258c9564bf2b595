"""The fake replica: an in-process inference engine with vLLM-like lifecycle rules.

Each request in flight is a small state machine (:class:`_Gen`) driven by wake-ups from the
replica's :class:`~dynres.runtime.backends.fake.timer.WakeupTimer` rather than a coroutine, so a
request costs a future and a few fields, and a batch abort hands results back without waking
any request. A request gains ``tokens_per_s`` tokens per second; token ``i`` of a response has
id ``i``, so a response resumed after an abort ends with exactly the tokens of one that was
never interrupted: ``range(0, length)``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from dynres.core.errors import BackendError, ConfigError
from dynres.runtime.backends.fake.faults import REPLICA_OPS, FaultsMixin, FaultSpec, OpRecord, fault_map, latency_map
from dynres.runtime.backends.fake.timer import TakeOutBudget, WakeupTimer
from dynres.runtime.protocols import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    OperationCosts,
    ReplicaHealth,
    ReplicaKind,
    WeightUpdate,
)
from dynres.runtime.samples import Repeat


class _GenFuture(asyncio.Future):
    """The future of one request; cancelling it ends the request on its replica."""

    gen: _Gen | None = None

    def cancel(self, msg: Any = None) -> bool:
        done = super().cancel(msg)
        gen = self.gen
        if done and gen is not None:
            self.gen = None
            gen.end(None)
        return done


class _Gen:
    # One per request in flight: a state machine driven by timers and wake-ups instead of a
    # coroutine, so a request costs a future and a few fields, and an abort that hands results
    # back in one batch needs no per-request wake-up at all.
    __slots__ = ("aborted", "future", "progress", "remaining_s", "replica", "request", "t0", "target")

    def __init__(self, replica: FakeReplica, request: GenerationRequest, target: int, future: _GenFuture) -> None:
        self.replica = replica
        self.request = request
        # Fractional tokens: a request woken early (a stale timer, a pause) keeps the part of a
        # token it earned, so frequent wake-ups can never stall it below its length.
        self.progress = float(len(request.partial_token_ids))
        self.target = target
        self.aborted = False
        self.future = future
        self.t0: float | None = None  # loop time the current timed stretch began (None: not running)
        self.remaining_s = 0.0

    def produced_at(self, t: float) -> int:
        """Tokens produced by loop time ``t`` (counting the running stretch)."""
        p = self.progress
        if self.t0 is not None:
            elapsed = t - self.t0
            p = float(self.target) if elapsed + 1e-9 >= self.remaining_s else p + elapsed * self.replica.tokens_per_s
        return min(self.target, int(p + 1e-6))

    @property
    def produced(self) -> int:
        return min(self.target, int(self.progress + 1e-6))

    def wake(self) -> None:
        """Re-evaluate the request now: account its progress, then finish it or wait again."""
        r = self.replica
        if r._gens.get(self.request.request_id) is not self:
            return  # finished, cancelled or handed back in a batch: a stale timer
        loop = self.future.get_loop()
        now = loop.time()
        if self.t0 is not None:
            elapsed = now - self.t0
            # Tolerances: on a virtual clock t0 + d - t0 can come out a hair below d.
            if elapsed + 1e-9 >= self.remaining_s:
                self.progress = float(self.target)
            else:
                self.progress = min(float(self.target), self.progress + elapsed * r.tokens_per_s)
            self.t0 = None
        if r.dead:
            self.end(BackendError(f"replica {r.replica_id!r} died while generating {self.request.request_id}"))
            return
        if self.aborted:
            self.end(r._result(self, "abort"))
            return
        if self.produced >= self.target:
            reason: FinishReason = "length" if self.target >= self.request.max_tokens else "stop"
            r.completed.append(self.request.request_id)
            self.end(r._result(self, reason))
            return
        if r.paused or r.manual:
            return  # pause/resume, advance or finish wake it again
        self.remaining_s = (self.target - self.progress) / r.tokens_per_s
        self.t0 = now
        # The wake-up is left to come even when something else wakes the request first
        # (an abort, a pause): a stale one only re-evaluates the request early.
        r._wakeups.wake_at(loop, now + self.remaining_s, self)

    def end(self, outcome: GenerationResult | BaseException | None) -> None:
        """Leave the replica with ``outcome`` (None: the future was cancelled)."""
        r = self.replica
        rid = self.request.request_id
        if r._gens.get(rid) is not self:
            return  # already ended, or handed back by abort_batch (its future is abandoned)
        del r._gens[rid]
        if r.log_generate:
            r._record("generate", "end", f"{rid} tokens={self.produced}", self.future.get_loop())
        fut = self.future
        # The future and its gen point at each other: cut the cycle so that reference counting
        # frees both (thousands of cycles per second would keep the young collections busy).
        fut.gen = None
        if outcome is None or fut.done():
            return
        if isinstance(outcome, GenerationResult):
            r.generated_tokens += len(outcome.token_ids) - len(self.request.partial_token_ids)
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)


class _AbortedBatch(Sequence[GenerationResult]):
    """The partial results of one ``abort_batch``, built when read (the caller reads them in chunks)."""

    __slots__ = ("_at", "_gens", "_replica")

    def __init__(self, replica: FakeReplica, gens: list[_Gen], at: float) -> None:
        self._replica = replica
        self._gens = gens
        self._at = at

    def __len__(self) -> int:
        return len(self._gens)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self._gens)))]
        g = self._gens[i]
        return self._replica._result(g, "abort", g.produced_at(self._at))


def _checked_rate(replica_id: str, tokens_per_s: float) -> float:
    """``tokens_per_s`` as a float; a rate that is not positive and finite is a ConfigError."""
    if not (0.0 < float(tokens_per_s) < math.inf):
        raise ConfigError(f"FakeReplica {replica_id!r}: tokens_per_s must be > 0 and finite, got {tokens_per_s!r}")
    return float(tokens_per_s)


class FakeReplica(FaultsMixin):
    """An in-process inference replica with vLLM-like lifecycle rules, for tests and benchmarks."""

    def __init__(
        self,
        replica_id: str,
        kind: ReplicaKind | str = ReplicaKind.STANDALONE,
        *,
        latency: float | Mapping[str, float] = 0.0,
        tokens_per_s: float = 1000.0,
        response_tokens: int | Callable[[GenerationRequest], int] = 64,
        fail_on: Mapping[str, FaultSpec] | None = None,
        hang_on: Iterable[str] = (),
        die_after_s: float | None = None,
        asleep: bool | None = None,
        manual: bool = False,
        abort_chunk: int = 8,
        log: list[OpRecord] | None = None,
        log_generate: bool = True,
    ) -> None:
        """Build a replica.

        :param replica_id: unique id.
        :param kind: standalone or hybrid; a hybrid replica starts asleep unless ``asleep`` says.
        :param latency: seconds per operation, one number or a mapping op -> seconds
            (``generate`` latency is added before the first token).
        :param tokens_per_s: tokens each request gains per second (tokens/s).
        :param response_tokens: full length of a response (tokens), or a function of the request;
            ``request.extra["response_tokens"]`` overrides it. Capped at ``max_tokens``.
        :param fail_on: op -> exception (instance, class or builtin name) raised at the start of that op.
        :param hang_on: ops that never return (until cancelled).
        :param die_after_s: the replica dies this many seconds after its first generate call
            starts: running requests raise BackendError and so does every later call.
        :param asleep: start asleep and paused (default: True for hybrid replicas).
        :param manual: requests only progress through :meth:`advance` / :meth:`finish`.
        :param abort_chunk: an abort wakes this many requests per event-loop iteration, the way a
            real engine streams its abort outputs (keeps the loop responsive); ``abort_batch``
            wakes none, and takes requests out under a budget all fakes on the loop share.
        :param log: op log to append to (share one list between fakes to order across them).
        :param log_generate: also log generate calls (turn off in benchmarks).
        """
        self.replica_id = replica_id
        """Id the balancer routes by and the op log names (``s0``, ``h0``, ...)."""
        self.kind = ReplicaKind(kind)
        """Standalone (own GPUs, always on) or hybrid (shares the trainer's slot; starts asleep)."""
        self.target = replica_id
        self.latency = latency_map(latency, REPLICA_OPS)
        """Seconds per operation."""
        self.tokens_per_s = _checked_rate(replica_id, tokens_per_s)
        """Tokens per second per request."""
        self.response_tokens = response_tokens
        """Default response length (tokens) or a function of the request."""
        fail, hang = fault_map(fail_on, hang_on, REPLICA_OPS)
        self.fail_on = fail
        """op -> exception raised at the start of that op (mutable during a test)."""
        self.hang_on = hang
        """Ops that never return (mutable during a test)."""
        self.generate_fault: Callable[[GenerationRequest], BaseException | None] | None = None
        """Per-request failure: called with each generate request; an exception it returns is raised
        instead of generating (None: no fault; set during a test or benchmark)."""
        self.die_after_s = die_after_s
        """Seconds after the first generate at which the replica dies (None = never)."""
        self.manual = manual
        """Requests only progress through advance()/finish()."""
        self.abort_chunk = max(1, abort_chunk)
        """Requests woken per loop iteration by an abort (count)."""
        self.log: list[OpRecord] = log if log is not None else []
        """Every call's start and end, in order (shared between fakes to order calls across them)."""
        self.log_generate = log_generate
        """Log generate calls too (off in benchmarks, where they would dominate the log)."""
        self._init_state(self.kind is ReplicaKind.HYBRID if asleep is None else asleep)

    def _init_state(self, start_asleep: bool) -> None:
        """The state of a new replica: lifecycle, counters, requests in flight (none yet)."""
        self.violations: list[str] = []
        """Lifecycle rules broken by the caller (must stay empty)."""
        self.weights_loaded = not start_asleep
        """Weights are on the GPU."""
        self.kv_cache_allocated = not start_asleep
        """KV cache is allocated."""
        self.paused = start_asleep
        """No tokens are scheduled (a sleeping replica stays paused until resume())."""
        self.dead = False
        """The replica died (every call raises)."""
        self.lost_reason: str | None = None
        """Why it is gone for good (set by :meth:`lose`, as a Ray proxy sets it for a dead actor)."""
        self.weight_version = 0
        """Version of the loaded weights (-1 after sleep level 2 discarded them)."""
        self.completed: list[str] = []
        """Request ids finished (stop/length) by this replica, in order."""
        self.resumed_with: dict[str, int] = {}
        """request id -> partial tokens it carried when it arrived here (only if > 0)."""
        self.generated_tokens = 0
        """Response tokens generated here, added when a request finishes or is aborted (tokens)."""
        self._gens: dict[str, _Gen] = {}
        self._death_armed = False
        self._wakeups = WakeupTimer()

    # ---- Convenience --------------------------------------------------------------------

    @property
    def sleeping(self) -> bool:
        """True while weights or KV cache are released."""
        return not (self.weights_loaded and self.kv_cache_allocated)

    @property
    def in_flight_ids(self) -> list[str]:
        """Ids of requests running here now."""
        return list(self._gens)

    def kill(self) -> None:
        """Die now: running requests raise BackendError, later calls too."""
        self.dead = True
        for g in list(self._gens.values()):
            g.wake()

    def lose(self, reason: str = "its process was killed") -> None:
        """Die now and be gone for good: as :meth:`kill`, and ``lost_reason`` says why, so the
        controller recreates it at once instead of probing it."""
        self.lost_reason = reason
        self.kill()

    def advance(self, request_id: str, tokens: int = 1) -> None:
        """Manual mode: give ``request_id`` ``tokens`` more tokens (finishes it at its length)."""
        g = self._gens[request_id]
        g.progress = float(min(g.target, g.produced + tokens))
        g.wake()

    def finish(self, request_id: str) -> None:
        """Manual mode: finish ``request_id`` now."""
        g = self._gens[request_id]
        g.progress = float(g.target)
        g.wake()

    def _target_len(self, req: GenerationRequest) -> int:
        n = req.extra.get("response_tokens")
        if n is None:
            n = self.response_tokens(req) if callable(self.response_tokens) else self.response_tokens
        return max(1, min(int(n), req.max_tokens))

    def _check_alive(self, op: str) -> None:
        if self.dead:
            self._record(op, "error", "replica is dead")
            raise BackendError(f"replica {self.replica_id!r} is dead; {op} failed")

    def _arm_death(self) -> None:
        if self.die_after_s is not None and not self._death_armed:
            self._death_armed = True
            asyncio.get_running_loop().call_later(self.die_after_s, self.kill)

    # ---- Replica protocol ------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Produce tokens at ``tokens_per_s`` until the response length, an abort or death."""
        return await self.submit(request)

    def submit(self, request: GenerationRequest) -> asyncio.Future[GenerationResult]:
        """Start ``request``; the future completes as :meth:`generate` returns or raises."""
        rid = request.request_id
        partial = len(request.partial_token_ids)
        loop = asyncio.get_running_loop()
        fut = _GenFuture(loop=loop)
        if self.log_generate:
            self._record("generate", "start", f"{rid} partial={partial}")
        if self.dead:
            self._record("generate", "error", "replica is dead")
            fut.set_exception(BackendError(f"replica {self.replica_id!r} is dead; generate failed"))
            return fut
        if "generate" in self.hang_on:
            fut.add_done_callback(lambda f: self._record("generate", "error", "cancelled while hanging"))
            return fut  # never answers; a caller's timeout or eviction cancels it
        err = self.fail_on.get("generate")
        if err is not None:
            exc = err(f"injected failure of generate on {self.target}") if isinstance(err, type) else err
            self._record("generate", "error", repr(exc))
            fut.set_exception(exc)
            return fut
        fault = self.generate_fault(request) if self.generate_fault is not None else None
        if fault is not None:
            self._record("generate", "error", repr(fault))
            fut.set_exception(fault)
            return fut
        self._arm_death()
        if self.sleeping:
            self.violations.append(f"generate({rid}) on sleeping replica {self.replica_id}")
            fut.set_exception(BackendError(f"replica {self.replica_id!r} is asleep; it cannot generate {rid}"))
            return fut
        if rid in self._gens:
            self.violations.append(f"generate({rid}) while it already runs on {self.replica_id}")
        if partial:
            self.resumed_with[rid] = partial
        gen = _Gen(self, request, self._target_len(request), fut)
        fut.gen = gen
        self._gens[rid] = gen
        delay = self.latency["generate"]
        if delay > 0:
            self._wakeups.wake_at(loop, loop.time() + delay, gen)  # the first token comes after the latency
        else:
            gen.wake()
        return fut

    def _result(
        self, gen: _Gen, reason: Literal["stop", "length", "abort"], produced: int | None = None
    ) -> GenerationResult:
        n = gen.produced if produced is None else produced
        return GenerationResult(
            request_id=gen.request.request_id,
            token_ids=range(n),
            logprobs=Repeat(n, -1.0),
            finish_reason=reason,
            replica_id=self.replica_id,
            weight_version=self.weight_version,
        )

    async def abort(self, request_ids: Sequence[str] | None = None) -> list[str]:
        """Abort the given requests (None = all); they return their partial output."""
        self._check_alive("abort")
        await self._enter("abort", "all" if request_ids is None else f"{len(request_ids)} requests")
        ids = list(self._gens) if request_ids is None else [r for r in request_ids if r in self._gens]
        for i, rid in enumerate(ids):
            g = self._gens.get(rid)
            if g is not None:
                g.aborted = True
                g.wake()
            if (i + 1) % self.abort_chunk == 0:
                await asyncio.sleep(0)
        self._record("abort", "end", f"{len(ids)} aborted")
        return ids

    async def abort_batch(self, request_ids: Sequence[str] | None = None) -> Sequence[GenerationResult]:
        """Abort the given requests (None = all) and return their partial results in one reply.

        The requests leave the replica when the call arrives (after an injected hang or failure,
        which leave them running), the way an engine stops them on receipt; the reply comes
        after the abort latency, and the replica may sleep right after. Their futures from
        :meth:`submit` never complete. Results are built when read.
        """
        self._check_alive("abort")
        self._record("abort", "start", "all" if request_ids is None else f"{len(request_ids)} requests")
        await self._inject("abort")
        at = asyncio.get_running_loop().time()
        # A real engine takes the requests out in its own process; here that work runs on the
        # caller's loop, so all fakes on a loop share one budget of ids per iteration (see
        # TakeOutBudget) and a waiting replica costs nothing until its turn.
        ids = list(self._gens) if request_ids is None else list(request_ids)
        budget = TakeOutBudget.of(asyncio.get_running_loop())
        pop = self._gens.pop
        gens: list[_Gen] = []
        i = 0
        while i < len(ids):
            n = await budget.take(len(ids) - i)
            chunk = [g for g in map(pop, ids[i : i + n], itertools.repeat(None)) if g is not None]
            # Counted chunk by chunk, inside the budget: one sum over a whole large batch would
            # hold a single loop iteration for as long as the budget exists to prevent.
            self._count_taken_out(chunk, at)
            gens.extend(chunk)
            i += n
        delay = self.latency.get("abort", 0.0)
        if delay > 0:
            await asyncio.sleep(delay)
        if self.log_generate:
            for g in gens:
                self._record("generate", "end", f"{g.request.request_id} tokens={g.produced_at(at)} (batch abort)")
        self._record("abort", "end", f"{len(gens)} aborted")
        return _AbortedBatch(self, gens, at)

    def _count_taken_out(self, gens: list[_Gen], at: float) -> None:
        """Add the tokens ``gens`` produced here by loop time ``at`` (beyond their carried output)."""
        self.generated_tokens += sum(g.produced_at(at) - len(g.request.partial_token_ids) for g in gens)

    async def pause(self) -> None:
        """Stop scheduling tokens; requests are kept."""
        self._check_alive("pause")
        await self._enter("pause")
        self.paused = True
        for g in list(self._gens.values()):
            g.wake()
        self._record("pause", "end")

    async def resume(self) -> None:
        """Schedule tokens again (only valid when awake)."""
        self._check_alive("resume")
        await self._enter("resume")
        if self.sleeping:
            self.violations.append(f"resume on sleeping replica {self.replica_id}")
        self.paused = False
        for g in list(self._gens.values()):
            g.wake()
        self._record("resume", "end")

    async def sleep(self, level: int = 1) -> None:
        """Release KV cache and offload weights (level 2: discard them); stays paused."""
        self._check_alive("sleep")
        await self._enter("sleep", f"level={level}")
        if self._gens:
            self.violations.append(f"sleep on {self.replica_id} with {len(self._gens)} requests in flight")
            for g in list(self._gens.values()):
                g.aborted = True
                g.wake()
        self.paused = True
        self.weights_loaded = False
        self.kv_cache_allocated = False
        if level >= 2:
            self.weight_version = -1
        self._record("sleep", "end", f"level={level}")

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Reallocate ``tags`` (``weights``, ``kv_cache``; None = both); stays paused."""
        self._check_alive("wake_up")
        tagset = {"weights", "kv_cache"} if tags is None else set(tags)
        await self._enter("wake_up", ",".join(sorted(tagset)))
        if "weights" in tagset:
            self.weights_loaded = True
        if "kv_cache" in tagset:
            self.kv_cache_allocated = True
        self._record("wake_up", "end", ",".join(sorted(tagset)))

    async def update_weights(self, update: WeightUpdate) -> None:
        """Load weight version ``update.version`` (the weights must be awake)."""
        self._check_alive("update_weights")
        await self._enter("update_weights", f"version={update.version}")
        if not self.weights_loaded:
            self.violations.append(f"update_weights(v{update.version}) on {self.replica_id} with weights offloaded")
        self.weight_version = update.version
        self._record("update_weights", "end", f"version={update.version}")

    async def health(self) -> ReplicaHealth:
        """Report liveness, in-flight count and sleep state."""
        await self._enter("health")
        return ReplicaHealth(
            healthy=not self.dead,
            in_flight=len(self._gens),
            sleeping=self.sleeping,
            detail="dead" if self.dead else "",
        )

    def costs(self) -> OperationCosts:
        """The configured latencies as cost estimates (seconds)."""
        lat = self.latency
        return OperationCosts(
            sleep_s=lat["sleep"],
            wake_up_s=lat["wake_up"],
            abort_s=lat["abort"],
            update_weights_s=lat["update_weights"],
        )

    async def shutdown(self) -> None:
        """Abort everything and stop."""
        await self._enter("shutdown")
        for g in list(self._gens.values()):
            g.aborted = True
            g.wake()
        self._record("shutdown", "end")
