"""Policy fault isolation in the runtime: each decision in a worker thread, awaited on the event loop.

A policy is third-party code. Each call goes through :class:`~dynres.core.BoundPolicy` (so
plugins can wrap it) and through :class:`DecisionGuard`, the runtime's front-end of the one guard
shared with dynres-verl, :class:`dynres.core.guard.PolicyGuard`. The core owns the answer check
against :data:`dynres.core.answers.ANSWERS` (numpy booleans and integers count as ``bool`` and
``int`` and are normalised), the safe fallback for a policy that raises, times out or answers
with anything else (deactivate; wait 0; abort at once; activate only in an only-hybrid cluster,
where nothing else could generate; do not rebalance; admit nothing extra), the warning, the
``dynres_decision_made`` report, the stuck-call budget and the daemon-thread runner.

Then the safety clamps of :func:`dynres.core.answers.clamp_answer` (recorded with ``clamped=True``
and a reason; dynres-verl applies the same ones inside verl, through the same core):

* ``deactivate_wait_samples`` stays in ``[step_required, step_required + buffer]`` in an
  only-hybrid cluster (the trainer's GPUs are the only producers: they must make at least one
  cycle's samples before going back) and in ``[0, step_required + buffer]`` otherwise (the queue
  never holds more, so a longer wait would never end);
* ``should_activate_after_step`` is ``True`` in an only-hybrid cluster, for the same reason;
* ``deactivate_grace_s`` is at most the latest cycle's length, and ``admit_extra_samples`` at
  most one cycle's batch (``step_required``).

What stays here is what only the runtime needs. The call starts with ``loop.run_in_executor``
and is bounded by ``asyncio.wait_for``: a slow or hung policy never blocks the event loop, and
the simulator's virtual-time loop sees the pending executor work (it freezes virtual time while
the thread runs, see ``dynres.runtime.sim.virtual_time``). A policy's SystemExit or KeyboardInterrupt
becomes :class:`PolicyInterrupted`, which ends the run cleanly. Each record adds the run-clock
time and the real time the call took.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dynres.core import BoundPolicy, ScheduleContext
from dynres.core.guard import CallOutcome, GuardedDecision, PolicyGuard
from dynres.runtime.loop.clock import wall

logger = logging.getLogger("dynres.runtime.loop.decisions")


@dataclass(frozen=True)
class DecisionRecord(GuardedDecision):
    """One policy decision as the controller acted on it: the guard's record plus when and how long."""

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


class DecisionGuard(PolicyGuard):
    """Calls the bound policy safely on the event loop and keeps the record of every decision."""

    def __init__(self, policy: BoundPolicy, *, timeout_s: float = 10.0, now: Callable[[], float]) -> None:
        """Guard ``policy``.

        :param policy: the policy behind its plugin manager.
        :param timeout_s: longest a decision may take (seconds on the loop's clock).
        :param now: run clock (seconds since run start) for the records.
        """
        super().__init__(policy, timeout_s=timeout_s, logger=logger)
        self.records: list[DecisionRecord] = []
        """Every decision, in order."""
        self.wall_s = 0.0
        """Real time spent in decisions (seconds; profiling)."""
        self._now = now

    async def decide(self, method: str, ctx: ScheduleContext) -> DecisionRecord:
        """Run ``method`` of the policy on ``ctx``; return the checked, clamped decision and report it.

        The method's safety clamp (see the module docs) applies to the checked (or fallback)
        value; a changed value is recorded with ``clamped=True`` and its reason.
        """
        t0 = wall()
        outcome = await self._call(method, ctx)
        elapsed = wall() - t0
        self.wall_s += elapsed
        decision = self.judge(method, ctx, outcome)
        record = DecisionRecord(**decision.field_values(), at_s=self._now(), wall_s=elapsed)
        self.records.append(record)
        self.report(record, ctx)
        return record

    async def _call(self, method: str, ctx: ScheduleContext) -> CallOutcome:
        blocked = self.blocked()
        if blocked is not None:
            return blocked
        loop = asyncio.get_running_loop()
        try:
            # run_in_executor (not a bare thread): the virtual-time loop overrides it to hold its
            # clock while the call runs, so a policy call costs zero virtual time.
            fut = loop.run_in_executor(self.executor, _interruptible, self.policy.decision, method, ctx)
            raw = await asyncio.wait_for(asyncio.shield(fut), self.timeout_s)
        except TimeoutError:
            return self.timed_out(fut)
        except PolicyInterrupted:
            raise  # not a bad answer: the policy asked to stop the run
        except Exception as exc:  # third-party code: anything may come out
            return CallOutcome.raised(exc)
        return CallOutcome.answered(raw)


def _interruptible(decision: Callable[[str, ScheduleContext], Any], method: str, ctx: ScheduleContext) -> Any:
    # Runs in the policy's thread. SystemExit / KeyboardInterrupt delivered through the future
    # would be re-raised inside a task and tear the event loop down; PolicyInterrupted is an
    # ordinary exception the run turns into a clean stop.
    try:
        return decision(method, ctx)
    except (SystemExit, KeyboardInterrupt) as exc:
        raise PolicyInterrupted(exc) from None
