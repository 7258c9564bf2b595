"""Message queue between the rollouter and the trainer, with staleness accounting.

Holds finished :class:`~dynres.runtime.samples.Sample` objects, first in first out, bounded at
``max_size`` samples (the run sets it to ``max_required_samples + step_required_samples``, which
the rollouter's admission rule never exceeds, even with the largest extra a policy may ask for,
so :meth:`MessageQueue.put` does not block in practice).

**Staleness rule.** A sample's staleness is ``trainer_version - sample.start_version``, where
``trainer_version`` is the number of weight syncs done so far (``global_steps``) and
``start_version`` the weight version the sample's generation started with. When the trainer
takes a batch, every queued sample whose staleness exceeds ``max_staleness_versions`` is
dropped and counted in ``dropped_stale``. The default bound is ``1 + ceil(staleness_threshold)``:
the admission rule keeps at most ``staleness_threshold`` cycles of backlog beyond the cycle
being consumed, so a sample produced under it is consumed within that many versions; an older
one was held up abnormally (for example a long response resumed across several syncs).
Each drop is reported to ``on_drop`` so the rollouter can admit a replacement.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable

from dynres.core.errors import RuntimeStateError
from dynres.runtime.samples import Sample

logger = logging.getLogger("dynres.runtime.loop.queue")


def default_max_staleness_versions(staleness_threshold: float) -> int:
    """Versions a sample may lag the trainer before it is dropped: 1 + ceil(staleness_threshold)."""
    return 1 + math.ceil(staleness_threshold)


class MessageQueue:
    """Bounded FIFO of finished samples with staleness drops and duplicate detection."""

    def __init__(
        self,
        max_size: int,
        *,
        max_staleness_versions: int | None = None,
        staleness_threshold: float = 0.0,
        on_drop: Callable[[Sample], None] | None = None,
    ) -> None:
        """Create an empty queue.

        :param max_size: most samples held at once (count, >= 1).
        :param max_staleness_versions: drop samples lagging more versions than this (count);
            None derives it from ``staleness_threshold`` (see the module doc).
        :param staleness_threshold: verl's ``staleness_threshold`` (fraction of a cycle).
        :param on_drop: called for each sample dropped as stale.
        """
        if max_size < 1:
            raise ValueError(f"MessageQueue max_size must be >= 1, got {max_size}")
        self.max_size = max_size
        """Most samples held at once (count)."""
        self.max_staleness_versions = (
            default_max_staleness_versions(staleness_threshold)
            if max_staleness_versions is None
            else max_staleness_versions
        )
        """Largest staleness (versions) a consumed sample may have."""
        self.on_drop = on_drop
        """Called for each sample dropped as stale."""
        self.dropped_ids: list[str] = []
        """Ids of the samples this queue dropped as stale, in order (what a ledger of the run
        counts as neither trained nor lost; a stale drop is rare, so the list stays short)."""
        self.consumed = 0
        """Samples handed to the trainer and not given back (count; after a failed train step
        the batch is requeued, so this counts what was trained or is being trained)."""
        self.dropped_stale = 0
        """Samples dropped because they were too stale (count)."""
        self.duplicates = 0
        """Samples rejected because their id was already queued or consumed (count; must stay 0)."""
        self._items: deque[Sample] = deque()
        self._seen: set[str] = set()
        # start_version -> queued samples with it (the min tells whether anything is stale).
        self._versions: dict[int, int] = {}
        self._cond: asyncio.Condition | None = None

    @property
    def size(self) -> int:
        """Samples waiting now (count)."""
        return len(self._items)

    def __len__(self) -> int:
        """Samples waiting now (count)."""
        return len(self._items)

    def _condition(self) -> asyncio.Condition:
        # Created on first use so the queue can be built outside a running loop.
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def put(self, sample: Sample) -> bool:
        """Append ``sample`` (waits while full); return False for a duplicate, which is dropped."""
        if sample.sample_id in self._seen:
            self.duplicates += 1
            logger.error("sample %s was produced twice; the copy is dropped", sample.sample_id)
            return False
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: len(self._items) < self.max_size)
            self._seen.add(sample.sample_id)
            self._items.append(sample)
            self._versions[sample.start_version] = self._versions.get(sample.start_version, 0) + 1
            cond.notify_all()
        return True

    def purge_stale(self, trainer_version: int) -> int:
        """Drop queued samples that lag ``trainer_version`` too much; return how many."""
        limit = self.max_staleness_versions
        # O(1) when nothing is stale: the versions present are counted on put.
        if not self._versions or trainer_version - min(self._versions) <= limit:
            return 0
        keep: deque[Sample] = deque()
        dropped = 0
        for s in self._items:
            if s.staleness(trainer_version) > limit:
                dropped += 1
                logger.info(
                    "dropping sample %s: started at weight version %d, trainer is at %d (max staleness %d versions)",
                    s.sample_id,
                    s.start_version,
                    trainer_version,
                    limit,
                )
                self.dropped_ids.append(s.sample_id)
                if self.on_drop is not None:
                    self.on_drop(s)
                self._forget_version(s.start_version)
            else:
                keep.append(s)
        self._items = keep
        self.dropped_stale += dropped
        return dropped

    async def get_batch(
        self, n: int, trainer_version: int, *, exhausted: Callable[[], bool] = lambda: False
    ) -> list[Sample] | None:
        """Wait for ``n`` fresh samples and take them (oldest first).

        Stale samples are dropped first (and again whenever the wait wakes up). Returns None
        when ``exhausted()`` says no more samples can ever arrive and fewer than ``n`` are queued.
        """
        if n < 1:
            raise RuntimeStateError(f"get_batch needs n >= 1 samples, got {n}")
        if n > self.max_size:
            raise RuntimeStateError(f"get_batch({n}) can never be served by a queue bounded at {self.max_size} samples")
        cond = self._condition()
        async with cond:

            def ready() -> bool:
                self.purge_stale(trainer_version)
                return len(self._items) >= n or exhausted()

            await cond.wait_for(ready)
            if len(self._items) < n:
                return None
            batch = [self._items.popleft() for _ in range(n)]
            for s in batch:
                self._forget_version(s.start_version)
            self.consumed += n
            cond.notify_all()
            return batch

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` is true; it is re-checked on every queue change or :meth:`notify`."""
        cond = self._condition()
        async with cond:
            await cond.wait_for(predicate)

    async def notify(self) -> None:
        """Wake every waiter so it re-checks its condition (the rollouter's state changed)."""
        cond = self._condition()
        async with cond:
            cond.notify_all()

    def requeue(self, batch: list[Sample]) -> None:
        """Put a batch the trainer took but could not train back at the front, in its order;
        ``consumed`` goes back down by its size (it counts only what was trained)."""
        for s in reversed(batch):
            self._items.appendleft(s)
            self._versions[s.start_version] = self._versions.get(s.start_version, 0) + 1
        self.consumed -= len(batch)

    def snapshot(self) -> list[Sample]:
        """The queued samples, oldest first (for checkpoints)."""
        return list(self._items)

    def restore(self, samples: list[Sample]) -> None:
        """Put checkpointed samples back (before the run starts; ids are marked as seen)."""
        for s in samples:
            self._seen.add(s.sample_id)
            self._items.append(s)
            self._versions[s.start_version] = self._versions.get(s.start_version, 0) + 1

    def _forget_version(self, version: int) -> None:
        left = self._versions[version] - 1
        if left:
            self._versions[version] = left
        else:
            del self._versions[version]
