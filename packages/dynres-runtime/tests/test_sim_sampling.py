"""The workload space and its sampler (``dynres scenario sample``): seeded, valid, physically coherent."""

from __future__ import annotations

import argparse
import random
import re

import pytest
from bench_module import load_bench
from click.testing import CliRunner

from dynres.core.errors import ConfigError
from dynres.runtime.cli import main
from dynres.runtime.sim.sampling import GPUS, draw_scenario, sample_scenarios, write_samples
from dynres.runtime.sim.scenario import load_scenario


def test_the_same_seed_writes_the_same_files_and_another_seed_others(tmp_path):
    a = write_samples(5, 12, tmp_path / "a")
    b = write_samples(5, 12, tmp_path / "b")
    c = write_samples(6, 12, tmp_path / "c")
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert [p.read_bytes() for p in a] != [p.read_bytes() for p in c]
    assert [p.name for p in a] == [f"sample-5-{i:03d}.yaml" for i in range(12)]


def test_five_hundred_draws_are_valid_and_cover_the_documented_space():
    drawn = list(sample_scenarios(11, 500))
    scenarios = [s for s, _ in drawn]
    assert {d.model for _, d in drawn} == {"dense", "moe"}
    assert {d.gpu for _, d in drawn} == set(GPUS)
    totals = [d.total_b for _, d in drawn]
    assert min(totals) < 3 and max(totals) > 300  # 1.5B .. several hundred B
    tps = {s["cluster"]["gpus_per_replica"] for s in scenarios}
    assert tps == {1, 2, 4, 8, 16}
    gpus = [s["cluster"]["trainer_gpus"] + s["cluster"]["rollout_gpus"] for s in scenarios]
    assert min(gpus) <= 16 and 200 <= max(gpus) <= 512
    at = [s["async_training"] for s in scenarios]
    assert {a["staleness_threshold"] for a in at} == {0.0, 0.1, 0.3, 0.5, 1.0, 2.0}
    assert {a["trigger_parameter_sync_step"] for a in at} == set(range(1, 9))
    assert {a["partial_rollout"] for a in at} == {True, False}
    assert any(s["cluster"]["rollout_gpus"] == 0 for s in scenarios)  # only-hybrid
    assert any(s["cluster"]["shared_host"] for s in scenarios)
    hybrid = [s["workload"]["decode"]["hybrid_speed_factor"] for s in scenarios]
    assert min(hybrid) <= 0.1 and max(hybrid) >= 0.95
    medians = [s["workload"]["response"]["median_tokens"] for s in scenarios]
    assert min(medians) < 400 and max(medians) > 6000


def test_a_larger_model_is_slower_everywhere_on_the_same_machine():
    # Coherence: draw with one seed, then compare draws whose only cause of difference is size.
    def costs(total_b: float, active_b: float) -> dict:
        rng = random.Random(3)
        import dynres.runtime.sim.sampling as sampling

        real = sampling._draw_model
        sampling._draw_model = lambda rng: ("moe", total_b, active_b)  # the signature of the function it stands in for
        try:
            sc, draw = draw_scenario(rng, "x")
        finally:
            sampling._draw_model = real
        # The real replica's speed: the simulated one decodes for `scale` real samples at 1/scale.
        sc["real_peak_per_gpu"] = sc["workload"]["decode"]["peak_tokens_per_s"] * draw.scale
        sc["real_peak_per_gpu"] /= sc["cluster"]["gpus_per_replica"]
        return sc

    small, large = costs(40.0, 4.0), costs(80.0, 8.0)
    assert small["cluster"]["gpus_per_replica"] <= large["cluster"]["gpus_per_replica"]
    assert large["real_peak_per_gpu"] < small["real_peak_per_gpu"]  # twice the active bytes per token
    assert large["costs"]["weight_sync_s"] == pytest.approx(
        2 * small["costs"]["weight_sync_s"], abs=2e-3
    )  # rounded to ms
    assert large["costs"]["trainer_offload_s"] > small["costs"]["trainer_offload_s"]


def test_every_drawn_file_loads_and_a_small_one_simulates(tmp_path):
    from dynres.runtime.sim import simulate

    paths = write_samples(2, 8, tmp_path)
    loaded = [load_scenario(str(p)) for p in paths]
    assert all(sc.steps == 20 and sc.async_training.use_dynamic_resource_scheduling for sc in loaded)
    smallest = min(loaded, key=lambda sc: sc.step_required_samples * sc.responses_per_sample)
    r = simulate(smallest.model_copy(update={"steps": 3}), policy="default")
    assert r.end_to_end_s >= r.lower_bound_s > 0


def test_bad_counts_and_seeds_are_one_line_errors_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match="--count must be >= 1"):
        list(sample_scenarios(1, 0))
    with pytest.raises(ConfigError, match="--seed must be >= 0"):
        list(sample_scenarios(-1, 3))
    out = tmp_path / "none"
    res = CliRunner().invoke(main, ["scenario", "sample", "--seed", "-2", "--count", "3", "--out", str(out)])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "--seed must be >= 0" in res.output
    assert not out.exists()
    res = CliRunner().invoke(main, ["scenario", "sample", "--seed", "4", "--count", "3", "--out", str(out)])
    assert res.exit_code == 0 and "wrote 3 scenarios" in res.output
    assert sorted(p.name for p in out.iterdir()) == ["sample-4-000.yaml", "sample-4-001.yaml", "sample-4-002.yaml"]


def test_a_longer_run_of_a_draw_keeps_its_workloads(tmp_path):
    short = list(sample_scenarios(7, 5))
    long = list(sample_scenarios(7, 5, steps=60))
    for (a, drawn_a), (b, drawn_b) in zip(short, long, strict=True):
        assert (a["steps"], b["steps"]) == (20, 60)
        assert {**a, "steps": 0} == {**b, "steps": 0}  # the same model, cluster, workload and costs
        assert drawn_a == drawn_b
    out = tmp_path / "long"
    res = CliRunner().invoke(
        main, ["scenario", "sample", "--seed", "7", "--count", "2", "--steps", "60", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    first = out / "sample-7-000.yaml"
    assert first.read_text().startswith("# Drawn by `dynres scenario sample --seed 7 --steps 60` ")
    assert load_scenario(str(first)).steps == 60


def test_a_run_length_below_one_cycle_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match="--steps must be >= 1 sync cycles, got 0"):
        list(sample_scenarios(7, 5, steps=0))
    out = tmp_path / "none"
    res = CliRunner().invoke(
        main, ["scenario", "sample", "--seed", "7", "--count", "2", "--steps", "0", "--out", str(out)]
    )
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "--steps must be >= 1" in res.output
    assert not out.exists()


def test_the_benches_run_a_draw_at_the_run_length_asked_for(capsys):
    bench = load_bench("policy_bench.py")
    ap = argparse.ArgumentParser()
    bench.add_scenario_args(ap)
    args = ap.parse_args(["--sample", "3", "--sample-seed", "1", "--sample-steps", "60"])
    bench.check_scenario_args(args, ap)
    drawn = bench.chosen_scenarios(args)
    assert [sc["steps"] for sc in drawn] == [60, 60, 60]
    assert [sc["name"] for sc in drawn] == ["sample-1-000", "sample-1-001", "sample-1-002"]
    for bad, says in (
        (["--sample-steps", "60"], "give --sample N"),
        (["--sample", "3", "--sample-seed", "1", "--sample-steps", "0"], ">= 1"),
    ):
        with pytest.raises(SystemExit):
            bench.main(["--policies", "default", *bad])
        assert says in capsys.readouterr().err


def test_the_policy_bench_ends_with_the_summary_line():
    bench = load_bench("policy_bench.py")
    rows = [
        {"scenario": sc, "policy": pol, "seed": 0, "end_to_end_s": t, "lower_bound_s": 1.0, "switches": 0}
        for sc, times in (("a", (10.0, 12.0, 9.5)), ("b", (10.0, 9.0, 9.2)))
        for pol, t in zip(("default", "static_fully_async", "predictive"), times, strict=True)
    ]
    for r in rows:
        r["lower_bound_naive_s"] = 1.0
    policies = ["default", "static_fully_async", "predictive"]
    line = bench.summary_line(bench.summarise(rows, policies), policies)
    m = re.fullmatch(
        r"geomean_vs_default=([\d.]+) hindsight_geomean_vs_default=([\d.]+) worst_regret_pct=(-?[\d.]+) "
        r"over_1pct=(\d+) scenarios=(\d+)",
        line,
    )
    assert m, line
    geo, best, worst, over, n = m.groups()
    assert float(geo) == pytest.approx(((9.5 / 10) * (9.2 / 10)) ** 0.5, abs=1e-4)
    assert float(best) == pytest.approx(((9.5 / 10) * (9.0 / 10)) ** 0.5, abs=1e-4)  # static won b
    assert float(worst) == pytest.approx((9.2 / 9.0 - 1) * 100, abs=1e-3)
    assert (int(over), int(n)) == (1, 2)


def test_the_summary_line_judges_the_entry_named_by_judge():
    bench = load_bench("policy_bench.py")
    policies = ["default", "static_fully_async", "predictive", "predictive[extra_admission=0.5]"]
    rows = [
        {"scenario": "a", "policy": pol, "seed": 0, "end_to_end_s": t, "lower_bound_s": 1.0, "switches": 0}
        | {"lower_bound_naive_s": 1.0}
        for pol, t in zip(policies, (10.0, 12.0, 9.5, 8.0), strict=True)
    ]
    summary = bench.summarise(rows, policies)
    assert bench.summary_line(summary, policies).startswith("geomean_vs_default=0.9500 ")
    assert bench.summary_line(summary, policies, policies[-1]).startswith("geomean_vs_default=0.8000 ")
    with pytest.raises(SystemExit):
        bench.main(["--policies", "default,predictive", "--judge", "fixed_ratio"])
