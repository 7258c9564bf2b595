"""Policy fault isolation: every policy decision runs in a worker thread, with a timeout, typed.

A policy is third-party code. Each call goes through :class:`~dynres.core.BoundPolicy` (so
plugins can wrap it) in a worker thread started with ``loop.run_in_executor`` and is bounded by
``asyncio.wait_for``: a slow or hung policy never blocks the event loop, and the simulator's
virtual-time loop sees the pending executor work. The answer is then checked against the one
table of valid answers, :data:`dynres.core.answers.ANSWERS` (numpy booleans and integers count as
``bool`` and ``int`` and are normalised). A policy that raises, times out or answers with
anything else gets the safe fallback (deactivate; wait 0; activate only in an only-hybrid
cluster, where nothing else could generate; do not rebalance); the decision is reported through
``dynres_decision_made(fallback=True)``, logged as a warning and counted.

Then the safety clamps of :func:`dynres.core.answers.clamp_answer` (recorded with ``clamped=True``
and a reason; dynres-verl applies the same ones inside verl):

* ``deactivate_wait_samples`` stays in ``[step_required, step_required + buffer]`` in an
  only-hybrid cluster (the trainer's GPUs are the only producers: they must make at least one
  cycle's samples before going back) and in ``[0, step_required + buffer]`` otherwise (the queue
  never holds more, so a longer wait would never end);
* ``should_activate_after_step`` is ``True`` in an only-hybrid cluster, for the same reason.

A timed-out call keeps running in its daemon thread (Python cannot kill a thread); it holds no
lock of ours and its answer is ignored. While ``max_stuck_calls`` such calls are still running,
the policy is not called at all (each decision falls back at once), so a policy that hangs for
good does not pile up threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pluggy

from dynres.core import BoundPolicy, ScheduleContext
from dynres.core.answers import check_answer, clamp_answer, safe_answer
from dynres.runtime.loop.clock import wall

logger = logging.getLogger("dynres.runtime.loop.decisions")


@dataclass(frozen=True)
class DecisionRecord:
    """One policy decision as the controller acted on it."""

    method: str
    """Policy method name (``should_deactivate``, ...)."""
    value: Any
    """The value acted on (after fallback and clamps)."""
    raw: str
    """repr of what the policy returned, or the exception / timeout description."""
    fallback: bool
    """True when the policy raised, timed out or answered with a wrong type or value."""
    clamped: bool
    """True when a safety clamp changed a valid answer."""
    reason: str
    """Why a fallback or clamp happened ('' when neither)."""
    global_steps: int
    """Sync cycles completed when the decision was made (count)."""
    at_s: float
    """Run-clock time of the decision (seconds since run start)."""
    wall_s: float
    """Real time the call took, thread hop included (seconds; profiling only)."""


class PolicyInterrupted(Exception):
    """A policy method raised SystemExit or KeyboardInterrupt; ``original`` is that exception.

    Carried as an ordinary exception so asyncio does not tear the event loop down with it: the
    run drains, then ends with RunAbortedError (exit code 130 or 2).
    """

    def __init__(self, original: BaseException) -> None:
        """Wrap ``original`` (the SystemExit or KeyboardInterrupt the policy raised)."""
        super().__init__(f"the policy raised {type(original).__name__}({original})")
        self.original = original


class _DaemonThreadExecutor(concurrent.futures.Executor):
    """Runs each call in a fresh daemon thread, so a hung policy cannot block interpreter exit."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn(*args, **kwargs))
            except (SystemExit, KeyboardInterrupt) as exc:
                fut.set_exception(PolicyInterrupted(exc))
            except BaseException as exc:  # delivered to the awaiting coroutine
                fut.set_exception(exc)

        threading.Thread(target=run, name="dynres-policy", daemon=True).start()
        return fut


class DecisionGuard:
    """Calls the bound policy safely and reports every decision through the observer hooks."""

    def __init__(self, policy: BoundPolicy, *, timeout_s: float = 10.0, now: Callable[[], float]) -> None:
        """Guard ``policy``.

        :param policy: the policy behind its plugin manager.
        :param timeout_s: longest a decision may take (seconds on the loop's clock).
        :param now: run clock (seconds since run start) for the records.
        """
        self.policy = policy
        """The policy whose decisions are called, checked and clamped here."""
        self.timeout_s = timeout_s
        """Longest a decision may take (seconds)."""
        self.fallbacks = 0
        """Decisions that fell back to the safe value (count)."""
        self.records: list[DecisionRecord] = []
        """Every decision, in order."""
        self.wall_s = 0.0
        """Real time spent in decisions (seconds; profiling)."""
        self.max_stuck_calls = 4
        """Timed-out calls still running after which the policy is not called any more (count)."""
        self._now = now
        self._executor = _DaemonThreadExecutor()
        self._stuck: list[asyncio.Future[Any]] = []

    @property
    def pm(self) -> pluggy.PluginManager:
        """The plugin manager the policy is bound to."""
        return self.policy.pm

    async def decide(
        self,
        method: str,
        ctx: ScheduleContext,
    ) -> DecisionRecord:
        """Run ``method`` of the policy on ``ctx``; return the checked, clamped decision and report it.

        The method's safety clamp (see the module docs) applies to the checked (or fallback)
        value; a changed value is recorded with ``clamped=True`` and its reason.
        """
        loop = asyncio.get_running_loop()
        t0 = wall()
        raw: Any = None
        checked = None
        reason = ""
        self._stuck = [f for f in self._stuck if not f.done()]
        try:
            if len(self._stuck) >= self.max_stuck_calls:
                # Circuit breaker: a policy that keeps hanging would otherwise leave one more
                # thread behind at every decision.
                raise _Stuck(f"{len(self._stuck)} earlier calls are still running")
            fut = loop.run_in_executor(self._executor, self.policy.decision, method, ctx)
            try:
                raw = await asyncio.wait_for(asyncio.shield(fut), self.timeout_s)
            except TimeoutError:
                self._stuck.append(fut)
                raise
            checked = check_answer(method, raw)
            reason = checked.reason
            raw_text = _short_repr(raw)
        except _Stuck as exc:
            reason = f"not called: {exc}"
            raw_text = "<not called>"
        except TimeoutError:
            reason = f"no answer within {self.timeout_s:g} s"
            raw_text = "<timeout>"
        except PolicyInterrupted:
            raise  # not a bad answer: the policy asked to stop the run
        except Exception as exc:  # third-party code: anything may come out
            reason = f"raised {type(exc).__name__}: {exc}"
            raw_text = f"<{type(exc).__name__}>"
        elapsed = wall() - t0
        self.wall_s += elapsed
        fallback = bool(reason)
        if fallback:
            value = safe_answer(method, ctx)
            self.fallbacks += 1
            logger.warning(
                "policy %r %s at global_steps=%d: %s; using the safe value %r and continuing",
                self.policy.name,
                method,
                ctx.global_steps,
                reason,
                value,
            )
        else:
            assert checked is not None  # no reason: the answer was checked and found valid
            value = checked.value
        clamped = False
        new, why = clamp_answer(method, value, ctx)
        if new != value:
            logger.info("policy %r %s: %r clamped to %r: %s", self.policy.name, method, value, new, why)
            value, clamped = new, True
            reason = (reason + "; " if reason else "") + why
        record = DecisionRecord(
            method=method,
            value=value,
            raw=raw_text,
            fallback=fallback,
            clamped=clamped,
            reason=reason,
            global_steps=ctx.global_steps,
            at_s=self._now(),
            wall_s=elapsed,
        )
        self.records.append(record)
        self._report(record, ctx)
        return record

    def _report(self, record: DecisionRecord, ctx: ScheduleContext) -> None:
        """Emit ``dynres_decision_made`` for ``record``; an observer's error is logged, not raised."""
        try:
            self.pm.hook.dynres_decision_made(
                decision=record.method,
                value=record.value,
                ctx=ctx,
                policy_name=self.policy.name,
                fallback=record.fallback,
            )
        except Exception:
            logger.exception("a dynres_decision_made observer failed; ignored")


class _Stuck(Exception):
    """Internal: too many earlier policy calls never returned."""


def _short_repr(v: Any, limit: int = 80) -> str:
    try:
        text = repr(v)
    except Exception:
        text = f"<unrepresentable {type(v).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
