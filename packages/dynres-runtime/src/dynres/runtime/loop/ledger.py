"""Where each admitted sample of a run went, by id, seen from outside the run's own counters.

The simulator's end-to-end check, the fault table and the runtime's tests all ask the same
question of a finished (or failed, or checkpointed) run: was every sample the prompt source handed
out trained exactly once, or still held by the run, or dropped as too stale? The answer needs ids
gathered from outside the run (the prompt source, the train engine) plus what the run still holds,
which :func:`held_sample_ids` reads.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dynres.runtime.loop.driver import FullyAsyncRun


def checkpoint_sample_ids(checkpoint: Mapping[str, Any] | None) -> list[str]:
    """Ids of the samples a run checkpoint holds: queued first, then partial (empty for None)."""
    if not checkpoint:
        return []
    return [d["group"]["sample_id"] for part in ("queue", "partial") for d in checkpoint[part]]


def held_sample_ids(run: FullyAsyncRun, checkpoint: Mapping[str, Any] | None = None) -> list[str]:
    """Ids ``run`` still holds: queued, partial, and those only in ``checkpoint`` (a failed run's)."""
    held = [s.sample_id for s in run.queue.snapshot()] + [p.group.sample_id for p in run.rollouter.partials]
    seen = set(held)
    return held + [i for i in checkpoint_sample_ids(checkpoint) if i not in seen]


@dataclass(frozen=True)
class SampleLedger:
    """Sample ids of a run, observed outside the run's own counters."""

    admitted: Sequence[str]
    """Ids the prompt source handed to the rollouter, in order."""
    trained: Sequence[str]
    """Ids in the batches the train engine received, in order (repeats would be duplicates)."""
    left: Sequence[str] = field(default_factory=list)
    """Ids the run still holds at the end: queued, partial or in its checkpoint."""
    dropped: Sequence[str] = field(default_factory=list)
    """Ids the queue dropped as too stale (a replacement was admitted for each)."""

    @property
    def duplicated(self) -> list[str]:
        """Ids trained more than once, then ids both trained and still held."""
        twice = sorted(i for i, n in Counter(self.trained).items() if n > 1)
        return twice + sorted(set(self.trained) & set(self.left))

    @property
    def lost(self) -> list[str]:
        """Admitted ids neither trained, nor held, nor dropped as stale."""
        accounted = set(self.trained) | set(self.left) | set(self.dropped)
        return [i for i in self.admitted if i not in accounted]

    @property
    def unknown(self) -> list[str]:
        """Trained ids the prompt source never handed out."""
        return sorted(set(self.trained) - set(self.admitted))

    def problems(self) -> list[str]:
        """What breaks 'each admitted sample trained exactly once, or held, or dropped' ([] = nothing)."""
        out = []
        if dup := self.duplicated:
            out.append(f"{len(dup)} sample(s) trained twice or trained and still held, e.g. {dup[:3]}")
        if lost := self.lost:
            out.append(f"{len(lost)} admitted sample(s) neither trained, held nor dropped, e.g. {lost[:3]}")
        if unknown := self.unknown:
            out.append(f"{len(unknown)} trained sample(s) never admitted, e.g. {unknown[:3]}")
        return out
