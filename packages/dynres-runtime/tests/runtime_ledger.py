"""Follow every sample of a fake run by identity: what was admitted, trained, left, dropped.

The prompt source records what the rollouter took, the fake trainer what it trained
(:attr:`FakeTrainEngine.batches`); the run's own counters are never used. A sample is *left*
when the run still holds it (queued, partial, or in a checkpoint) and *dropped* when the queue
discarded it as stale (the rollouter then admits a replacement).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynres.runtime.backends.fake import FakeTrainEngine
from dynres.runtime.loop.run import FullyAsyncRun
from dynres.runtime.samples import PromptGroup


class RecordingSource:
    """A prompt source that remembers the id of every group handed out, in order."""

    def __init__(self, groups: Iterable[PromptGroup]) -> None:
        self._groups = iter(groups)
        self.taken: list[str] = []

    def __iter__(self) -> Iterator[PromptGroup]:
        for g in self._groups:
            self.taken.append(g.sample_id)
            yield g


def trained_ids(engine: FakeTrainEngine, steps: int | None = None) -> list[str]:
    """Ids of the samples ``engine`` trained on (the first ``steps`` fit steps; None = all)."""
    return [s.sample_id for b in engine.batches[:steps] for s in b]


def checkpoint_ids(ckpt: Mapping[str, Any] | None) -> list[str]:
    """Ids of the samples a checkpoint holds (queued, then partial)."""
    if not ckpt:
        return []
    return [d["group"]["sample_id"] for d in ckpt["queue"]] + [d["group"]["sample_id"] for d in ckpt["partial"]]


@dataclass
class Ledger:
    """Where each admitted sample ended up."""

    admitted: list[str]
    trained: list[str]
    left: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    @property
    def duplicated(self) -> list[str]:
        """Ids trained more than once, or both trained and still held."""
        counts = Counter(self.trained)
        twice = [i for i, n in counts.items() if n > 1]
        return twice + sorted(set(self.trained) & set(self.left))

    @property
    def lost(self) -> list[str]:
        """Admitted ids neither trained, nor held, nor dropped as stale."""
        seen = set(self.trained) | set(self.left) | set(self.dropped)
        return [i for i in self.admitted if i not in seen]

    def assert_exactly_once(self) -> None:
        """Every admitted sample trained exactly once or accounted for; nothing unknown trained."""
        assert not self.duplicated, f"trained twice (or trained and still held): {self.duplicated[:10]}"
        assert not self.lost, f"{len(self.lost)} admitted samples lost: {self.lost[:10]}"
        unknown = set(self.trained) - set(self.admitted)
        assert not unknown, f"trained samples that were never admitted: {sorted(unknown)[:10]}"


def ledger_of(
    run: FullyAsyncRun,
    source: RecordingSource,
    engine: FakeTrainEngine,
    dropped: list[str],
    *,
    checkpoint: Mapping[str, Any] | None = None,
) -> Ledger:
    """The ledger of one finished (or failed) run; ``checkpoint``: the one its report holds, if any."""
    left = [s.sample_id for s in run.queue.snapshot()] + [p.group.sample_id for p in run.rollouter.partials]
    left += [i for i in checkpoint_ids(checkpoint) if i not in left]
    return Ledger(admitted=list(source.taken), trained=trained_ids(engine), left=left, dropped=list(dropped))
