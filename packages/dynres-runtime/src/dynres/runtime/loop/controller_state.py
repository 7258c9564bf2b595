"""The controller's states and the records of its timeline: state transitions and replica events."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["ControllerState", "ReplicaEvent", "StateChange"]


class ControllerState(str, enum.Enum):
    """Where the hybrid replicas are in their lifecycle."""

    STANDALONE_ONLY = "STANDALONE_ONLY"
    """Hybrid replicas asleep; the trainer owns its GPUs."""
    ACTIVATING = "ACTIVATING"
    """Trainer offloading, hybrid replicas waking up and receiving weights."""
    HYBRID_ACTIVE = "HYBRID_ACTIVE"
    """Hybrid replicas routable and generating."""
    REBALANCING = "REBALANCING"
    """Moving in-flight requests onto freshly activated replicas."""
    DEACTIVATING = "DEACTIVATING"
    """Hybrid replicas leaving routing, aborting, sleeping; trainer onloading."""


@dataclass(frozen=True)
class ReplicaEvent:
    """A replica leaving routing after a failure, coming back, or being quarantined."""

    at_s: float
    """Run-clock time (seconds since run start)."""
    replica: str
    """Replica id."""
    event: str
    """``probation`` (out, to be probed), ``restart`` (gone, being recreated), ``back`` (probe
    passed or recreated: routable again, or asleep in its hybrid slot), ``quarantined``."""
    reason: str
    """The failure (or, for ``back``, how long it was out)."""


@dataclass(frozen=True)
class StateChange:
    """One controller state transition."""

    at_s: float
    """Run-clock time (seconds since run start)."""
    old: str
    """State left."""
    new: str
    """State entered."""
