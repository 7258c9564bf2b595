"""Fake backends: a replica and a train engine that only ``asyncio.sleep``.

Both work on a real and on a virtual-time event loop, take a configurable latency per
operation, can be told to fail or hang on any operation, and append every operation to an op
log (:class:`OpRecord`, with loop timestamps) so tests can assert the order of events across
replicas and the trainer. They also record *violations*: calls that a real engine would reject
or that would corrupt a run (generate on a sleeping replica, sleep with requests in flight,
loading weights into a replica whose weights are offloaded, training while offloaded). Tests
assert that no violation happened.

A :class:`FakeReplica` produces ``tokens_per_s`` tokens per second per request. Token ``i`` of a
response has id ``i``, so a response resumed after an abort ends with exactly the same tokens
as one that was never interrupted: ``range(0, length)``.
"""

from __future__ import annotations

import asyncio
import builtins
import heapq
import itertools
import math
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from dynres.core.errors import BackendError, ConfigError
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


class _TakeOutBudget:
    """Request ids that all fake replicas on one loop take out in ``abort_batch(ids)`` per iteration.

    Taking a request out is the engine's work, done in its own process by a real engine; a fake
    does it on the caller's loop. A budget per replica does not bound an iteration: 512 replicas
    yielding every 16 ids stepped ~192 abort tasks per iteration (3.5-4 ms, several iterations
    in a row, in a 512 + 512 rebalance), and 16 replicas taking 1,024 each at once held one
    iteration 10-20 ms. One budget for the loop bounds it whatever the number of replicas, and
    a replica waiting for its share is woken only when it gets one (FIFO).
    """

    PER_ITERATION = 1024
    """Ids taken out per loop iteration by all fakes together (count; ~1-2 ms of CPU with each
    one's token count; 2,048 held consecutive iterations at 5-6 ms once tokens were counted)."""

    _by_loop: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _TakeOutBudget]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._left = self.PER_ITERATION
        self._waiters: deque[tuple[int, asyncio.Future[int]]] = deque()
        self._refill_scheduled = False

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _TakeOutBudget:
        """The budget of ``loop`` (created on first use)."""
        budget = cls._by_loop.get(loop)
        if budget is None:
            budget = cls._by_loop[loop] = cls(loop)
        return budget

    async def take(self, want: int) -> int:
        """How many of ``want`` ids (>= 1) the caller may take out now; waits for a later iteration if none."""
        if self._left > 0 and not self._waiters:
            n = min(want, self._left)
            self._left -= n
            self._schedule_refill()
            return n
        fut: asyncio.Future[int] = self._loop.create_future()
        self._waiters.append((want, fut))
        self._schedule_refill()
        return await fut

    def _schedule_refill(self) -> None:
        if not self._refill_scheduled:
            self._refill_scheduled = True
            self._loop.call_soon(self._refill)

    def _refill(self) -> None:
        # Next iteration: a fresh budget, granted to the waiters in order.
        self._refill_scheduled = False
        self._left = self.PER_ITERATION
        waiters = self._waiters
        while waiters and self._left > 0:
            want, fut = waiters.popleft()
            if fut.done():  # its abort was cancelled
                continue
            n = min(want, self._left)
            self._left -= n
            fut.set_result(n)
        if waiters or self._left < self.PER_ITERATION:
            self._schedule_refill()


REPLICA_OPS: tuple[str, ...] = (
    "generate",
    "abort",
    "pause",
    "resume",
    "sleep",
    "wake_up",
    "update_weights",
    "health",
    "shutdown",
)
"""Operations of a fake replica that accept a latency, a failure or a hang."""

TRAIN_OPS: tuple[str, ...] = ("train_step", "offload", "onload", "export_weights", "shutdown")
"""Operations of a fake train engine that accept a latency, a failure or a hang."""


@dataclass(frozen=True)
class OpRecord:
    """One entry of an op log."""

    t: float
    """Event-loop time of the event (seconds)."""
    target: str
    """Replica id, or ``"trainer"``."""
    op: str
    """Operation name (``generate``, ``abort``, ``sleep``, ...)."""
    event: Literal["start", "end", "error"]
    """Start of the call, its normal end, or its end by an exception."""
    detail: str = ""
    """Free text: request id, tags, version, error."""


def _latency_map(latency: float | Mapping[str, float], ops: Sequence[str]) -> dict[str, float]:
    if isinstance(latency, Mapping):
        unknown = set(latency) - set(ops)
        if unknown:
            raise ConfigError(f"unknown op(s) {sorted(unknown)} in latency; valid: {list(ops)}")
        out = {op: float(latency.get(op, 0.0)) for op in ops}
    else:
        out = {op: float(latency) for op in ops}
    bad = {op: v for op, v in out.items() if not (0.0 <= v < math.inf)}
    if bad:
        raise ConfigError(f"latency must be finite seconds >= 0; got {bad}")
    return out


def _fault_map(
    fail_on: Mapping[str, BaseException | type[BaseException]] | None, hang_on: Iterable[str], ops: Sequence[str]
) -> tuple[dict[str, BaseException | type[BaseException]], set[str]]:
    """Check injected faults: known ops, and each failure an exception class or instance."""
    fail = dict(fail_on or {})
    hang = set(hang_on)
    unknown = (set(fail) | hang) - set(ops)
    if unknown:
        raise ConfigError(f"unknown op(s) {sorted(unknown)} in fail_on/hang_on; valid: {list(ops)}")
    for op, err in list(fail.items()):
        if isinstance(err, str):  # from a YAML file: the name of a builtin exception or BackendError
            named = BackendError if err == "BackendError" else getattr(builtins, err, None)
            if not (isinstance(named, type) and issubclass(named, BaseException)):
                raise ConfigError(
                    f"fail_on[{op!r}] names no exception {err!r}; use a builtin one (e.g. RuntimeError) or BackendError"
                )
            fail[op] = err = named
        ok = isinstance(err, BaseException) or (isinstance(err, type) and issubclass(err, BaseException))
        if not ok:
            raise ConfigError(f"fail_on[{op!r}] is {err!r}; give an exception class or instance (e.g. RuntimeError)")
    return fail, hang


class _FaultsMixin:
    """Latency, failure and hang injection shared by both fakes."""

    target: str
    latency: dict[str, float]
    fail_on: dict[str, BaseException | type[BaseException]]
    hang_on: set[str]
    log: list[OpRecord]
    violations: list[str]

    def _record(
        self,
        op: str,
        event: Literal["start", "end", "error"],
        detail: str = "",
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        # ``loop``: for events driven from outside a running loop (a test's advance()/finish()).
        t = (loop or asyncio.get_running_loop()).time()
        self.log.append(OpRecord(t, self.target, op, event, detail))

    async def _enter(self, op: str, detail: str = "") -> None:
        """Log the start, then apply the injected hang, failure and latency of ``op``."""
        self._record(op, "start", detail)
        await self._inject(op)
        delay = self.latency.get(op, 0.0)
        if delay > 0:
            await asyncio.sleep(delay)

    async def _inject(self, op: str) -> None:
        """Apply the injected hang, then the injected failure, of ``op``."""
        if op in self.hang_on:
            try:
                await asyncio.Event().wait()  # forever; a caller's timeout cancels it
            except asyncio.CancelledError:
                self._record(op, "error", "cancelled while hanging")
                raise
        err = self.fail_on.get(op)
        if err is not None:
            exc = err(f"injected failure of {op} on {self.target}") if isinstance(err, type) else err
            self._record(op, "error", repr(exc))
            raise exc

    def ops(self, op: str | None = None, event: str | None = "start") -> list[OpRecord]:
        """This fake's log entries, filtered by operation and event (None = any)."""
        return [
            r
            for r in self.log
            if r.target == self.target and (op is None or r.op == op) and (event is None or r.event == event)
        ]


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
        r._wake_at(loop, now + self.remaining_s, self)

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


class FakeReplica(_FaultsMixin):
    """An in-process inference replica with vLLM-like lifecycle rules, for tests and benchmarks."""

    def __init__(
        self,
        replica_id: str,
        kind: ReplicaKind | str = ReplicaKind.STANDALONE,
        *,
        latency: float | Mapping[str, float] = 0.0,
        tokens_per_s: float = 1000.0,
        response_tokens: int | Callable[[GenerationRequest], int] = 64,
        fail_on: Mapping[str, BaseException | type[BaseException]] | None = None,
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
        :param fail_on: op -> exception (instance or class) raised at the start of that op.
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
        self.latency = _latency_map(latency, REPLICA_OPS)
        """Seconds per operation."""
        if not (0.0 < float(tokens_per_s) < math.inf):
            raise ConfigError(f"FakeReplica {replica_id!r}: tokens_per_s must be > 0 and finite, got {tokens_per_s!r}")
        self.tokens_per_s = float(tokens_per_s)
        """Tokens per second per request."""
        self.response_tokens = response_tokens
        """Default response length (tokens) or a function of the request."""
        fail, hang = _fault_map(fail_on, hang_on, REPLICA_OPS)
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
        self.violations: list[str] = []
        """Lifecycle rules broken by the caller (must stay empty)."""
        start_asleep = self.kind is ReplicaKind.HYBRID if asleep is None else asleep
        self.weights_loaded = not start_asleep
        """Weights are on the GPU."""
        self.kv_cache_allocated = not start_asleep
        """KV cache is allocated."""
        self.paused = start_asleep
        """No tokens are scheduled (a sleeping replica stays paused until resume())."""
        self.dead = False
        """The replica died (every call raises)."""
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
        # Requests' wake-ups: a heap of (loop time, order, request) behind one loop timer per
        # replica. The replica stands in for an engine in another process; a timer per request
        # would put 100,000 entries into the coordinator loop's own timer heap, whose every push
        # and pop (the runtime's timeouts and sleeps included) then costs ~17 Python-level
        # comparisons with cache misses.
        self._wakeups: list[tuple[float, int, _Gen]] = []
        self._wakeup_order = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

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

    def _wake_at(self, loop: asyncio.AbstractEventLoop, when: float, gen: _Gen) -> None:
        """Wake ``gen`` at loop time ``when`` (through this replica's one timer)."""
        self._wakeup_order += 1
        heapq.heappush(self._wakeups, (when, self._wakeup_order, gen))
        if when < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = when
            self._timer = loop.call_at(when, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        due = max(loop.time(), self._timer_at)  # the loop runs a timer up to a clock tick early
        self._timer, self._timer_at = None, math.inf
        wakeups = self._wakeups
        while wakeups and wakeups[0][0] <= due:
            heapq.heappop(wakeups)[2].wake()
        if wakeups and self._timer is None:
            self._timer_at = wakeups[0][0]
            self._timer = loop.call_at(self._timer_at, self._fire, loop)

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
            self._wake_at(loop, loop.time() + delay, gen)  # the first token comes after the latency
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
        # _TakeOutBudget) and a waiting replica costs nothing until its turn.
        ids = list(self._gens) if request_ids is None else list(request_ids)
        budget = _TakeOutBudget.of(asyncio.get_running_loop())
        pop = self._gens.pop
        gens: list[_Gen] = []
        i = 0
        while i < len(ids):
            n = await budget.take(len(ids) - i)
            chunk = [g for g in map(pop, ids[i : i + n], itertools.repeat(None)) if g is not None]
            # Counted chunk by chunk, inside the budget: one sum over 50,000 requests in one
            # iteration held the loop ~70 ms at 100,000 in flight.
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


class FakeTrainEngine(_FaultsMixin):
    """An in-process train engine: fit steps take the configured phase times."""

    def __init__(
        self,
        *,
        phase_times: Mapping[str, float] | None = None,
        per_sample_s: float = 0.0,
        latency: float | Mapping[str, float] = 0.0,
        fail_on: Mapping[str, BaseException | type[BaseException]] | None = None,
        hang_on: Iterable[str] = (),
        log: list[OpRecord] | None = None,
        weights_nbytes: int = 0,
    ) -> None:
        """Build a train engine.

        :param phase_times: seconds per phase of one fit step (default ``update_actor``: 1.0);
            a fit step sleeps for their sum.
        :param per_sample_s: extra ``update_actor`` seconds per sample in the batch.
        :param latency: seconds for ``offload``, ``onload``, ``export_weights`` (one number or
            a mapping); ``train_step`` uses ``phase_times`` instead.
        :param fail_on: op -> exception raised at the start of that op.
        :param hang_on: ops that never return (until cancelled).
        :param log: op log to append to.
        :param weights_nbytes: size reported by exported weight updates (bytes).
        """
        self.target = "trainer"
        self.phase_times = dict(phase_times if phase_times is not None else {"update_actor": 1.0})
        """Seconds per phase of one fit step."""
        self.per_sample_s = per_sample_s
        """Extra update_actor seconds per sample (seconds/sample)."""
        self.latency = _latency_map(latency, TRAIN_OPS)
        """Seconds per operation."""
        self.latency["train_step"] = 0.0
        fail, hang = _fault_map(fail_on, hang_on, TRAIN_OPS)
        self.fail_on = fail
        """op -> exception raised at the start of that op."""
        self.hang_on = hang
        """Ops that never return."""
        self.log: list[OpRecord] = log if log is not None else []
        """Every call's start and end, in order (shared between fakes to order calls across them)."""
        self.violations: list[str] = []
        """Lifecycle rules broken by the caller (must stay empty)."""
        self.offloaded = False
        """Parameters and optimizer state are off the GPU."""
        self.steps = 0
        """Fit steps run (count)."""
        self.exports = 0
        """Weight exports (count)."""
        self.batches: list[list[Any]] = []
        """Every batch trained on, in order."""
        self.weights_nbytes = weights_nbytes

    async def train_step(self, batch: Sequence[Any]) -> TrainStepResult:
        """Sleep for the phase times and report them."""
        await self._enter("train_step", f"{len(batch)} samples")
        if self.offloaded:
            self.violations.append(f"train_step {self.steps + 1} while offloaded")
        phases = dict(self.phase_times)
        if self.per_sample_s:
            phases["update_actor"] = phases.get("update_actor", 0.0) + self.per_sample_s * len(batch)
        total = sum(phases.values())
        if total > 0:
            await asyncio.sleep(total)
        self.steps += 1
        self.batches.append(list(batch))
        self._record("train_step", "end", f"step={self.steps}")
        return TrainStepResult(phase_times=phases, metrics={"samples": float(len(batch))})

    async def offload(self) -> None:
        """Free the GPU for hybrid replicas."""
        await self._enter("offload")
        self.offloaded = True
        self._record("offload", "end")

    async def onload(self) -> None:
        """Take the GPU back."""
        await self._enter("onload")
        self.offloaded = False
        self._record("onload", "end")

    async def export_weights(self) -> WeightUpdate:
        """Export the current weights (version = exports so far + 1)."""
        await self._enter("export_weights")
        self.exports += 1
        self._record("export_weights", "end", f"version={self.exports}")
        return WeightUpdate(version=self.exports, nbytes=self.weights_nbytes)

    def costs(self) -> OperationCosts:
        """The configured latencies as cost estimates (seconds)."""
        lat = self.latency
        return OperationCosts(offload_s=lat["offload"], onload_s=lat["onload"], export_weights_s=lat["export_weights"])

    async def shutdown(self) -> None:
        """Nothing to release."""
        await self._enter("shutdown")
        self._record("shutdown", "end")


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

    @property
    def replicas(self) -> list[FakeReplica]:
        """All replicas, standalone first."""
        return [*self.standalone, *self.hybrid]

    def violations(self) -> list[str]:
        """Every lifecycle violation recorded by any fake (must be empty)."""
        return [v for r in self.replicas for v in r.violations] + self.engine.violations
