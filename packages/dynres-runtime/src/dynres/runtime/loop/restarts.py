"""Replica restarts: the per-replica budget, its backoff, and the record of every restart.

A replica whose actor, process or node is gone (it reports a ``lost_reason``, or it failed every
health probe of its probation) is recreated by the run's
:data:`~dynres.runtime.protocols.ReplicaRestarter` instead of being quarantined, as long as its
budget lasts: at most ``max_restarts`` attempts per replica over the whole run, attempt ``k``
waiting ``min(max_backoff_s, backoff_s x 2^(k-1))`` first, so an engine that dies at once every
time does not rebuild in a tight loop. Once the budget is spent the replica is quarantined. The
controller (:mod:`~dynres.runtime.loop.controller`) carries a restart out; this module only keeps
the count and the records that ``report.json`` lists under ``replica_restarts``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaRestart:
    """One replica that went away and was recreated (or given up on)."""

    replica: str
    """Replica id (the recreated replica keeps it)."""
    cause: str
    """Why it went away: the failure that took it out of routing."""
    cycle: int
    """Sync cycle in progress when it went away (1 for the first cycle)."""
    seconds_to_return: float | None
    """Run-clock seconds from going away to being routable again (standalone) or back asleep in
    its slot or active (hybrid); None when it did not come back (budget spent, or the run ended)."""
    attempts: int = 0
    """Restart attempts it took (count; each one is charged to the replica's budget)."""
    rebuild_s: float | None = None
    """Run-clock seconds the attempt that brought it back spent in the restarter (shutting the gone
    replica down and building its successor); the rest of ``seconds_to_return`` is the backoffs, any
    failed attempt before it, the health probe and bringing it back. None when it did not come back."""


class RestartBudget:
    """Counts restart attempts per replica and keeps one :class:`ReplicaRestart` per episode."""

    def __init__(
        self,
        *,
        max_restarts: int,
        backoff_s: float,
        max_backoff_s: float,
        now: Callable[[], float],
        cycle: Callable[[], int],
    ) -> None:
        """A budget of ``max_restarts`` attempts per replica (0 = never restart); waits in seconds."""
        self.max_restarts = max_restarts
        """Restart attempts one replica may use over the whole run (count)."""
        self.backoff_s = backoff_s
        """Wait before a replica's first restart attempt (seconds; doubles per attempt)."""
        self.max_backoff_s = max_backoff_s
        """Longest wait before one attempt (seconds)."""
        self.records: list[ReplicaRestart] = []
        """Every restart episode, in the order they began."""
        self._used: dict[str, int] = {}
        self._open: dict[str, tuple[int, float]] = {}
        self._now = now
        self._cycle = cycle

    def left(self, replica_id: str) -> int:
        """Restart attempts ``replica_id`` may still use (count)."""
        return max(0, self.max_restarts - self._used.get(replica_id, 0))

    def begin(self, replica_id: str, cause: str) -> None:
        """A restart episode of ``replica_id`` starts now (it just went away)."""
        self._open[replica_id] = (len(self.records), self._now())
        self.records.append(ReplicaRestart(replica_id, cause, self._cycle(), None))

    def next_wait(self, replica_id: str) -> float:
        """Charge one attempt to ``replica_id`` and return the wait before it (seconds)."""
        n = self._used[replica_id] = self._used.get(replica_id, 0) + 1
        self._bump(replica_id)
        return min(self.max_backoff_s, self.backoff_s * 2 ** (n - 1))

    def _bump(self, replica_id: str) -> None:
        if replica_id in self._open:
            i, _ = self._open[replica_id]
            self.records[i] = dataclasses.replace(self.records[i], attempts=self.records[i].attempts + 1)

    def returned(self, replica_id: str, rebuild_s: float) -> float:
        """The open episode of ``replica_id`` ended with the replica back, its last attempt's restarter
        having taken ``rebuild_s`` seconds; return its seconds out."""
        i, since = self._open.pop(replica_id)
        seconds = self._now() - since
        self.records[i] = dataclasses.replace(self.records[i], seconds_to_return=seconds, rebuild_s=rebuild_s)
        return seconds

    def given_up(self, replica_id: str) -> None:
        """The open episode of ``replica_id`` ended without it coming back."""
        self._open.pop(replica_id, None)
