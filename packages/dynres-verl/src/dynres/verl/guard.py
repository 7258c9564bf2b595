"""Calling a dynres policy from verl's synchronous code without letting it break verl's trainer.

verl calls its policy's methods directly from the trainer, with no timeout and no type checks.
:class:`SyncGuard` puts both around a dynres policy: each call runs in a daemon thread and is
awaited for at most ``timeout_s``; the answer is checked with dynres's one table of valid
answers (:func:`dynres.core.answers.check_answer`); a policy that raises, hangs or answers
wrongly gets the safe value of that table, the fallback is logged as a warning and reported
through the ``dynres_decision_made`` hook. A timed-out call keeps running in its thread (Python
cannot stop a thread); once ``max_stuck_calls`` such calls are still running the policy is not
called any more and every decision falls back at once.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any

from dynres.core import BoundPolicy, ScheduleContext
from dynres.core.answers import check_answer, safe_answer

logger = logging.getLogger("dynres.verl")


class SyncGuard:
    """Runs a bound dynres policy's decisions with a timeout, answer checks and safe fallbacks."""

    def __init__(self, policy: BoundPolicy, *, timeout_s: float = 10.0, max_stuck_calls: int = 4) -> None:
        """Guard ``policy``; ``timeout_s`` is the longest a decision may take (seconds)."""
        self.policy = policy
        """The guarded policy behind its plugin manager."""
        self.timeout_s = timeout_s
        """Longest a decision may take (seconds)."""
        self.max_stuck_calls = max_stuck_calls
        """Timed-out calls still running after which the policy is not called any more (count)."""
        self.fallbacks = 0
        """Decisions that fell back to the safe value (count)."""
        self._stuck: list[concurrent.futures.Future[Any]] = []

    def decide(self, method: str, ctx: ScheduleContext) -> Any:
        """Return the policy's checked answer to ``method`` on ``ctx``, or the safe value."""
        self._stuck = [f for f in self._stuck if not f.done()]
        reason = ""
        value: Any = None
        if len(self._stuck) >= self.max_stuck_calls:
            reason = f"not called: {len(self._stuck)} earlier calls are still running"
        else:
            fut = _in_daemon_thread(lambda: self.policy.decision(method, ctx))
            try:
                raw = fut.result(timeout=self.timeout_s)
            except concurrent.futures.TimeoutError:
                self._stuck.append(fut)
                reason = f"no answer within {self.timeout_s:g} s"
            except Exception as exc:  # third-party code: anything may come out
                reason = f"raised {type(exc).__name__}: {exc}"
            else:
                checked = check_answer(method, raw)
                value, reason = checked.value, checked.reason
        fallback = bool(reason)
        if fallback:
            value = safe_answer(method, ctx)
            self.fallbacks += 1
            logger.warning(
                "dynres policy %r %s at global_steps=%d: %s; using the safe value %r, verl continues",
                self.policy.name,
                method,
                ctx.global_steps,
                reason,
                value,
            )
        try:
            self.policy.pm.hook.dynres_decision_made(
                decision=method, value=value, ctx=ctx, policy_name=self.policy.name, fallback=fallback
            )
        except Exception:
            logger.exception("a dynres_decision_made observer failed; ignored")
        return value


def _in_daemon_thread(fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
    # A fresh daemon thread per call: a hung policy can then never block interpreter exit.
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn())
        except BaseException as exc:  # delivered to the caller
            fut.set_exception(exc)

    threading.Thread(target=run, name="dynres-verl-policy", daemon=True).start()
    return fut
