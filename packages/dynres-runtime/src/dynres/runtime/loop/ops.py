"""Backend operations on many targets at once, each with a timeout, timed and recorded.

Every call the runtime makes to a replica or the train engine (except ``generate``, which the
balancer owns) goes through :meth:`OpRunner.one` or :meth:`OpRunner.many`. ``many`` runs the
same operation on N targets concurrently (``asyncio.gather``), bounds each call with
``op_timeout_s``, and returns which targets succeeded; a failure or a timeout is logged,
recorded as an :class:`OpFailure` naming the target, and never raised, so the caller can carry
on with the targets that worked.

``many`` starts at most ``fanout`` calls per event-loop iteration: starting a call runs its
first step (a remote call's submission, a task), and hundreds of them in one iteration hold the
coordinator's loop for milliseconds (docs/scaling.md, "A model of the coordinator's CPU per sync
cycle", has the measurement). The timeout is an ``asyncio.timeout`` block, not ``wait_for``,
which (before Python 3.12) wraps every call in one more task, so each call's start and end
would cost two task steps instead of one.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dynres.core.errors import BackendError, BackendTimeoutError

logger = logging.getLogger("dynres.runtime.loop.ops")

T = TypeVar("T")


@dataclass
class OpStat:
    """Timing of one kind of backend operation over a run (run-clock seconds)."""

    count: int = 0
    """Calls that finished (ok or failed)."""
    total_s: float = 0.0
    """Sum of the calls' durations (seconds)."""
    max_s: float = 0.0
    """Longest call (seconds)."""
    failures: int = 0
    """Calls that raised or timed out (count)."""


@dataclass(frozen=True)
class OpFailure:
    """A backend operation that raised or timed out."""

    at_s: float
    """Run-clock time the failure was noticed (seconds since run start)."""
    op: str
    """Operation (``sleep``, ``wake_up``, ``update_weights``, ``onload``, ...)."""
    target: str
    """Replica id, or ``"trainer"``."""
    error: str
    """Exception type and message."""
    timeout: bool
    """True when the call exceeded its timeout."""


@dataclass
class OpRunner:
    """Runs backend operations with timeouts and keeps their statistics and failures."""

    timeout_s: float
    """Longest one operation on one target may take (seconds)."""
    now: Callable[[], float]
    """Run clock (seconds since run start)."""
    stats: dict[str, OpStat] = field(default_factory=dict)
    """Operation name -> timing."""
    failures: list[OpFailure] = field(default_factory=list)
    """Every failure, in order."""
    fanout: int = 32
    """Most calls :meth:`many` starts per event-loop iteration (count)."""

    async def one(self, op: str, target: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run ``call()`` with the timeout; raise BackendTimeoutError / BackendError naming the target."""
        t0 = self.now()
        stat = self.stats.setdefault(op, OpStat())
        try:
            if math.isinf(self.timeout_s):
                return await call()
            async with asyncio.timeout(self.timeout_s):
                return await call()
        except TimeoutError:
            stat.failures += 1
            self.record_failure(op, target, f"no answer within {self.timeout_s:g} s", timeout=True)
            raise BackendTimeoutError(
                f"{op} on {target} did not finish within {self.timeout_s:g} s; check the engine "
                "or raise RunSpec.op_timeout_s"
            ) from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            stat.failures += 1
            self.record_failure(op, target, f"{type(exc).__name__}: {exc}", timeout=False)
            if isinstance(exc, BackendError):
                raise
            raise BackendError(f"{op} on {target} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            dt = self.now() - t0
            stat.count += 1
            stat.total_s += dt
            stat.max_s = max(stat.max_s, dt)

    async def many(
        self, op: str, targets: Sequence[Any], call: Callable[[Any], Awaitable[Any]]
    ) -> tuple[list[Any], list[Any]]:
        """Run ``call(target)`` on every target concurrently; return (succeeded, failed) targets.

        Targets need a ``replica_id`` attribute (used in logs and failure records).
        """

        async def run(t: Any) -> None:
            await self.one(op, t.replica_id, lambda: call(t))

        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[None]] = []
        try:
            for i, t in enumerate(targets):
                if i and i % max(1, self.fanout) == 0:
                    await asyncio.sleep(0)
                tasks.append(loop.create_task(run(t)))
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        results = await asyncio.gather(*tasks, return_exceptions=True)
        ok: list[Any] = []
        bad: list[Any] = []
        for t, r in zip(targets, results, strict=True):
            if isinstance(r, asyncio.CancelledError):
                raise r
            (bad if isinstance(r, BaseException) else ok).append(t)
        return ok, bad

    def record_failure(self, op: str, target: str, error: str, *, timeout: bool) -> None:
        """Log and record a failed operation (also used for failures noticed elsewhere)."""
        logger.warning("%s on %s failed: %s; continuing without it", op, target, error)
        self.failures.append(OpFailure(self.now(), op, target, error, timeout))
