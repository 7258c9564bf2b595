"""The fake backends themselves: injected generate faults, no livelock on the virtual clock, checked options."""

from __future__ import annotations

import asyncio

import pytest

from dynres.core.errors import BackendError, ConfigError
from dynres.runtime.backends.fake import FakeCluster, FakeReplica, FakeTrainEngine
from dynres.runtime.protocols import GenerationRequest
from dynres.runtime.sim.virtual_time import run_virtual


def _req(rid: str = "r0", tokens: int = 72) -> GenerationRequest:
    return GenerationRequest(
        request_id=rid, sample_id=rid, prompt_token_ids=range(4), max_tokens=1024, extra={"response_tokens": tokens}
    )


def test_fail_on_generate_raises_the_injected_error() -> None:
    r = FakeReplica("s0", fail_on={"generate": RuntimeError})
    with pytest.raises(RuntimeError, match="injected failure of generate on s0"):
        asyncio.run(r.generate(_req()))
    r.fail_on.clear()
    assert len(asyncio.run(r.generate(_req())).token_ids) == 72


def test_hang_on_generate_never_returns_until_cancelled() -> None:
    r = FakeReplica("s0", hang_on={"generate"})

    async def main() -> None:
        await asyncio.wait_for(r.generate(_req()), 0.05)

    with pytest.raises(TimeoutError):
        asyncio.run(main())
    assert r.ops("generate", "error")[0].detail == "cancelled while hanging"


def test_pause_resume_wakeups_do_not_stall_a_request_on_a_virtual_clock() -> None:
    # Before the fix: each early wake-up rounded the partial token down, so a request that was
    # woken every few ms by old timers never reached its last token (71/72 after 2,000 s).
    r = FakeReplica("s0", tokens_per_s=100)

    async def main() -> int:
        task = asyncio.ensure_future(r.generate(_req(tokens=72)))
        for _ in range(200):
            await asyncio.sleep(0.0037)
            await r.pause()
            await r.resume()
        res = await asyncio.wait_for(task, 60)
        return len(res.token_ids)

    assert run_virtual(main, idle_timeout_s=2.0) == 72


def test_issue_cluster_finishes_on_a_virtual_clock() -> None:
    from dynres.core import get_plugin_manager, load_config, load_policy
    from dynres.runtime.backends.fake import fake_prompts
    from dynres.runtime.loop.driver import RunSpec, run_fully_async

    cl = FakeCluster(2, 2, tokens_per_s=100, latency=0.005, phase_times={"update_actor": 0.2})
    cfg = load_config(
        {
            "async_training": {
                "use_dynamic_resource_scheduling": True,
                "concurrent_samples_per_replica": 2,
                "trigger_parameter_sync_step": 1,
            },
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 3}, "rollout": {"n": 2}},
            "rollout": {"nnodes": 1, "n_gpus_per_node": 2},
            "trainer": {"nnodes": 1, "n_gpus_per_node": 2},
        }
    )
    spec = RunSpec(
        config=cfg,
        policy=load_policy("default"),
        standalone=cl.standalone,
        hybrid=cl.hybrid,
        train_engine=cl.engine,
        prompts=fake_prompts(n=2),
        num_cycles=4,
        plugin_manager=get_plugin_manager(load_plugins=False),
    )

    async def main():
        return await asyncio.wait_for(run_fully_async(spec), 600)

    report = run_virtual(main, idle_timeout_s=5.0)
    assert len(report.cycles) == 4 and report.end_to_end_s < 60
    trained = [s.sample_id for b in cl.engine.batches for s in b]
    assert len(trained) == len(set(trained)) == 12


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tokens_per_s": 0}, "tokens_per_s must be > 0"),
        ({"tokens_per_s": -5}, "tokens_per_s must be > 0"),
        ({"tokens_per_s": float("inf")}, "tokens_per_s must be > 0"),
        ({"fail_on": {"generate": "NoSuchError"}}, "names no exception 'NoSuchError'"),
        ({"fail_on": {"generate": 5}}, "give an exception class or instance"),
        ({"fail_on": {"genrate": RuntimeError}}, "unknown op"),
        ({"hang_on": {"sleeep"}}, "unknown op"),
        ({"latency": -1.0}, "finite seconds >= 0"),
        ({"latency": {"nope": 1.0}}, "unknown op"),
    ],
)
def test_bad_fake_options_are_config_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        FakeReplica("s0", **kwargs)


def test_fail_on_from_yaml_names_an_exception() -> None:
    r = FakeReplica("s0", fail_on={"generate": "RuntimeError", "sleep": "BackendError"})
    assert r.fail_on == {"generate": RuntimeError, "sleep": BackendError}


def test_bad_train_engine_faults_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown op"):
        FakeTrainEngine(fail_on={"generate": RuntimeError})


def test_batch_aborts_bigger_than_the_shared_take_out_budget_lose_and_double_nothing() -> None:
    async def main() -> None:
        reps = [FakeReplica(f"s{i}", tokens_per_s=1000, response_tokens=10_000) for i in range(3)]
        for r in reps:
            for k in range(3000):
                r.submit(_req(f"{r.replica_id}-{k}", 10_000))
        await asyncio.sleep(0.01)  # 10 tokens each
        # 1,500 ids per replica (4,500 together, over two iterations' budget) and one unknown id.
        picked = {r.replica_id: [f"{r.replica_id}-{k}" for k in range(0, 3000, 2)] + ["nope"] for r in reps}
        outs = await asyncio.gather(*(r.abort_batch(picked[r.replica_id]) for r in reps))
        for r, out in zip(reps, outs, strict=True):
            results = [out[i] for i in range(len(out))]
            assert [res.request_id for res in results] == picked[r.replica_id][:-1]
            assert all(res.finish_reason == "abort" and list(res.token_ids) == list(range(10)) for res in results)
            assert sorted(r.in_flight_ids) == sorted(f"{r.replica_id}-{k}" for k in range(1, 3000, 2))

    run_virtual(main, idle_timeout_s=5.0)


def test_generated_tokens_counts_only_what_the_replica_itself_produced() -> None:
    # A request resumed with 30 tokens of partial output, aborted after ~20 more here, then a
    # fresh one run to its end (72): the counter holds the 20 + 72 new tokens, not the 30 carried.
    r = FakeReplica("h0", tokens_per_s=100)
    resumed = _req("r1").resumed(range(30), [0.0] * 30)

    async def main() -> tuple[int, int]:
        task = asyncio.ensure_future(r.generate(resumed))
        await asyncio.sleep(0.2)
        await r.abort()
        partial = await task
        await r.generate(_req("r2"))
        return len(partial.token_ids) - 30, r.generated_tokens

    new, counted = run_virtual(main, idle_timeout_s=2.0)
    assert 15 <= new <= 25
    assert counted == new + 72


def test_generated_tokens_counts_a_batch_abort() -> None:
    r = FakeReplica("h0", tokens_per_s=100)

    async def main() -> tuple[int, int]:
        fut = r.submit(_req("r1").resumed(range(10), [0.0] * 10))
        await asyncio.sleep(0.3)
        results = await r.abort_batch()
        fut.cancel()
        return sum(len(x.token_ids) - 10 for x in results), r.generated_tokens

    new, counted = run_virtual(main, idle_timeout_s=2.0)
    assert new > 0 and counted == new
