"""``cluster.shared_host``: replicas that share one host's compute (the tiny CPU example), in the
replica model, a simulated run, the lower bound and the fit."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest

from dynres.runtime.backends.fake import FakeReplica, FakeTrainEngine
from dynres.runtime.protocols import GenerationRequest
from dynres.runtime.sim import simulate
from dynres.runtime.sim.bound import BoundInputs, CycleWork, lower_bound
from dynres.runtime.sim.fit import fit_scenario
from dynres.runtime.sim.metrics_io import read_metrics
from dynres.runtime.sim.presets import preset_names
from dynres.runtime.sim.scenario import load_scenario
from dynres.runtime.sim.virtual_engines import SharedHost, SimReplica
from dynres.runtime.sim.virtual_time import run_virtual

TINY = Path(__file__).parent / "data" / "tiny-static"

# ---- The replica model -----------------------------------------------------------------------------


def _finish_times(tokens: list[int], capacity: float | None) -> list[float]:
    """Virtual time each of len(tokens) replicas (peak 100 tok/s, c_half 0) finishes one request."""

    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        reps = [SimReplica(f"r{i}", peak_tokens_per_s=100.0, c_half=0.0) for i in range(len(tokens))]
        if capacity is not None:
            host = SharedHost(capacity)
            for r in reps:
                host.attach(r)
        done: list[float] = [0.0] * len(reps)

        async def one(i: int) -> None:
            req = GenerationRequest(request_id=f"q{i}", sample_id=f"s{i}", prompt_token_ids=[1], max_tokens=tokens[i])
            await reps[i].generate(req)
            done[i] = loop.time()

        await asyncio.gather(*(one(i) for i in range(len(reps))))
        return done

    return run_virtual(main)


def test_a_third_replica_on_a_two_replica_host_adds_no_throughput() -> None:
    # Own GPUs: three replicas of 100 tok/s finish 100 tokens each in 1 s (300 tok/s).
    assert _finish_times([100, 100, 100], None) == pytest.approx([1.0, 1.0, 1.0])
    # One host of 200 tok/s: each gets 2/3 of its peak, 300 tokens take 1.5 s (200 tok/s).
    assert _finish_times([100, 100, 100], 200.0) == pytest.approx([1.5, 1.5, 1.5])
    # A replica alone on the host is never faster than its own peak.
    assert _finish_times([100], 200.0) == pytest.approx([1.0])


def test_replicas_left_on_the_host_speed_up_when_others_stop() -> None:
    # r2 needs 200 tokens and starts last, when the host is already shared: all at 200/3 tok/s
    # until r0 and r1 finish their 100 at 1.5 s, then r2 alone at its full 100 tok/s for its last
    # 100 tokens: done at 2.5 s (3.0 s if it kept the rate it started with).
    assert _finish_times([100, 100, 200], 200.0) == pytest.approx([1.5, 1.5, 2.5])


# ---- A simulated run -------------------------------------------------------------------------------


def _tiny(**overrides: object):
    return fit_scenario(read_metrics(TINY)).load(
        {"async_training.use_dynamic_resource_scheduling": True, "cluster.shared_host": False, **overrides}
    )


def test_on_a_shared_host_the_hybrid_replica_only_costs_its_switches() -> None:
    own = _tiny()
    shared = _tiny(**{"cluster.shared_host": True})
    static_own = simulate(own, policy="static_fully_async")
    static_shared = simulate(shared, policy="static_fully_async")
    # Without a woken hybrid the standalone replicas never exceed the host: the same run (up to
    # rounding: a shared host brings every replica up to date at each event, not only its own).
    assert static_shared.end_to_end_s == pytest.approx(static_own.end_to_end_s, rel=1e-9)
    default_own = simulate(own, policy="default")
    default_shared = simulate(shared, policy="default")
    assert default_own.switches > 0 and default_shared.switches > 0
    # With its own GPU the woken hybrid replica speeds the run up; on a shared host it adds no
    # throughput, so the switches make the run slower than never switching.
    assert default_own.end_to_end_s < static_own.end_to_end_s
    assert default_shared.end_to_end_s > static_shared.end_to_end_s
    for r in (default_shared, static_shared):
        assert r.end_to_end_s >= r.lower_bound_s
        assert r.ledger is not None and r.ledger.problems() == []


@pytest.mark.parametrize("preset", preset_names())
def test_presets_keep_every_replica_on_its_own_gpus(preset: str) -> None:
    assert load_scenario(preset).cluster.shared_host is False


def test_a_short_shared_host_run_of_a_preset_stays_above_the_tight_bound() -> None:
    r = simulate(
        "seed-dynamic-16-16",
        policy="fixed_ratio",
        overrides={"steps": 3, "cluster.shared_host": True},
    )
    assert r.switches > 0
    assert r.end_to_end_s >= r.lower_bound_s, r.bound.terms


# ---- The lower bound -------------------------------------------------------------------------------


def test_shared_host_bound_gives_the_hybrid_alternative_no_capacity() -> None:
    # 8 + 8 GPUs at 100 tok/s each, 2 cycles of 2 fit steps of 10 s, 800k units of work; export
    # 1 s + standalone load 2 s per sync, activation 5 s + deactivation 3 s.
    # Own GPUs (test_sim_bound): the hybrid alternative gives 684 + 13 = 697 s.
    # Shared host: with hybrids max(36 + 8, 800k / 800) = 1000 s, without 1000 + 4 paused:
    # 1000 + last fit 10 + sync 3 = 1013 s.
    base = dict(
        trainer_gpus=8,
        rollout_gpus=8,
        train_step_s=[10.0] * 4,
        sample_work=[100_000.0] * 8,
        sample_critical_work=[100.0] * 8,
        peak_tokens_per_gpu_s=100.0,
        lone_request_tokens_per_s=50.0,
        required_samples=2,
        cycles=[CycleWork([10.0, 10.0], [100_000.0] * 4, [100.0] * 4)] * 2,
        step_required_samples=4,
        max_required_samples=6,
        export_s=1.0,
        standalone_update_s=2.0,
        activate_s=5.0,
        deactivate_s=3.0,
        hybrid_gpus=8,
        hybrid_speed_factor=0.5,
    )
    own = lower_bound(BoundInputs(**base))  # type: ignore[arg-type]  # test inputs from a dict
    shared = lower_bound(BoundInputs(**base, shared_host=True))  # type: ignore[arg-type]  # same
    assert own.terms["whole_run"] == pytest.approx(697.0)
    assert shared.terms["whole_run"] == pytest.approx(1013.0)
    # Only hybrid replicas: they are the host, the shared host changes nothing.
    only = {**base, "rollout_gpus": 0, "standalone_update_s": 0.0}
    assert lower_bound(BoundInputs(**only, shared_host=True)).terms == lower_bound(BoundInputs(**only)).terms  # type: ignore[arg-type]  # same


# ---- The fit ---------------------------------------------------------------------------------------


def _config() -> dict:
    return json.loads((TINY / "config.json").read_text())


def _fit(config: dict | None = None, costs_from: dict | None = None):
    run = read_metrics(TINY)
    return fit_scenario(run, config=config, config_source="config.json", costs_from=costs_from)


def test_fit_sets_shared_host_for_vllm_and_torch_on_one_cpu_machine() -> None:
    fit = _fit()
    assert fit.load().cluster.shared_host is True
    note = fit.notes["cluster.shared_host"]
    assert note.startswith("[E]") and "engines.rollout=vllm" in note and "no GPU" in note
    assert "ray.address null" in note
    assert "shared_host: true" in fit.to_yaml() and "engines.rollout=vllm" in fit.to_yaml()
    assert "same cores" in fit.notes["workload.decode.hybrid_speed_factor"]
    assert not any("hybrid_speed_factor" in m for m in fit.missing)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda c: c["cluster"].update(slot={"GPU": 1.0, "CPU": 8.0}), "ray.slot="),
        (lambda c: c["cluster"].update(trainer_slot={"GPU": 1.0}), "ray.trainer_slot="),
        (lambda c: c["engines"]["trainer_options"].update(device="cuda"), "device=cuda"),
        (lambda c: c["engines"].update(rollout="fake"), "engines.rollout=fake"),
    ],
)
def test_fit_leaves_shared_host_off_for_gpu_or_fake_engines(change, needle: str) -> None:
    cfg = _config()
    change(cfg)
    fit = _fit(cfg)
    assert fit.load().cluster.shared_host is False
    assert needle in fit.notes["cluster.shared_host"]


def test_cpu_engines_on_a_remote_ray_cluster_are_not_assumed_to_share_a_host() -> None:
    cfg = _config()
    cfg["cluster"]["address"] = "10.0.0.1:6379"
    fit = _fit(cfg)
    assert fit.load().cluster.shared_host is False
    assert "DEFAULT" in fit.notes["cluster.shared_host"]
    assert any("cluster.shared_host" in m for m in fit.missing)


def _cycle_with_hybrid(work_scale: float) -> dict:
    """A --costs-from cycle where the hybrid generated for half the cycle, with ``work_scale`` of the
    work two standalone replicas of the tiny fit would have generated alone."""
    sc = _fit().load()
    c = sc.async_training.concurrent_samples_per_replica * sc.responses_per_sample
    tput = sc.workload.decode.peak_tokens_per_s * c / (c + sc.workload.decode.c_half)
    per_sample = sc.responses_per_sample * (32.0 + 0.1 * sc.workload.prompt_tokens)
    return {
        "duration_s": 2.0,
        "weight_sync_s": 0.0,
        "metrics": {"dynamic_resource/rollout_resource_utilization": 1.0},
        "batch": {"response_tokens_mean": 32.0},
        "samples_generated": work_scale * tput * 2.0 * 2 / per_sample,
        "wait_for_enough_samples_s": 1.0,
        "hybrid_active_at_start": True,
    }


def test_a_negative_solved_hybrid_factor_is_evidence_of_a_shared_host() -> None:
    cfg = _config()
    del cfg["engines"]  # the config says nothing about the device
    slower = {"cycles": [_cycle_with_hybrid(0.8), _cycle_with_hybrid(0.7)]}
    fit = _fit(cfg, costs_from=slower)
    assert fit.load().cluster.shared_host is True
    note = fit.notes["cluster.shared_host"]
    assert note.startswith("[D]") and "<= 0" in note
    # A hybrid that did add throughput is no such evidence.
    faster = {"cycles": [_cycle_with_hybrid(1.1), _cycle_with_hybrid(1.2)]}  # f = 0.6
    fit = _fit(copy.deepcopy(cfg), costs_from=faster)
    assert fit.load().cluster.shared_host is False
    assert fit.load().workload.decode.hybrid_speed_factor > 0.3


def test_verl_runs_are_fitted_without_a_shared_host() -> None:
    data = Path(__file__).parent / "data"
    fit = fit_scenario(read_metrics(data / "verl-fully-async-metrics.jsonl"))
    assert fit.load().cluster.shared_host is False
    assert "GPUs" in fit.notes["cluster.shared_host"]


# ---- A real run tells its policy ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("example", "overrides", "shared"),
    [
        ("tiny-grpo-cpu.yaml", {}, True),
        ("tiny-grpo-cpu.yaml", {"ray.slot": {"GPU": 1.0, "CPU": 2.0}}, False),
        ("fake-minimal.yaml", {}, False),
    ],
)
def test_a_real_runs_policy_is_told_whether_its_engines_share_one_host(example, overrides, shared: bool) -> None:
    from dynres.runtime.realrun.builders import build_spec
    from dynres.runtime.realrun.config import load_run_config

    examples = Path(__file__).parents[3] / "examples"
    cfg = load_run_config(examples / example, overrides)
    spec = build_spec(
        standalone=[FakeReplica("standalone-0", "standalone")],
        hybrid=[FakeReplica("hybrid-0", "hybrid")],
        train_engine=FakeTrainEngine(),
        progress=None,
        config=cfg.model_dump(),
    )
    assert spec.shared_host is shared
