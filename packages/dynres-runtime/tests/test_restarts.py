"""Replica restarts on fakes and the virtual-time loop: a gone replica comes back with the
current weights, in routing (standalone) or in its hybrid slot, within its budget; nothing
admitted is lost or doubled; the trainer dying ends the run with a report and a checkpoint.

The whole run executes on the virtual-time loop: latencies, backoffs and token rates count loop
time only, so which request a death interrupts does not depend on how busy the machine is.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from runtime_ledger import RecordingSource, ledger_of
from small_config import small_config, small_run

from dynres.core import get_plugin_manager, load_policy
from dynres.core.errors import BackendError, RunAbortedError
from dynres.runtime.backends.fake import FakeCluster, FakeReplica, fake_prompts
from dynres.runtime.loop.checkpoint import CheckpointStore
from dynres.runtime.loop.driver import FullyAsyncRun, RunSpec
from dynres.runtime.loop.report import RunReport
from dynres.runtime.loop.restarts import RestartBudget
from dynres.runtime.protocols import Replica
from dynres.runtime.realrun.output import restarts_line
from dynres.runtime.sim.virtual_time import run_virtual

CFG = small_config(trainer_gpus=1)


def cluster(n_standalone: int = 2, n_hybrid: int = 1) -> FakeCluster:
    """Fakes whose responses take 0.2 s and whose fit steps take 0.5 s (loop time)."""
    return FakeCluster(
        n_standalone,
        n_hybrid,
        tokens_per_s=100,
        response_tokens=20,
        latency={"sleep": 0.05, "wake_up": 0.05, "update_weights": 0.02},
        phase_times={"update_actor": 0.5},
    )


def build(cl: FakeCluster, source: Any, **kw: Any) -> FullyAsyncRun:
    """A run of the fakes with restarts through the cluster (1 s backoff unless ``kw`` says)."""
    kw.setdefault("num_cycles", 8)
    kw.setdefault("restart_replica", cl.restart)
    return small_run(cl, source, config=CFG, **kw)


def run_with_death(cl: FakeCluster, *, at_s: float, replica: str, how: str = "lose", **kw: Any) -> Any:
    """Run ``build(cl)`` on the virtual loop; ``replica`` dies at loop time ``at_s`` (lose or kill).

    Returns the report, the run's sample ledger and the run."""
    source = RecordingSource(fake_prompts(n=2))
    run = build(cl, source, **kw)
    dropped = run.queue.dropped_ids

    async def main() -> Any:
        target = next(r for r in cl.replicas if r.replica_id == replica)
        asyncio.get_running_loop().call_later(at_s, getattr(target, how))
        return await run.run()

    report = run_virtual(main)
    return report, ledger_of(run, source, cl.engine, dropped), run


def first(log: list[Any], target: Any, op: str, event: str = "start", after: float = -1.0) -> float | None:
    """Loop time of ``target``'s first ``op`` ``event`` in the op log after ``after`` (None: none)."""
    return next((r.t for r in log if r.target == target and r.op == op and r.event == event and r.t > after), None)


def test_lost_standalone_is_recreated_with_current_weights_and_nothing_is_lost() -> None:
    cl = cluster()
    report, ledger, run = run_with_death(cl, at_s=2.0, replica="s1")
    assert len(report.cycles) == 8, report.stopped_early
    ledger.assert_exactly_once()
    assert report.samples.failed == 0 and report.samples.duplicates == 0
    [restart] = report.replica_restarts
    assert restart.replica == "s1" and "lost" in restart.cause and restart.attempts == 1
    assert restart.cycle == 1 + sum(1 for c in report.cycles if c.end_s < 2.0)
    # back after its 1 s backoff plus the weight load (no probation probes for a lost replica)
    assert restart.seconds_to_return is not None and 1.0 <= restart.seconds_to_return < 1.5
    assert [e.event for e in report.replica_events if e.replica == "s1"] == ["restart", "back"]
    assert not report.quarantined
    new = cl.standalone[1]
    assert cl.retired and cl.retired[0].replica_id == "s1" and new is not cl.retired[0]
    # The new replica is routed to only after it loaded the weights published before it came back.
    loaded = first(cl.log, "s1", "update_weights", "end", after=2.0)
    generated = first(cl.log, "s1", "generate", after=2.0)
    assert loaded is not None and generated is not None and loaded < generated
    assert new.weight_version == report.weight_version and new.completed  # it generated again
    assert cl.violations() == []
    # a checkpoint keeps the restarts (a resumed run carries them on)
    assert run.checkpoint()["replica_restarts"][0]["replica"] == "s1"


def test_dead_but_present_replica_fails_its_probes_then_is_recreated() -> None:
    cl = cluster()
    report, ledger, _ = run_with_death(cl, at_s=1.0, replica="s0", how="kill", probation_backoff_s=0.1, max_probes=2)
    ledger.assert_exactly_once()
    events = [e.event for e in report.replica_events if e.replica == "s0"]
    assert events == ["probation", "restart", "back"]
    [restart] = report.replica_restarts
    assert "2 health probes failed" in restart.cause and restart.seconds_to_return is not None
    assert cl.standalone[0].completed and not report.quarantined


def test_lost_hybrid_while_active_rejoins_routing_with_current_weights() -> None:
    cl = cluster(n_standalone=1, n_hybrid=1)
    source = RecordingSource(fake_prompts(n=2))
    run = build(cl, source, probation_backoff_s=0.1)
    dropped = run.queue.dropped_ids
    seen: dict[str, Any] = {}

    async def main() -> Any:
        async def killer() -> None:
            while not run.controller.active:  # the first activation
                await asyncio.sleep(0.01)
            seen["at"] = asyncio.get_running_loop().time()
            cl.hybrid[0].lose()
            while "h0" not in [r.replica_id for r in run.controller.active]:
                await asyncio.sleep(0.01)
            seen["state"] = run.controller.state.value
            update = run.controller.last_update
            assert update is not None
            seen["version"] = (cl.hybrid[0].weight_version, update.version)

        task = asyncio.create_task(killer())
        report = await run.run()
        task.cancel()
        return report

    report = run_virtual(main)
    ledger_of(run, source, cl.engine, dropped).assert_exactly_once()
    [restart] = report.replica_restarts
    assert restart.replica == "h0" and restart.seconds_to_return is not None
    assert seen["state"] in ("HYBRID_ACTIVE", "REBALANCING")
    assert seen["version"][0] == seen["version"][1]  # joined with the weights of the activation
    new = cl.hybrid[0]
    assert new is not cl.retired[0] and new.completed  # generated as a hybrid again
    loaded = first(cl.log, "h0", "update_weights", "end", after=seen["at"])
    generated = first(cl.log, "h0", "generate", after=seen["at"])
    assert loaded is not None and generated is not None and loaded < generated
    assert cl.violations() == []


def test_lost_hybrid_while_asleep_goes_back_to_sleep_in_its_slot() -> None:
    cl = cluster(n_standalone=2, n_hybrid=1)
    # static_fully_async never activates: the hybrid replica stays asleep the whole run
    source = RecordingSource(fake_prompts(n=2))
    run = FullyAsyncRun(
        RunSpec(
            config=CFG,
            policy=load_policy("static_fully_async"),
            standalone=cl.standalone,
            hybrid=cl.hybrid,
            train_engine=cl.engine,
            prompts=source,
            num_cycles=4,
            plugin_manager=get_plugin_manager(load_plugins=False),
            restart_replica=cl.restart,
            calibration_switches=0,
        )
    )

    async def main() -> Any:
        asyncio.get_running_loop().call_later(1.0, cl.hybrid[0].lose)
        # a lost hybrid that is asleep is noticed by the next operation on it: ask its health
        asyncio.get_running_loop().call_later(1.1, lambda: run.controller.suspend("h0", "health probe failed"))
        return await run.run()

    report = run_virtual(main)
    [restart] = report.replica_restarts
    assert restart.replica == "h0" and restart.seconds_to_return is not None
    new = cl.hybrid[0]
    assert new.sleeping and new is not cl.retired[0]  # asleep in its slot, not routable
    assert "h0" not in run.balancer.replica_ids and not report.quarantined
    assert "h0" not in run.controller.probation  # a candidate for the next activation again
    assert cl.violations() == []


def test_restart_budget_backs_off_then_quarantines() -> None:
    cl = cluster()
    attempts: list[float] = []

    async def failing(old: Replica) -> Replica:
        attempts.append(asyncio.get_running_loop().time())
        raise BackendError("no placement fits")

    report, ledger, _ = run_with_death(
        cl, at_s=1.0, replica="s1", restart_replica=failing, max_restarts=3, probation_backoff_s=0.5
    )
    ledger.assert_exactly_once()
    assert len(attempts) == 3
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(attempts)]
    assert gaps == [1.0, 2.0]  # waits of 0.5, 1, 2 s: doubling
    assert "restart budget (3) is spent" in report.quarantined["s1"]
    assert "no placement fits" in report.quarantined["s1"]
    [restart] = report.replica_restarts
    assert restart.seconds_to_return is None and restart.attempts == 3
    # given up: quarantined, never probed
    assert [e.event for e in report.replica_events if e.replica == "s1"] == ["restart", "quarantined"]


def test_without_a_restarter_a_lost_replica_is_quarantined() -> None:
    cl = cluster()
    report, ledger, _ = run_with_death(cl, at_s=1.0, replica="s1", restart_replica=None)
    ledger.assert_exactly_once()
    assert "the replica is lost" in report.quarantined["s1"] and not report.replica_restarts


def test_budget_counts_per_replica() -> None:
    t = [0.0]
    b = RestartBudget(max_restarts=2, backoff_s=1.0, max_backoff_s=3.0, now=lambda: t[0], cycle=lambda: 4)
    b.begin("a", "gone")
    assert [b.next_wait("a"), b.next_wait("a")] == [1.0, 2.0] and b.left("a") == 0 and b.left("b") == 2
    t[0] = 5.0
    assert b.returned("a", rebuild_s=2.5) == 5.0
    assert b.records[0].cycle == 4 and b.records[0].attempts == 2 and b.records[0].seconds_to_return == 5.0
    assert b.records[0].rebuild_s == 2.5


def test_trainer_dying_ends_the_run_with_a_report_and_a_checkpoint(tmp_path) -> None:
    cl = cluster()
    store = CheckpointStore(tmp_path / "checkpoints")
    source = RecordingSource(fake_prompts(n=2))
    run = build(cl, source, checkpoints=store, checkpoint_every=2)
    dropped = run.queue.dropped_ids

    async def main() -> Any:
        async def kill_trainer() -> None:
            while len(store.saved) < 2:
                await asyncio.sleep(0.05)
            cl.engine.fail_on["train_step"] = BackendError("actor 'trainer' is lost (ActorDiedError)")

        task = asyncio.create_task(kill_trainer())
        try:
            return await run.run()
        finally:
            task.cancel()

    with pytest.raises(RunAbortedError, match="actor 'trainer' is lost") as err:
        run_virtual(main)
    report = err.value.report
    assert isinstance(report, RunReport) and report.checkpoint is not None and 4 <= len(report.cycles) < 8
    ledger_of(run, source, cl.engine, dropped, checkpoint=report.checkpoint).assert_exactly_once()
    # the latest checkpoint on disk is whole and names the cycle it was written after
    latest = store.load()
    assert latest["global_steps"] == 4 and latest["trainer"] == "trainer"


def test_fake_replica_lose_sets_lost_reason() -> None:
    r = FakeReplica("x")
    assert r.lost_reason is None
    r.lose()
    assert r.dead and r.lost_reason == "its process was killed"


def test_a_restart_record_says_how_long_the_rebuild_took_and_the_run_line_shows_it() -> None:
    cl = cluster()

    async def slow_restart(old: Any) -> Any:
        await asyncio.sleep(3.0)  # an engine build that takes 3 s of loop time
        return await cl.restart(old)

    report, ledger, _ = run_with_death(cl, at_s=2.0, replica="s1", restart_replica=slow_restart)
    ledger.assert_exactly_once()
    [restart] = report.replica_restarts
    assert restart.rebuild_s == pytest.approx(3.0, abs=1e-6)
    # the rest of the time out is the 1 s backoff and the weight load, outside the rebuild
    assert restart.seconds_to_return is not None and 4.0 <= restart.seconds_to_return < 4.5
    line = restarts_line(report)
    assert line is not None and "s1 (cycle" in line and "rebuild 3.0 s, attempts 1" in line


def test_a_failed_attempt_counts_outside_the_rebuild_of_the_one_that_brought_it_back() -> None:
    cl = cluster()
    calls: list[float] = []

    async def flaky_restart(old: Any) -> Any:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) == 1:
            await asyncio.sleep(0.5)
            raise BackendError("the new engine did not start")
        await asyncio.sleep(1.0)
        return await cl.restart(old)

    report, ledger, _ = run_with_death(cl, at_s=2.0, replica="s1", restart_replica=flaky_restart)
    ledger.assert_exactly_once()
    [restart] = report.replica_restarts
    assert restart.attempts == 2 and restart.rebuild_s == pytest.approx(1.0, abs=1e-6)
    # backoffs of 1 s and 2 s, the failed 0.5 s attempt, the 1 s rebuild, then the weight load
    assert restart.seconds_to_return is not None and 4.5 <= restart.seconds_to_return < 5.0
