"""The workload model's formulas, checked against hand computations."""

from __future__ import annotations

import asyncio
import itertools
import math

import numpy as np
import pytest

from dynres.runtime.protocols import GenerationRequest, ReplicaKind
from dynres.runtime.samples import Repeat
from dynres.runtime.sim.scenario import DecodeConfig, ResponseLengthConfig, TrainConfig
from dynres.runtime.sim.virtual_engines import RESPONSE_TOKENS_KEY, SimReplica, SimReplicaCosts, SimTrainEngine
from dynres.runtime.sim.virtual_time import run_virtual
from dynres.runtime.sim.workload import (
    LengthOracle,
    aggregate_throughput,
    capped_lognormal_mean,
    median_at_step,
    per_request_rate,
    request_work,
    train_step_seconds,
)


def test_throughput_saturates_and_lone_request_is_a_tenth() -> None:
    cfg = DecodeConfig(peak_tokens_per_s=1000.0, lone_request_fraction=0.1)
    assert cfg.c_half == pytest.approx(9.0)
    assert aggregate_throughput(1, 1000.0, cfg.c_half) == pytest.approx(100.0)
    assert aggregate_throughput(9, 1000.0, cfg.c_half) == pytest.approx(500.0)
    assert aggregate_throughput(10**6, 1000.0, cfg.c_half) == pytest.approx(1000.0, rel=1e-4)
    assert per_request_rate(11, 1000.0, 9.0) == pytest.approx(50.0)
    assert aggregate_throughput(0, 1000.0, 9.0) == 0.0
    rates = [per_request_rate(c, 1000.0, 9.0) for c in range(1, 300)]
    assert all(a > b for a, b in itertools.pairwise(rates))  # each request slows as concurrency rises


def test_capped_lognormal_mean_matches_monte_carlo() -> None:
    rng = np.random.default_rng(1)
    x = np.minimum(np.exp(math.log(440) + 1.07 * rng.standard_normal(400_000)), 4096)
    assert capped_lognormal_mean(440, 1.07, 4096) == pytest.approx(float(x.mean()), rel=0.01)
    assert capped_lognormal_mean(440, 0.0, 4096) == 440
    assert capped_lognormal_mean(440, 1.07, 1e12) == pytest.approx(440 * math.exp(1.07**2 / 2))


def test_lengths_lognormal_capped_correlated_and_growing() -> None:
    cfg = ResponseLengthConfig(
        median_tokens=500, sigma=1.0, max_tokens=8000, group_correlation=0.6, growth_per_step=0.01
    )
    oracle = LengthOracle(cfg, n=8, step_required_samples=100, seed=3)
    first = np.array([oracle.sample(i) for i in range(2000)], dtype=float)  # steps 0..19
    assert first.max() <= 8000 and first.min() >= 1
    # Median of step 0 near 500, of step 19 near 500 * 1.01**19.
    assert np.median(first[:100]) == pytest.approx(500, rel=0.25)
    later = np.array([oracle.sample(i) for i in range(10_000, 12_000)], dtype=float)  # steps 100..119
    assert np.median(later) == pytest.approx(median_at_step(500, 0.01, 110), rel=0.25)
    assert np.median(later) > 2 * np.median(first)
    # Within-group correlation of log-lengths ~ rho.
    logs = np.log(first)
    a, b = logs[:, 0], logs[:, 1]
    assert np.corrcoef(a, b)[0, 1] == pytest.approx(0.6, abs=0.08)
    # Same (seed, index) -> same lengths, in any order; another seed differs.
    again = LengthOracle(cfg, n=8, step_required_samples=100, seed=3)
    assert again.sample(1999) == oracle.sample(1999)
    assert LengthOracle(cfg, n=8, step_required_samples=100, seed=4).sample(5) != oracle.sample(5)


def test_a_prompt_pool_gives_each_prompt_its_length_scale_in_every_epoch() -> None:
    base = dict(median_tokens=500, sigma=1.0, max_tokens=8000, growth_per_step=0.0)
    # Fully group-correlated lengths: a sample's responses all have its prompt's length.
    pooled = LengthOracle(
        ResponseLengthConfig(**base, group_correlation=1.0, prompt_pool=50), n=4, step_required_samples=100, seed=3
    )
    assert [pooled.sample(i) for i in range(50)] == [pooled.sample(i + 150) for i in range(50)]
    assert len({pooled.sample(i) for i in range(50)}) > 40  # the prompts still differ from each other
    assert (pooled.prompt_id(0), pooled.prompt_id(57)) == ("p0", "p7")
    # Without a pool every sample is a new prompt, with lengths exactly as before the pool existed.
    fresh = LengthOracle(ResponseLengthConfig(**base, group_correlation=1.0), n=4, step_required_samples=100, seed=3)
    assert fresh.prompt_id(0) is None and fresh.sample(0) != fresh.sample(50)
    # The per-response draws are the pool-free run's: at correlation 0 the pool changes nothing.
    independent = {"group_correlation": 0.0}
    a = LengthOracle(
        ResponseLengthConfig(**base, **independent, prompt_pool=50), n=4, step_required_samples=100, seed=3
    )
    b = LengthOracle(ResponseLengthConfig(**base, **independent), n=4, step_required_samples=100, seed=3)
    assert [a.sample(i) for i in range(600)] == [b.sample(i) for i in range(600)]


def test_median_growth_formula() -> None:
    assert median_at_step(1000, 0.1, 0) == 1000
    assert median_at_step(1000, 0.1, 2) == pytest.approx(1210)


def test_request_work_includes_reprefill_of_partial_output() -> None:
    assert request_work(100, 0, 1000, 0.1) == pytest.approx(10 + 1000)
    # Resumed after 600 tokens: re-prefill prompt + 600, decode the other 400.
    assert request_work(100, 600, 1000, 0.1) == pytest.approx(0.1 * 700 + 400)


def test_train_time_scales_with_tokens_and_gpus() -> None:
    cfg = TrainConfig(step_s=100.0, reference_gpus=16, scaling_exponent=1.0, token_fraction=0.5)
    assert train_step_seconds(1000, 1000, cfg, 16) == pytest.approx(100.0)
    assert train_step_seconds(1000, 1000, cfg, 8) == pytest.approx(200.0)
    assert train_step_seconds(2000, 1000, cfg, 16) == pytest.approx(150.0)  # half fixed, half per token
    sub = TrainConfig(step_s=100.0, reference_gpus=16, scaling_exponent=0.5)
    assert train_step_seconds(1000, 1000, sub, 64) == pytest.approx(50.0)


def _req(i: int, length: int, prefix: int = 0, prompt: int = 0) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"s{i}/0",
        sample_id=f"s{i}",
        prompt_token_ids=range(prompt),
        max_tokens=10**6,
        partial_token_ids=range(prefix),
        extra={RESPONSE_TOKENS_KEY: length},
    )


def test_replica_processor_sharing_matches_formula() -> None:
    async def main() -> tuple[float, float, float]:
        loop = asyncio.get_running_loop()
        r = SimReplica("r", peak_tokens_per_s=1000.0, c_half=9.0)
        await r.generate(_req(0, 1000))
        lone = loop.time()  # 1000 tokens at 100 tok/s
        t0 = loop.time()
        await asyncio.gather(r.generate(_req(1, 1000)), r.generate(_req(2, 2000)))
        # both at 1000/11 tok/s until the first is done (11 s), then the second alone at 100 tok/s
        pair = loop.time() - t0
        return lone, pair, r.work_done

    lone, pair, work = run_virtual(main())
    assert lone == pytest.approx(10.0)
    assert pair == pytest.approx(11.0 + 1000 / 100)
    assert work == pytest.approx(4000.0)


def test_replica_abort_keeps_partial_output_and_resume_reprefills() -> None:
    async def main() -> tuple[str, int, float, int]:
        loop = asyncio.get_running_loop()
        r = SimReplica("r", peak_tokens_per_s=1000.0, c_half=9.0, prefill_cost=0.5, costs=SimReplicaCosts(abort_s=1.0))
        task = asyncio.create_task(r.generate(_req(0, 1000, prompt=100)))
        await asyncio.sleep(5.5)  # 50 units of prefill, then 500 tokens at 100 tok/s
        await r.abort()
        first = await task
        t0 = loop.time()
        resumed = await r.generate(_req(0, 1000, prefix=len(first.token_ids), prompt=100))
        return first.finish_reason, len(first.token_ids), loop.time() - t0, len(resumed.token_ids)

    reason, partial, took, total = run_virtual(main())
    assert reason == "abort" and partial == 500
    # Re-prefill of prompt + 500 tokens (0.5 * 600 = 300 units) + 500 tokens, at 100 units/s.
    assert took == pytest.approx(8.0)
    assert total == 1000


def test_replica_pause_freezes_progress_and_sleep_refuses_work() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        r = SimReplica("r", ReplicaKind.HYBRID, peak_tokens_per_s=100.0, c_half=0.0)
        task = asyncio.create_task(r.generate(_req(0, 100)))
        await asyncio.sleep(0.5)
        await r.pause()
        await asyncio.sleep(10)
        await r.resume()
        await task
        await r.sleep()
        from dynres.core.errors import ReplicaUnavailableError

        with pytest.raises(ReplicaUnavailableError):
            await r.generate(_req(1, 10))
        await r.wake_up()
        await r.generate(_req(1, 10))
        return loop.time()

    assert run_virtual(main()) == pytest.approx(11.0 + 0.1)


def test_train_engine_takes_modelled_time_and_refuses_training_while_offloaded() -> None:
    async def main() -> tuple[float, dict[str, float], int]:
        loop = asyncio.get_running_loop()
        eng = SimTrainEngine(
            step_seconds=lambda tokens: tokens / 100.0, phase_fractions={"update_actor": 0.75, "ref": 0.25}
        )
        res = await eng.train_step([1000.0, 1000.0])
        await eng.offload()
        from dynres.core.errors import BackendError

        with pytest.raises(BackendError, match="offloaded"):
            await eng.train_step([1.0])
        await eng.onload()
        update = await eng.export_weights()
        return loop.time(), dict(res.phase_times), update.version

    t, phases, version = run_virtual(main())
    assert t == pytest.approx(20.0)
    assert phases == pytest.approx({"update_actor": 15.0, "ref": 5.0})
    assert version == 1


def test_repeat_sequence() -> None:
    r = Repeat(5, 0.0)
    assert len(r) == 5 and list(r) == [0.0] * 5 and r[1:3] == Repeat(2) and r == [0.0] * 5
    with pytest.raises(IndexError):
        r[5]
