"""run_fully_async end to end: report shape, counters, checkpoint/resume, spec checks, failures."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from runtime_ledger import Ledger, RecordingSource, ledger_of, trained_ids
from small_config import small_config

from dynres.core import get_plugin_manager, load_config, load_policy
from dynres.core.config import DynresConfig
from dynres.core.errors import ConfigError, RunAbortedError
from dynres.core.metrics import METRIC_KEYS
from dynres.runtime.backends.fake import FakeCluster, fake_prompts
from dynres.runtime.loop.driver import CHECKPOINT_FORMAT, FullyAsyncRun, RunSpec, run_fully_async
from dynres.runtime.loop.ledger import checkpoint_sample_ids, held_sample_ids
from dynres.runtime.loop.report import RunReport
from dynres.runtime.samples import PromptGroup


def cfg(standalone_nodes: int = 1, **at: Any) -> DynresConfig:
    return small_config(standalone_nodes=standalone_nodes, **at)


def spec(cl: FakeCluster, *, config: DynresConfig | None = None, policy: Any = None, **kw: Any) -> RunSpec:
    kw.setdefault("prompts", fake_prompts(n=2))
    kw.setdefault("num_cycles", 3)
    return RunSpec(
        config=config or cfg(),
        policy=policy or load_policy("default", {"deactivate_ratio": 0.5}),
        standalone=cl.standalone,
        hybrid=cl.hybrid,
        train_engine=cl.engine,
        plugin_manager=get_plugin_manager(load_plugins=False),
        **kw,
    )


def test_end_to_end_report_shape_and_counters() -> None:
    cl = FakeCluster(2, 2, tokens_per_s=1000, response_tokens=30, latency=0.002)
    progress: list[int] = []
    src = RecordingSource(fake_prompts(n=2))
    run = FullyAsyncRun(spec(cl, num_cycles=4, prompts=src, progress=lambda c: progress.append(c.step)))
    dropped = run.queue.dropped_ids
    report = asyncio.run(run.run())
    assert cl.violations() == []
    # by identity: every admitted sample trained exactly once (or dropped as stale), none left
    ledger = ledger_of(run, src, cl.engine, dropped)
    ledger.assert_exactly_once()
    assert len(ledger.trained) == 32 and not ledger.left
    assert progress == [1, 2, 3, 4] and [c.step for c in report.cycles] == [1, 2, 3, 4]
    for c in report.cycles:
        assert set(c.metrics) == set(METRIC_KEYS)
        assert 0.0 <= c.metrics["dynamic_resource/train_resource_utilization"] <= 1.0
        assert 0.0 <= c.metrics["dynamic_resource/rollout_resource_utilization"] <= 1.0
        assert 0.0 <= c.metrics["dynamic_resource/resource_utilization"] <= 1.0
        assert c.duration_s > 0 and c.samples_consumed == 8
    s = report.samples
    assert s.consumed == 32 and s.duplicates == 0 and s.failed == 0
    # A final run admits only what its cycles consume: nothing is left queued or half generated.
    assert s.generated == s.consumed + s.dropped_stale and s.queued_at_end == 0
    assert s.admitted == s.generated and s.partial_at_end == 0
    assert report.end_to_end_s == report.cycles[-1].end_s
    assert report.weight_version == 4 and report.final_state == "STANDALONE_ONLY"
    assert report.timeline and report.timeline[0].new == "ACTIVATING"
    assert report.hybrid_gpus == 2 and report.standalone_gpus == 2
    data = json.loads(report.to_json())
    assert data["cycles"][0]["metrics"]["dynamic_resource/mq_size"] >= 0
    assert data["operations"]["engine"]["sleep"]["count"] >= 1
    assert data["samples"]["consumed"] == 32


def test_async_progress_callback_and_async_prompt_source() -> None:
    async def prompts() -> AsyncIterator[PromptGroup]:
        for g in fake_prompts(n=2):
            await asyncio.sleep(0)
            yield g

    seen: list[int] = []

    async def progress(c: Any) -> None:
        await asyncio.sleep(0)
        seen.append(c.step)

    cl = FakeCluster(2, 1)
    report = asyncio.run(run_fully_async(spec(cl, prompts=prompts(), progress=progress)))
    assert seen == [1, 2, 3] and len(report.cycles) == 3


def test_exhausted_prompt_source_stops_early_with_a_reason() -> None:
    cl = FakeCluster(2, 1)
    report = asyncio.run(run_fully_async(spec(cl, prompts=fake_prompts(20, n=2), num_cycles=10)))
    assert 0 < len(report.cycles) < 10
    assert "prompt source ran out" in report.stopped_early


def test_prompt_source_error_surfaces_instead_of_hanging() -> None:
    def prompts() -> Iterator[PromptGroup]:
        yield from fake_prompts(3, n=2)
        raise RuntimeError("dataset broke")

    cl = FakeCluster(2, 1)
    with pytest.raises(RunAbortedError, match="dataset broke") as err:
        asyncio.run(asyncio.wait_for(run_fully_async(spec(cl, prompts=prompts())), 10))
    assert isinstance(err.value.__cause__, RuntimeError)
    # the three samples read before the source broke are trained or in the checkpoint
    report = err.value.report
    assert isinstance(report, RunReport) and report.checkpoint is not None
    ckpt = report.checkpoint
    kept = {d["group"]["sample_id"] for d in ckpt["queue"]} | {d["group"]["sample_id"] for d in ckpt["partial"]}
    trained = {s.sample_id for b in cl.engine.batches for s in b}
    assert kept | trained == {"p0", "p1", "p2"} and not kept & trained


def test_standalone_replica_dying_is_survived() -> None:
    cl = FakeCluster(3, 1, tokens_per_s=1000, response_tokens=30)
    cl.standalone[0].die_after_s = 0.02
    report = asyncio.run(run_fully_async(spec(cl, num_cycles=4, probation_backoff_s=0.01, max_probes=2)))
    assert len(report.cycles) == 4
    # probation, then two failed health probes (it stays dead), then quarantine
    assert [e.event for e in report.replica_events if e.replica == "s0"] == ["probation", "quarantined"]
    assert "2 health probes failed" in report.quarantined["s0"]
    assert any(f.target == "s0" for f in report.op_failures)
    assert report.samples.duplicates == 0 and report.samples.failed == 0


def test_checkpoint_keeps_partial_samples_and_resume_finishes_them() -> None:
    cl = FakeCluster(2, 2, tokens_per_s=500, response_tokens=60)
    pol = load_policy("default", {"deactivate_ratio": 0.5})
    # the progress callback lets the samples admitted after the last sync make some progress
    # before the run ends, so there is partial output to keep
    src1 = RecordingSource(fake_prompts(n=2))
    run1 = FullyAsyncRun(
        spec(cl, policy=pol, num_cycles=2, keep_checkpoint=True, progress=lambda c: asyncio.sleep(0.03), prompts=src1)
    )
    first = asyncio.run(run1.run())
    # the first run's own ledger counts the partial samples it still holds as kept, not lost
    ledger_of(run1, src1, cl.engine, run1.queue.dropped_ids).assert_exactly_once()
    ckpt = first.checkpoint
    assert ckpt is not None and ckpt["format"] == CHECKPOINT_FORMAT
    json.dumps(ckpt)  # JSON-serialisable
    assert ckpt["global_steps"] == 2 and ckpt["weight_version"] == 2
    assert first.samples.partial_at_end == len(ckpt["partial"]) > 0
    assert first.samples.partial_tokens_at_end > 0
    assert ckpt["policy"]["state"] == pol.state_dict()
    partial_ids = {
        r["request_id"]
        for p in ckpt["partial"]
        for r in p["results"]
        if r["finish_reason"] == "abort" and r["token_ids"]
    }
    assert partial_ids

    cl2 = FakeCluster(2, 2, tokens_per_s=500, response_tokens=60)
    pol2 = load_policy("default", {"deactivate_ratio": 0.5})
    src2 = RecordingSource(fake_prompts(n=2, prefix="q"))
    run2 = FullyAsyncRun(spec(cl2, policy=pol2, num_cycles=2, resume_from=ckpt, prompts=src2))
    dropped2 = run2.queue.dropped_ids
    second = asyncio.run(run2.run())
    # by identity: what the checkpoint held is trained exactly once, or still held or dropped
    held = checkpoint_sample_ids(ckpt)
    assert held and len(held) == len(set(held))
    Ledger(
        admitted=held + src2.taken,
        trained=trained_ids(cl2.engine),
        left=held_sample_ids(run2),
        dropped=dropped2,
    ).assert_exactly_once()
    assert set(held) & set(trained_ids(cl2.engine))
    assert [c.step for c in second.cycles] == [3, 4]
    assert second.weight_version == 4
    resumed = {rid for r in cl2.replicas for rid, n in r.resumed_with.items() if n > 0}
    assert partial_ids <= resumed  # the interrupted responses continued from their tokens
    trained = {s.sample_id for b in cl2.engine.batches for s in b}
    queued = {d["group"]["sample_id"] for d in ckpt["queue"]}
    assert queued <= trained  # the checkpointed queue was consumed first
    assert cl2.violations() == []


def test_checkpoint_from_a_different_policy_is_rejected() -> None:
    cl = FakeCluster(2, 1)
    first = asyncio.run(run_fully_async(spec(cl, num_cycles=1, keep_checkpoint=True)))
    cl2 = FakeCluster(2, 1)
    with pytest.raises(ConfigError, match="written by policy 'default'"):
        asyncio.run(run_fully_async(spec(cl2, policy=load_policy("static_fully_async"), resume_from=first.checkpoint)))
    with pytest.raises(ConfigError, match="not a dynres checkpoint"):
        asyncio.run(run_fully_async(spec(FakeCluster(2, 1), resume_from={"format": "x"})))


def test_run_spec_checks_name_the_problem() -> None:
    cl = FakeCluster(2, 2)
    off = load_config({"async_training": {"use_dynamic_resource_scheduling": False}})
    with pytest.raises(ConfigError, match="use_dynamic_resource_scheduling is false"):
        spec(cl, config=off)
    with pytest.raises(ConfigError, match="num_cycles"):
        spec(cl, num_cycles=0)
    with pytest.raises(ConfigError, match="no replica"):
        spec(FakeCluster(0, 0))
    dup = FakeCluster(2, 0)
    dup.standalone[1].replica_id = "s0"
    with pytest.raises(ConfigError, match="repeated"):
        spec(dup)


def test_a_run_object_runs_once() -> None:
    from dynres.core.errors import RuntimeStateError

    r = FullyAsyncRun(spec(FakeCluster(2, 1), num_cycles=1))
    asyncio.run(r.run())
    with pytest.raises(RuntimeStateError, match="runs once"):
        asyncio.run(r.run())


def _virtual(seed: int) -> RunReport:
    loop_mod = pytest.importorskip("dynres.runtime.sim.virtual_time")
    cl = FakeCluster(2, 2, tokens_per_s=300, response_tokens=lambda r: 20 + hash(r.request_id) % 40, latency=0.05)
    return loop_mod.run_virtual(run_fully_async(spec(cl, num_cycles=5, seed=seed, prompts=fake_prompts(n=2))))


def test_runs_on_a_virtual_time_loop_deterministically() -> None:
    a, b = _virtual(1), _virtual(1)

    def strip(r: RunReport) -> list[Any]:
        return [(c.step, c.start_s, c.end_s, c.metrics, c.activated, c.deactivated) for c in r.cycles]

    assert strip(a) == strip(b)
    assert a.end_to_end_s == b.end_to_end_s > 0
    assert a.operations.deactivations > 0  # the switches really happened in virtual time


def test_checkpoint_during_a_run_is_json() -> None:
    snapshots: list[str] = []
    cl = FakeCluster(2, 1)
    r = FullyAsyncRun(spec(cl, num_cycles=2))
    r.spec.progress = lambda c: snapshots.append(json.dumps(r.checkpoint()))
    asyncio.run(r.run())
    assert len(snapshots) == 2
    assert json.loads(snapshots[1])["global_steps"] == 2


def _token_contexts(hybrid_tokens_per_s: float) -> tuple[list[Any], FakeCluster]:
    from dynres.core import ScheduleContext
    from dynres.policies.default import DefaultPolicy

    loop_mod = pytest.importorskip("dynres.runtime.sim.virtual_time")
    seen: list[ScheduleContext] = []

    class Recording(DefaultPolicy):
        name = "recording_default_tokens"

        def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
            return True  # hybrids in every cycle: each one measures them

        def update_after_step(self, ctx: ScheduleContext) -> None:
            seen.append(ctx)

    # Production-bound: a response takes 2-4 s per request, a fit step 0.5 s.
    cl = FakeCluster(
        2,
        2,
        tokens_per_s=100,
        response_tokens=lambda r: 200 + hash(r.request_id) % 200,
        latency=0.05,
        phase_times={"update_actor": 0.5},
    )
    for r in cl.hybrid:
        r.tokens_per_s = hybrid_tokens_per_s
    pol = Recording({"deactivate_ratio": 0.5})
    loop_mod.run_virtual(run_fully_async(spec(cl, policy=pol, num_cycles=5, seed=1, prompts=fake_prompts(n=2))))
    return seen, cl


def test_context_token_counts_tell_slow_hybrid_replicas_from_fast_ones() -> None:
    """last_hybrid_tokens / last_standalone_tokens: per kind, per cycle, what the replicas produced."""
    rates = {}
    for hybrid_speed in (100.0, 5.0):
        seen, cl = _token_contexts(hybrid_speed)
        cycles = seen[1:]  # seen[0] is the start-up decision, before any cycle
        assert len(cycles) == 5
        # Every token the replicas counted by the run's last decision is in exactly one cycle.
        assert sum(c.last_hybrid_tokens + c.last_standalone_tokens for c in cycles) <= sum(
            r.generated_tokens for r in cl.replicas
        )
        assert sum(c.last_hybrid_tokens for c in cycles) == sum(r.generated_tokens for r in cl.hybrid)
        # Cycles whose queue already held the wait target deactivate at once: no window to measure.
        hybrid = [c for c in cycles if c.last_hybrid_active_s > 0.5]
        assert hybrid and all(c.last_standalone_tokens > 0 for c in cycles)
        # Tokens per second of the hybrids while routable against the standalone ones' over the cycle.
        rates[hybrid_speed] = sum(c.last_hybrid_tokens / c.last_hybrid_active_s for c in hybrid) / sum(
            c.last_standalone_tokens / c.last_cycle_time_s for c in hybrid
        )
    assert rates[5.0] < 0.15 < 0.5 < rates[100.0], rates
