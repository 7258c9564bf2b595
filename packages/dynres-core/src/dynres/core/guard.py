"""The one guard around a policy's answers, shared by the dynres runtime and the verl bridge.

A policy is third-party code. The two places that call one, the runtime's event loop
(``dynres.runtime.loop.decisions.DecisionGuard``) and verl's synchronous trainer
(``dynres.verl.guard.SyncGuard``), are front-ends of :class:`PolicyGuard`, which owns all they
have in common:

* the runner: each call runs in a fresh daemon thread (:class:`DaemonThreadExecutor`), so a hung
  policy can never block interpreter exit;
* the stuck-call budget: a timed-out call keeps running in its thread (Python cannot kill a
  thread; it holds no lock of ours and its answer is ignored). While ``max_stuck_calls`` such
  calls are still running the policy is not called at all and each decision falls back at once,
  so a policy that hangs for good does not pile up threads;
* the answer check against the one table (:func:`~dynres.core.answers.check_answer`), the safe
  fallback (:func:`~dynres.core.answers.safe_answer`) for a policy that raised, timed out or
  answered wrongly, and the safety clamps (:func:`~dynres.core.answers.clamp_answer`), applied
  to the checked or fallback value;
* the log lines (a warning per fallback, an info line per clamp), the record of the decision
  (:class:`GuardedDecision`) and its report through ``dynres_decision_made``, which carries the
  value acted on; an observer's exception is logged, never raised.

What differs stays in the front-ends: how a call is awaited and timed out (an asyncio future the
simulator's virtual-time loop sees, or a blocking wait in verl's trainer thread) and what a
policy's SystemExit or KeyboardInterrupt means (the runtime ends the run cleanly; inside verl it
reaches verl's trainer).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pluggy

from dynres.core.answers import check_answer, clamp_answer, safe_answer
from dynres.core.context import ScheduleContext
from dynres.core.plugins import BoundPolicy

__all__ = ["CallOutcome", "DaemonThreadExecutor", "GuardedDecision", "PolicyGuard", "short_repr"]


class DaemonThreadExecutor(concurrent.futures.Executor):
    """Runs each submitted call in a fresh daemon thread, so a hung policy cannot block interpreter exit.

    Whatever the call raises, BaseException included, is delivered to its future; a front-end
    that must not see SystemExit there wraps the call (the runtime does).
    """

    def __init__(self, thread_name: str = "dynres-policy") -> None:
        """Name every thread ``thread_name`` (it shows in thread dumps of a hung policy)."""
        self.thread_name = thread_name
        """Name given to each call's thread."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        """Start ``fn(*args, **kwargs)`` in a new daemon thread; return its future."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # delivered to whoever waits on the future
                fut.set_exception(exc)

        threading.Thread(target=run, name=self.thread_name, daemon=True).start()
        return fut


@dataclass(frozen=True)
class CallOutcome:
    """What came of one policy call before its answer is checked: the answer, or why there is none."""

    answer: Any = None
    """The policy's return value, unchecked (meaningful when ``failure`` is '')."""
    failure: str = ""
    """Why there is no answer to check: raised, timed out, not called ('' when the policy answered)."""
    shown: str = ""
    """What the record shows as the raw answer of a failed call, e.g. ``<timeout>``."""

    @classmethod
    def answered(cls, answer: Any) -> CallOutcome:
        """The policy returned ``answer``."""
        return cls(answer=answer)

    @classmethod
    def raised(cls, exc: BaseException) -> CallOutcome:
        """The policy (or its answer, when checked) raised ``exc``."""
        return cls(failure=f"raised {type(exc).__name__}: {exc}", shown=f"<{type(exc).__name__}>")


@dataclass(frozen=True)
class GuardedDecision:
    """One policy decision as the caller acts on it."""

    method: str
    """Policy method name (``should_deactivate``, ...)."""
    value: Any
    """The value acted on (after fallback and clamps)."""
    raw: str
    """repr of what the policy returned, or the exception / timeout description."""
    fallback: bool
    """True when the policy raised, timed out or answered with a wrong type or value."""
    clamped: bool
    """True when a safety clamp changed the checked or fallback value."""
    reason: str
    """Why a fallback or clamp happened ('' when neither)."""
    global_steps: int
    """Sync cycles completed when the decision was made (count)."""

    def field_values(self) -> dict[str, Any]:
        """The fields as keyword arguments, for a subclass's record that adds its own (shallow)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(GuardedDecision)}


class _Pending(Protocol):
    def done(self) -> bool: ...


class PolicyGuard:
    """Checks, falls back, clamps, logs, records and reports the answers of one bound policy.

    A front-end subclasses it and adds the call itself: unless :meth:`blocked` returns an outcome
    (the stuck-call budget is spent), start ``policy.decision(method, ctx)`` on :attr:`executor`,
    wait for it at most :attr:`timeout_s`, turn a timed-out call into :meth:`timed_out` and an
    exception into :meth:`CallOutcome.raised`, then :meth:`settle` the outcome (or :meth:`judge`
    it, build its own record and :meth:`report` that).
    """

    def __init__(
        self,
        policy: BoundPolicy,
        *,
        timeout_s: float = 10.0,
        max_stuck_calls: int = 4,
        logger: logging.Logger | None = None,
        subject: str = "policy",
        carry_on: str = " and continuing",
        thread_name: str = "dynres-policy",
    ) -> None:
        """Guard ``policy``.

        :param timeout_s: longest a decision may take (seconds on the front-end's clock).
        :param max_stuck_calls: timed-out calls still running after which the policy is not called.
        :param logger: where fallbacks, clamps and observer failures are logged (the front-end's).
        :param subject: how log lines name the policy (``"dynres policy"`` inside verl).
        :param carry_on: end of the fallback warning, saying who goes on (``", verl continues"``).
        :param thread_name: name of the threads running the calls.
        """
        self.policy = policy
        """The policy whose decisions are called, checked and clamped here."""
        self.timeout_s = timeout_s
        """Longest a decision may take (seconds)."""
        self.max_stuck_calls = max_stuck_calls
        """Timed-out calls still running after which the policy is not called any more (count)."""
        self.fallbacks = 0
        """Decisions that fell back to the safe value (count)."""
        self.executor = DaemonThreadExecutor(thread_name)
        """Runs each policy call in its own daemon thread."""
        self._log = logger or logging.getLogger(__name__)
        self._fallback_line = f"{subject} %r %s at global_steps=%d: %s; using the safe value %r{carry_on}"
        self._clamp_line = f"{subject} %r %s: %r clamped to %r: %s"
        self._stuck: list[_Pending] = []

    @property
    def pm(self) -> pluggy.PluginManager:
        """The plugin manager the policy is bound to."""
        return self.policy.pm

    # ---- the stuck-call budget ------------------------------------------------------------

    def blocked(self) -> CallOutcome | None:
        """The outcome of a call not made because the budget is spent; None when the policy may be called."""
        self._stuck = [f for f in self._stuck if not f.done()]
        if len(self._stuck) >= self.max_stuck_calls:
            # Circuit breaker: a policy that keeps hanging would otherwise leave one more thread
            # behind at every decision.
            return CallOutcome(
                failure=f"not called: {len(self._stuck)} earlier calls are still running", shown="<not called>"
            )
        return None

    def timed_out(self, pending: _Pending) -> CallOutcome:
        """Count ``pending`` (a call past :attr:`timeout_s`, still running) against the budget; its outcome."""
        self._stuck.append(pending)
        return CallOutcome(failure=f"no answer within {self.timeout_s:g} s", shown="<timeout>")

    # ---- check, fallback, clamp, record, report --------------------------------------------

    def settle(self, method: str, ctx: ScheduleContext, outcome: CallOutcome) -> GuardedDecision:
        """:meth:`judge` ``outcome`` and :meth:`report` the decision; return it."""
        decision = self.judge(method, ctx, outcome)
        self.report(decision, ctx)
        return decision

    def judge(self, method: str, ctx: ScheduleContext, outcome: CallOutcome) -> GuardedDecision:
        """Check ``outcome``'s answer to ``method``, fall back and clamp as needed, log; return the decision.

        A failed call or an invalid answer gets :func:`~dynres.core.answers.safe_answer`
        (counted in :attr:`fallbacks`, logged as a warning); then the method's clamp applies to
        the value, and a changed value is recorded with ``clamped=True`` and its reason.
        """
        reason, shown, value = outcome.failure, outcome.shown, None
        if not reason:
            try:
                checked = check_answer(method, outcome.answer)
            except Exception as exc:  # a third-party object may misbehave even when inspected
                failed = CallOutcome.raised(exc)
                reason, shown = failed.failure, failed.shown
            else:
                value, reason, shown = checked.value, checked.reason, short_repr(outcome.answer)
        fallback = bool(reason)
        if fallback:
            value = safe_answer(method, ctx)
            self.fallbacks += 1
            self._log.warning(self._fallback_line, self.policy.name, method, ctx.global_steps, reason, value)
        clamped = False
        new, why = clamp_answer(method, value, ctx)
        if new != value:
            self._log.info(self._clamp_line, self.policy.name, method, value, new, why)
            value, clamped = new, True
            reason = (reason + "; " if reason else "") + why
        return GuardedDecision(
            method=method,
            value=value,
            raw=shown,
            fallback=fallback,
            clamped=clamped,
            reason=reason,
            global_steps=ctx.global_steps,
        )

    def report(self, decision: GuardedDecision, ctx: ScheduleContext) -> None:
        """Emit ``dynres_decision_made`` for ``decision``; an observer's error is logged, not raised."""
        try:
            self.pm.hook.dynres_decision_made(
                decision=decision.method,
                value=decision.value,
                ctx=ctx,
                policy_name=self.policy.name,
                fallback=decision.fallback,
            )
        except Exception:
            self._log.exception("a dynres_decision_made observer failed; ignored")


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (a record stays small, whatever a policy returns)."""
    try:
        text = repr(value)
    except Exception:
        text = f"<unrepresentable {type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
