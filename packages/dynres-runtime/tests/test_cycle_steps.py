"""The trainer loop's steps as the replicas and the report see them (loop/cycle.py)."""

from __future__ import annotations

import asyncio

import pytest
from small_config import small_config

from dynres.core import get_plugin_manager, load_policy
from dynres.runtime.backends.fake import FakeCluster, fake_prompts
from dynres.runtime.loop.driver import FullyAsyncRun, RunSpec


def _spec(cl: FakeCluster, num_cycles: int = 2) -> RunSpec:
    cfg = small_config()
    return RunSpec(
        config=cfg,
        policy=load_policy("default", {"deactivate_ratio": 0.5}),
        standalone=cl.standalone,
        hybrid=cl.hybrid,
        train_engine=cl.engine,
        prompts=fake_prompts(n=2),
        num_cycles=num_cycles,
        plugin_manager=get_plugin_manager(load_plugins=False),
    )


def test_startup_loads_the_current_weights_into_standalone_replicas_before_they_generate() -> None:
    cl = FakeCluster(2, 2, tokens_per_s=1000, response_tokens=30, latency=0.002)
    report = asyncio.run(FullyAsyncRun(_spec(cl)).run())
    assert cl.violations() == []
    for r in cl.standalone:
        ops = [(o.op, o.detail) for o in cl.log if o.target == r.replica_id and o.event == "end"]
        first_generate = next(i for i, (op, _) in enumerate(ops) if op == "generate")
        loads = [d for op, d in ops[:first_generate] if op == "update_weights"]
        assert loads == ["version=0"], f"{r.replica_id} generated before loading version 0: {ops[:first_generate]}"
    # ... and every cycle's sync reaches them with the next version.
    assert report.weight_version == 2
    assert all(r.weight_version == 2 for r in cl.standalone)


def test_the_last_step_of_a_cycle_is_charged_through_the_sync_and_decisions() -> None:
    # The fit steps' allocated times cover the whole cycle: the last one runs on through the
    # weight sync and the policy calls after it (the train_allocated_time metric), so on a
    # virtual-time loop they add up exactly to the cycle's duration.
    from dynres.core.metrics import TRAIN_ALLOCATED_TIME
    from dynres.runtime.sim.virtual_time import run_virtual

    cl = FakeCluster(2, 2, tokens_per_s=300, response_tokens=30, latency=0.05)
    report = run_virtual(FullyAsyncRun(_spec(cl, num_cycles=3)).run())
    assert len(report.cycles) == 3
    for c in report.cycles:
        assert c.metrics[TRAIN_ALLOCATED_TIME] == pytest.approx(c.duration_s, rel=1e-9)
