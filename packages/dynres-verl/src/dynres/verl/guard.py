"""Calling a dynres policy from verl's synchronous code without letting it break verl's trainer.

verl calls its policy's methods directly from the trainer, with no timeout and no type checks.
:class:`SyncGuard` is verl's front-end of dynres's one policy guard,
:class:`dynres.core.guard.PolicyGuard`, the same one the dynres runtime uses: the answer check,
the safe fallback (logged as a warning ending "verl continues"), the runtime's safety clamps, the
``dynres_decision_made`` report, the stuck-call budget and the daemon-thread runner all live
there. What stays here is the wait: verl's trainer thread blocks on the call's future for at
most ``timeout_s`` (verl has no event loop for it). A policy's SystemExit or KeyboardInterrupt is
not caught: it reaches verl's trainer, as any exception of verl's own policies would.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Any

from dynres.core import BoundPolicy, ScheduleContext
from dynres.core.guard import CallOutcome, PolicyGuard

logger = logging.getLogger("dynres.verl")


class SyncGuard(PolicyGuard):
    """Runs a bound dynres policy's decisions with a timeout, answer checks, safe fallbacks and clamps."""

    def __init__(self, policy: BoundPolicy, *, timeout_s: float = 10.0, max_stuck_calls: int = 4) -> None:
        """Guard ``policy``; ``timeout_s`` is the longest a decision may take (seconds)."""
        super().__init__(
            policy,
            timeout_s=timeout_s,
            max_stuck_calls=max_stuck_calls,
            logger=logger,
            subject="dynres policy",
            carry_on=", verl continues",
            thread_name="dynres-verl-policy",
        )

    def decide(self, method: str, ctx: ScheduleContext) -> Any:
        """Return the policy's checked and clamped answer to ``method`` on ``ctx``, or the safe value."""
        return self.settle(method, ctx, self._call(method, ctx)).value

    def _call(self, method: str, ctx: ScheduleContext) -> CallOutcome:
        blocked = self.blocked()
        if blocked is not None:
            return blocked
        fut = self.executor.submit(self.policy.decision, method, ctx)
        try:
            raw = fut.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            return self.timed_out(fut)
        except Exception as exc:  # third-party code: anything may come out
            return CallOutcome.raised(exc)
        return CallOutcome.answered(raw)
