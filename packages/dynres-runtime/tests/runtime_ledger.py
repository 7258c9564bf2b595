"""Follow every sample of a fake run by identity: what was admitted, trained, left, dropped.

The prompt source records what the rollouter took, the fake trainer what it trained
(:attr:`FakeTrainEngine.batches`); the run's own counters are never used. A sample is *left*
when the run still holds it (queued, partial, or in a checkpoint) and *dropped* when the queue
discarded it as stale (the rollouter then admits a replacement).

The bookkeeping itself is the runtime's :class:`~dynres.runtime.loop.ledger.SampleLedger`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from dynres.runtime.backends.fake import FakeTrainEngine
from dynres.runtime.loop.driver import FullyAsyncRun
from dynres.runtime.loop.ledger import SampleLedger, held_sample_ids
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


class Ledger(SampleLedger):
    """The product's :class:`SampleLedger` with an assertion that names every problem."""

    def assert_exactly_once(self) -> None:
        """Every admitted sample trained exactly once or accounted for; nothing unknown trained."""
        problems = self.problems()
        assert not problems, "; ".join(problems)


def ledger_of(
    run: FullyAsyncRun,
    source: RecordingSource,
    engine: FakeTrainEngine,
    dropped: list[str],
    *,
    checkpoint: Mapping[str, Any] | None = None,
) -> Ledger:
    """The ledger of one finished (or failed) run; ``checkpoint``: the one its report holds, if any."""
    left = held_sample_ids(run, checkpoint)
    return Ledger(admitted=list(source.taken), trained=trained_ids(engine), left=left, dropped=list(dropped))
