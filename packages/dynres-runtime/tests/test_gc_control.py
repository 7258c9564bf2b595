"""The runtime's GC step: start-up objects frozen during a run, no full collection in transitions."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from small_config import small_config

from dynres.core import get_plugin_manager, load_policy
from dynres.runtime.backends.fake import FakeCluster, FakeReplica, FakeTrainEngine, fake_prompts
from dynres.runtime.loop.controller import Controller
from dynres.runtime.loop.driver import RunSpec, run_fully_async
from dynres.runtime.loop.gc_control import full_collections_deferred, no_full_collection, run_gc_control
from dynres.runtime.loop.ops import OpRunner
from dynres.runtime.loop.routing import LoadBalancer
from dynres.runtime.protocols import GenerationRequest, WeightUpdate


def _full_collections_while(work: Any) -> int:
    """Full (generation 2) collections the collector ran on its own during ``work()``."""
    seen: list[int] = []

    def cb(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2:
            seen.append(1)

    gc.callbacks.append(cb)
    try:
        work()
    finally:
        gc.callbacks.remove(cb)
    return len(seen)


def _grow_heap() -> list[Any]:
    # Long-lived tracked objects, enough for CPython's own rules to start full collections.
    return [[i] for i in range(300_000)]


def test_no_full_collection_blocks_the_collectors_own_full_passes() -> None:
    gc.collect()
    assert _full_collections_while(_grow_heap) > 0  # the control: the heap growth triggers some
    gc.collect()
    with no_full_collection():
        assert full_collections_deferred()
        assert _full_collections_while(_grow_heap) == 0
    assert not full_collections_deferred()
    assert _full_collections_while(_grow_heap) > 0  # the threshold is back


def test_run_gc_control_freezes_start_up_objects_and_undoes_it() -> None:
    before = gc.get_threshold()
    startup_object: list[Any] = [["built before the run"]]
    assert _in_a_generation(startup_object)
    with run_gc_control():
        assert gc.get_freeze_count() > 0
        assert not _in_a_generation(startup_object)  # frozen: no collection scans it
        with run_gc_control():  # a second run in the same process shares the step
            assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0 and _in_a_generation(startup_object)
    assert gc.get_threshold() == before


def test_run_gc_control_leaves_a_freeze_of_the_host_program_in_place() -> None:
    host_object: list[Any] = [["frozen by the host before the run"]]
    gc.freeze()  # the host program's own start-up freeze
    try:
        host_count = gc.get_freeze_count()
        assert host_count > 0 and not _in_a_generation(host_object)
        with run_gc_control():
            assert gc.get_freeze_count() >= host_count
        # The run must not unfreeze what the host froze: the object is still in no generation.
        assert not _in_a_generation(host_object)
        assert gc.get_freeze_count() >= host_count
    finally:
        gc.unfreeze()
    assert _in_a_generation(host_object)


def test_run_gc_control_leaves_a_freeze_the_host_made_during_the_run_in_place() -> None:
    with run_gc_control():
        host_object: list[Any] = [["frozen by the host while the run went on"]]
        gc.freeze()
        assert not _in_a_generation(host_object)
    # Unfreezing at the end would undo the host's freeze too (CPython unfreezes all at once).
    try:
        assert not _in_a_generation(host_object)
    finally:
        gc.unfreeze()
    assert _in_a_generation(host_object)


def _in_a_generation(obj: Any) -> bool:
    # A frozen object is in the permanent generation, which gc.get_objects(g) does not list.
    return any(o is obj for g in range(3) for o in gc.get_objects(g))


def test_a_run_takes_the_gc_step_and_gives_it_back() -> None:
    cfg = small_config()
    cl = FakeCluster(2, 2, tokens_per_s=1000, response_tokens=30, latency=0.002)
    frozen: list[int] = []
    spec = RunSpec(
        config=cfg,
        policy=load_policy("default", {"deactivate_ratio": 0.5}),
        standalone=cl.standalone,
        hybrid=cl.hybrid,
        train_engine=cl.engine,
        plugin_manager=get_plugin_manager(load_plugins=False),
        prompts=fake_prompts(n=2),
        num_cycles=2,
        progress=lambda c: frozen.append(gc.get_freeze_count()),
    )
    report = asyncio.run(run_fully_async(spec))
    assert len(report.cycles) == 2 and cl.violations() == []
    assert frozen and all(n > 0 for n in frozen)
    assert gc.get_freeze_count() == 0


def test_transitions_and_retry_bursts_defer_full_collections() -> None:
    seen: dict[str, bool] = {}

    class Spy(FakeReplica):
        async def sleep(self, level: int = 1) -> None:
            seen["deactivate"] = full_collections_deferred()
            await super().sleep(level)

        async def wake_up(self, tags: Any = None) -> None:
            seen["activate"] = full_collections_deferred()
            await super().wake_up(tags)

        async def generate(self, request: GenerationRequest) -> Any:
            if self.kind.value == "standalone" and request.request_id in first_on:
                # A retry of a request the deactivation took off h0.
                seen.setdefault("retries", True)
                seen["retries"] &= full_collections_deferred()
            first_on.add(request.request_id)
            return await super().generate(request)

    first_on: set[str] = set()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        standalone = Spy("s0", tokens_per_s=1.0, response_tokens=1000)
        hybrid = [Spy("h0", "hybrid", tokens_per_s=1.0, response_tokens=1000)]
        lb = LoadBalancer(retry_batch=1)
        lb.add_replica(standalone)
        ctl = Controller(
            balancer=lb,
            train_engine=FakeTrainEngine(),
            hybrid=hybrid,
            ops=OpRunner(timeout_s=5.0, now=loop.time),
            now=loop.time,
        )
        await ctl.activate(WeightUpdate(1))
        assert not full_collections_deferred()
        tasks = [asyncio.create_task(lb.generate(GenerationRequest(f"q{i}", f"q{i}", range(4), 100))) for i in range(8)]
        while lb.total_in_flight < 8:
            await asyncio.sleep(0)
        await ctl.deactivate()
        while lb.total_in_flight < 8:
            await asyncio.sleep(0)
        for _ in range(3):
            await asyncio.sleep(0)
        seen["after"] = full_collections_deferred()
        lb.start_draining()
        await standalone.abort(None)
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert seen == {"activate": True, "deactivate": True, "retries": True, "after": False}


def test_the_last_run_ends_a_deferral_its_loop_left_open() -> None:
    before = gc.get_threshold()
    with run_gc_control():
        no_full_collection().__enter__()  # a retry burst whose loop closed before it was routed
        assert full_collections_deferred()
    assert not full_collections_deferred()
    assert gc.get_threshold() == before
