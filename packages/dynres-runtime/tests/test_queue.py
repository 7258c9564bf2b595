"""Message queue: FIFO batches, bounded size, staleness drops, duplicates, exhaustion."""

from __future__ import annotations

import asyncio

import pytest

from dynres.core.errors import RuntimeStateError
from dynres.runtime.loop.queue import MessageQueue, default_max_staleness_versions
from dynres.runtime.protocols import GenerationResult
from dynres.runtime.samples import PromptGroup, Sample


def sample(i: int, version: int = 0) -> Sample:
    group = PromptGroup(f"s{i}", [1])
    res = GenerationResult(f"s{i}/0", [1, 2], [0.0, 0.0], "stop", "a", version)
    return Sample(group, (res,), start_version=version, finish_version=version, started_s=0.0, finished_s=0.0)


def test_default_staleness_bound() -> None:
    assert default_max_staleness_versions(0.0) == 1
    assert default_max_staleness_versions(0.1) == 2
    assert default_max_staleness_versions(1.0) == 2
    assert default_max_staleness_versions(1.5) == 3


def test_batches_are_fifo_and_wait_for_enough_samples() -> None:
    async def main() -> None:
        q = MessageQueue(10)
        for i in range(3):
            await q.put(sample(i))
        getter = asyncio.create_task(q.get_batch(4, trainer_version=0))
        await asyncio.sleep(0)
        assert not getter.done()
        await q.put(sample(3))
        batch = await getter
        assert batch is not None and [s.sample_id for s in batch] == ["s0", "s1", "s2", "s3"]
        assert q.size == 0 and q.consumed == 4

    asyncio.run(main())


def test_put_waits_while_full() -> None:
    async def main() -> None:
        q = MessageQueue(2)
        await q.put(sample(0))
        await q.put(sample(1))
        putter = asyncio.create_task(q.put(sample(2)))
        await asyncio.sleep(0)
        assert not putter.done() and q.size == 2
        await q.get_batch(1, 0)
        assert await putter is True
        assert q.size == 2

    asyncio.run(main())


def test_stale_samples_are_dropped_counted_and_reported() -> None:
    async def main() -> None:
        dropped: list[Sample] = []
        q = MessageQueue(10, staleness_threshold=0.5, on_drop=dropped.append)  # bound: 2 versions
        await q.put(sample(0, version=0))
        await q.put(sample(1, version=1))
        await q.put(sample(2, version=2))
        await q.put(sample(3, version=3))
        batch = await q.get_batch(2, trainer_version=3)  # s0 lags 3 versions > 2
        assert batch is not None and [s.sample_id for s in batch] == ["s1", "s2"]
        assert [s.sample_id for s in dropped] == ["s0"] == q.dropped_ids
        assert q.dropped_stale == 1 and q.size == 1

    asyncio.run(main())


def test_explicit_staleness_bound_and_purge() -> None:
    q = MessageQueue(10, max_staleness_versions=0)
    q.restore([sample(0, 4), sample(1, 5)])
    assert q.purge_stale(5) == 1
    assert [s.sample_id for s in q.snapshot()] == ["s1"]
    assert q.purge_stale(5) == 0


def test_duplicates_are_rejected_and_counted() -> None:
    async def main() -> None:
        q = MessageQueue(10)
        assert await q.put(sample(0)) is True
        await q.get_batch(1, 0)
        assert await q.put(sample(0)) is False  # even after it was consumed
        assert q.duplicates == 1 and q.size == 0

    asyncio.run(main())


def test_get_batch_returns_none_when_exhausted() -> None:
    async def main() -> None:
        q = MessageQueue(10)
        await q.put(sample(0))
        done = False
        getter = asyncio.create_task(q.get_batch(2, 0, exhausted=lambda: done))
        await asyncio.sleep(0)
        assert not getter.done()
        done = True
        await q.notify()
        assert await getter is None
        assert q.size == 1  # nothing taken

    asyncio.run(main())


def test_impossible_batches_are_errors() -> None:
    async def main() -> None:
        q = MessageQueue(4)
        with pytest.raises(RuntimeStateError, match="bounded at 4"):
            await q.get_batch(5, 0)
        with pytest.raises(RuntimeStateError, match="n >= 1"):
            await q.get_batch(0, 0)

    asyncio.run(main())
