"""``dynres scenario fit/compare``: scenarios fitted from dynres and verl metrics, predictions, bad input.

Fixtures in ``tests/data``:

* ``verl-fully-async-metrics.jsonl`` (+ ``verl-fully-async-config.yaml``): synthetic, in verl's
  file-logger format with verl's key names, made from known numbers: 8 + 8 GPUs, n=16, 128
  samples per cycle (required 32 x trigger 4), 4 samples per replica in flight (64 requests),
  2000 tokens/s per replica at that concurrency, mean response 2000 tokens growing 1% a cycle,
  prompts of 256 tokens, 30 s of compute per fit step at step 0 (scaled by tokens), 2.5 s weight
  sync on average, phases 94/4/1/1 % (update_actor/old_log_prob/reward/adv).
* ``tiny-static/``: a real ``dynres run examples/tiny-grpo-cpu.yaml`` under static_fully_async
  (its metrics.jsonl, config.json and report.json as the run wrote them, switch calibration included;
  an older dynres wrote them, so they carry the old key names: cluster, startup_probe).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dynres.core.errors import MetricsError
from dynres.runtime.cli import main
from dynres.runtime.loop.report import batch_stats
from dynres.runtime.protocols import GenerationResult
from dynres.runtime.samples import PromptGroup, Sample
from dynres.runtime.sim.fit import fit_scenario, predict
from dynres.runtime.sim.metrics_io import read_metrics
from dynres.runtime.sim.scenario import load_scenario
from dynres.runtime.sim.workload import DecodeConfig

DATA = Path(__file__).parent / "data"
VERL = DATA / "verl-fully-async-metrics.jsonl"
VERL_CFG = DATA / "verl-fully-async-config.yaml"
TINY = DATA / "tiny-static"


def _cli(*args: str):
    return CliRunner().invoke(main, list(args))


def _one_error_line(result, *needles: str) -> str:
    assert result.exit_code == 2, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("dynres: error: "), result.output
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert "Traceback" not in result.output
    return lines[0]


# ---- verl format -----------------------------------------------------------------------------------


def test_verl_lines_of_one_step_merge_and_validation_lines_are_not_cycles():
    run = read_metrics(VERL)
    assert run.format == "verl"
    assert [c["step"] for c in run.cycles] == list(range(1, 11))
    # The rollouter's line and the trainer's aggregated line of a step are one cycle.
    assert all("fully_async/rollouter/active_time" in c and "timing_s/step" in c for c in run.cycles)
    assert run.skipped_lines == [1]  # step 0: validation only


def test_verl_fixture_fits_the_numbers_it_was_made_from():
    run = read_metrics(VERL)
    cfg = yaml.safe_load(VERL_CFG.read_text())
    fit = fit_scenario(run, config=cfg, config_source=str(VERL_CFG))
    sc = fit.load()
    c = sc.async_training.concurrent_samples_per_replica * sc.responses_per_sample
    assert c == 64
    # 2000 tokens/s per replica at 64 requests, so tput(64) of the fitted peak must be 2000.
    d = sc.workload.decode
    assert d.peak_tokens_per_s * c / (c + d.c_half) == pytest.approx(2000, rel=1e-3)
    assert sc.workload.train.step_s == pytest.approx(30.0, rel=0.01)
    assert sc.costs.weight_sync_s == pytest.approx(2.5, rel=1e-3)
    assert sc.workload.train.phase_fractions == pytest.approx(
        {"update_actor": 0.94, "old_log_prob": 0.04, "reward": 0.01, "adv": 0.01}, abs=2e-3
    )
    assert sc.workload.prompt_tokens == 256 and sc.workload.response.max_tokens == 8192
    # The mean grows 1%/cycle; the median under a capped lognormal grows a little faster.
    assert 0.009 < sc.workload.response.growth_per_step < 0.015
    assert (sc.cluster.trainer_gpus, sc.cluster.rollout_gpus, sc.steps) == (8, 8, 10)
    assert fit.measured_end_to_end_s == pytest.approx(sum(c["timing_s/step"] for c in run.cycles))
    # What verl does not log is named with the default used.
    missing = "\n".join(fit.missing)
    assert "workload.response.sigma = 1.07" in missing and "costs.sleep_s = 3" in missing


def test_verl_without_config_names_what_it_could_not_know_and_derives_the_rest():
    fit = fit_scenario(read_metrics(VERL))
    sc = fit.load()
    assert sc.required_samples == 32 and sc.async_training.trigger_parameter_sync_step == 4
    assert sc.async_training.staleness_threshold == 0.5
    assert sc.policy_name == "static_fully_async"  # no wait_for_enough_samples: no dynamic scheduling
    missing = "\n".join(fit.missing)
    for key in ("actor_rollout_ref.rollout.n", "cluster.trainer_gpus", "concurrent_samples_per_replica"):
        assert key in missing


def test_fitted_yaml_loads_in_the_simulator_with_a_comment_on_every_key(tmp_path):
    out = tmp_path / "fitted.yaml"
    r = _cli("scenario", "fit", str(VERL), "--config", str(VERL_CFG), "--out", str(out))
    assert r.exit_code == 0, r.output
    text = out.read_text()
    sc = load_scenario(out)
    assert sc.workload.train.step_s == pytest.approx(30.0, rel=0.01)
    for line in text.splitlines():
        if line.strip() and not line.startswith("#") and not line.rstrip().endswith(":"):
            assert "#" in line or line.startswith("description"), line
    assert "[M] timing_s/timing_s/param_sync" in text and "DEFAULT: missing" in text
    sim = _cli("simulate", str(out), "--set", "steps=2", "-q", "--json", "-")
    assert sim.exit_code == 0, sim.output


# ---- dynres format ---------------------------------------------------------------------------------


def test_real_tiny_run_fits_its_config_lengths_and_costs():
    fit = fit_scenario(read_metrics(TINY / "metrics.jsonl"))
    sc = fit.load()
    assert sc.policy_name == "static_fully_async"
    assert (sc.required_samples, sc.responses_per_sample, sc.async_training.trigger_parameter_sync_step) == (8, 8, 2)
    assert (sc.num_standalone_replicas, sc.num_hybrid_replicas) == (2, 1)
    assert sc.workload.prompt_tokens == 8 and sc.workload.response.max_tokens == 32
    records = [json.loads(x) for x in (TINY / "metrics.jsonl").read_text().splitlines()]
    mean_len = sum(r["batch/response_tokens_mean"] for r in records) / len(records)
    assert 28 < mean_len <= 32
    assert sc.workload.response.median_tokens == pytest.approx(mean_len, rel=0.05)
    report = json.loads((TINY / "report.json").read_text())
    st = report["operations"]["engine"]["export_weights"]
    assert sc.costs.export_weights_s == pytest.approx(st["total_s"] / st["count"], abs=1e-6)
    steps = [t for r in records for t in r["train_step_times"]]
    assert sc.workload.train.step_s == pytest.approx(sum(steps) / len(steps), rel=0.1)
    assert fit.measured_end_to_end_s == report["end_to_end_s"]
    assert fit.first_cycle_start_s == records[0]["start_s"]
    # No switch happened under static_fully_async: the switch costs come from the switch calibration
    # (under its old name in this stored report.json).
    steps = report["startup_probe"]["steps"]
    assert {s["op"] for s in steps} >= {"sleep", "wake_up", "offload", "onload"}
    wakes = [s["duration_s"] for s in steps if s["op"] == "wake_up"]
    sleeps = [s["duration_s"] for s in steps if s["op"] == "sleep"]
    assert sc.costs.wake_up_s == pytest.approx(sum(wakes), abs=1e-6)  # weights + kv_cache of one replica
    assert sc.costs.sleep_s == pytest.approx(sum(sleeps) / len(sleeps), abs=1e-6)
    assert "switch calibration" in fit.notes["costs.trainer_offload_s"]
    assert not any("wake_up" in m or "sleep" in m or "offload" in m for m in fit.missing)


def test_as_it_was_prediction_is_compared_with_the_measured_run():
    fit = fit_scenario(read_metrics(TINY))
    cmp = predict(fit, ["default"])
    assert [p.policy for p in cmp.predictions] == ["static_fully_async", "default"]
    first_sim = fit.first_cycle_start_s - cmp.warmup_s
    assert 0 <= first_sim < 1.0  # the simulated start-up is an initial weight sync
    base = cmp.as_it_was.mean_s
    assert cmp.error == pytest.approx((base - fit.measured_end_to_end_s) / fit.measured_end_to_end_s)
    assert abs(cmp.error) < 0.25  # the fit must describe its own run (the benchmark's target is 10%)


def test_a_fake_run_records_what_it_trained_on_and_fits(tmp_path):
    cfg = {
        "run": {"steps": 4, "seed": 0},
        "engines": {
            "runtime": "local",
            "rollout": "fake",
            "trainer": "fake",
            "rollout_options": {"tokens_per_s": 2000.0, "response_tokens": 16},
            "trainer_options": {"phase_times": {"update_actor": 0.02}},
        },
        "task": {"prompt_length": 8, "max_tokens": 16},
        "async_training": {"trigger_parameter_sync_step": 2, "concurrent_samples_per_replica": 4},
        "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 4}, "rollout": {"n": 2}},
        "rollout": {"nnodes": 1, "n_gpus_per_node": 1},
        "trainer": {"nnodes": 1, "n_gpus_per_node": 1},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    r = _cli("run", str(path), "--out", str(out), "-q")
    assert r.exit_code == 0, r.output
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    for rec in records:
        assert rec["batch/samples"] == 8 and rec["batch/responses"] == 16
        assert rec["batch/response_tokens_mean"] == 16 and rec["batch/response_log_tokens_std"] == 0
        assert len(rec["train_step_times"]) == 2 and rec["weight_sync_s"] >= 0
    assert json.loads((out / "config.json").read_text())["run"]["steps"] == 4
    fit = fit_scenario(read_metrics(out))
    sc = fit.load()
    assert (sc.required_samples, sc.responses_per_sample, sc.workload.response.median_tokens) == (4, 2, 16)


def test_batch_stats_group_share_is_the_between_group_share_of_log_variance():
    def sample(i: int, lengths: list[int]) -> Sample:
        g = PromptGroup(sample_id=f"s{i}", prompt_token_ids=[1, 2, 3], n=len(lengths))
        rs = tuple(GenerationResult(f"s{i}-{j}", [0] * n, [0.0] * n, "length", "r") for j, n in enumerate(lengths))
        return Sample(group=g, responses=rs, start_version=0, finish_version=0, started_s=1.0, finished_s=3.0 + i)

    # Two groups, each of constant length: all variance is between groups.
    st = batch_stats([sample(0, [4, 4]), sample(1, [16, 16])])
    assert st["response_log_group_share"] == pytest.approx(1.0)
    assert st["response_log_tokens_mean"] == pytest.approx(math.log(8))
    assert st["response_log_tokens_std"] == pytest.approx(math.log(2))
    assert (st["prompt_tokens_mean"], st["sample_gen_s_mean"], st["sample_gen_s_max"]) == (3, 2.5, 3.0)
    # Same lengths mixed inside each group: none of it is between groups.
    st = batch_stats([sample(0, [4, 16]), sample(1, [16, 4])])
    assert st["response_log_group_share"] == pytest.approx(0.0)
    assert batch_stats([]) == {}


def test_simulated_steps_carry_the_same_batch_record():
    from dynres.runtime.sim.runner import simulate

    r = simulate("seed-dynamic-16-16", overrides={"steps": 2})
    step = r.to_dict()["steps"][0]
    sc = r.scenario
    assert step["batch/samples"] == sc.step_required_samples
    assert step["batch/responses"] == sc.step_required_samples * sc.responses_per_sample
    assert step["batch/prompt_tokens_mean"] == sc.workload.prompt_tokens
    # The cycle's weight sync is the export plus one replica update (replicas load in parallel).
    assert step["weight_sync_s"] == pytest.approx(sc.costs.export_weights_s + sc.costs.weight_sync_s, rel=0.01)
    assert len(step["train_step_times"]) == sc.async_training.trigger_parameter_sync_step
    assert sum(step["train_step_times"]) == pytest.approx(step["dynamic_resource/train_compute_time_s"], rel=1e-6)


# ---- CLI ---------------------------------------------------------------------------------------------


def test_compare_json_has_a_prediction_per_policy_and_the_error(tmp_path):
    r = _cli("scenario", "compare", str(TINY), "--policy", "default", "--policy", "predictive", "--json", "-")
    assert r.exit_code == 0, r.output
    payload = json.loads(r.stdout)
    assert [p["policy"] for p in payload["predictions"]] == ["static_fully_async", "default", "predictive"]
    m = payload["measured_end_to_end_s"]
    first = payload["predictions"][0]["predicted_end_to_end_s"]
    assert payload["as_it_was_error"] == pytest.approx((first - m) / m)
    assert "as-it-was prediction" in r.stderr


@pytest.mark.parametrize(
    ("setup", "needles"),
    [
        (lambda p: None, ["no such file", "metrics.jsonl"]),
        (lambda p: p.write_text(""), ["empty"]),
        (lambda p: p.write_text("not json\n"), ["line 1", "not JSON"]),
        (lambda p: p.write_text('{"a": 1}\n'), ["neither", "verl"]),
        (
            lambda p: p.write_text('{"step": 1, "data": {"actor/pg_loss": 0.1}}\n'),
            ["no training cycle", "timing_s/step"],
        ),
    ],
)
def test_bad_metrics_files_are_one_line_exit_2(tmp_path, setup, needles):
    p = tmp_path / "m.jsonl"
    setup(p)
    for args in (["scenario", "fit", str(p)], ["scenario", "compare", str(p), "--policy", "default"]):
        _one_error_line(_cli(*args), str(p), *needles)


def test_missing_required_metrics_and_unknown_policy_are_one_line(tmp_path):
    recs = [json.loads(x) for x in (TINY / "metrics.jsonl").read_text().splitlines()]
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps({k: v for k, v in r.items() if "response" not in k}) + "\n" for r in recs))
    _one_error_line(_cli("scenario", "fit", str(p)), "no response lengths")
    _one_error_line(_cli("scenario", "fit", str(TINY / "metrics.jsonl"), "--set", "costs.sleep_s=-1"), "sleep_s")
    # Unknown policy: named before the metrics are even read (a missing file would say otherwise).
    _one_error_line(
        _cli("scenario", "compare", str(tmp_path / "nope.jsonl"), "--policy", "no_such_policy"), "no_such_policy"
    )
    with pytest.raises(MetricsError, match="at least 2"):
        one = tmp_path / "one.jsonl"
        one.write_text(json.dumps(recs[0]) + "\n")
        fit_scenario(read_metrics(one))


def test_decode_config_c_half_is_what_the_fit_inverts():
    # The fit divides by c / (c + c_half): keep the workload's definition in sight.
    assert DecodeConfig().c_half == pytest.approx(9.0)


def test_costs_from_another_run_fill_the_switch_costs_a_static_run_lacks(tmp_path):
    other = tmp_path / "dyn"
    other.mkdir()
    engine = {"sleep": {"count": 4, "total_s": 0.8, "max_s": 0.3, "failures": 0}}
    (other / "report.json").write_text(json.dumps({"operations": {"engine": engine}}))
    r = _cli("scenario", "fit", str(TINY), "--costs-from", str(other), "--json", "-")
    assert r.exit_code == 0, r.output
    payload = json.loads(r.stdout)
    assert payload["scenario"]["costs"]["sleep_s"] == pytest.approx(0.2)
    assert "--costs-from" in payload["notes"]["costs.sleep_s"]
    # A switch measured in the other run's cycles comes before this run's idle switch calibration;
    # wake_up, which the other run lacks, comes from the calibration.
    assert "switch calibration" in payload["notes"]["costs.wake_up_s"]
    assert not any("costs.sleep_s" in m or "costs.wake_up_s" in m for m in payload["missing"])
    _one_error_line(
        _cli("scenario", "fit", str(TINY), "--costs-from", str(tmp_path / "none")), "--costs-from", "no such"
    )


def test_length_noise_without_a_trend_is_not_fitted_as_drift(tmp_path):
    lines = [json.loads(x) for x in VERL.read_text().splitlines()]
    wobble = [2000, 2090, 1930, 2050, 1960, 2070, 1920, 2040, 1990, 1980]
    for rec in lines:
        if "response_length/mean" in rec["data"]:
            rec["data"]["response_length/mean"] = wobble[rec["step"] - 1]
    p = tmp_path / "flat.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    fit = fit_scenario(read_metrics(p), config=yaml.safe_load(VERL_CFG.read_text()))
    assert fit.load().workload.response.growth_per_step == 0.0
    assert "not significant" in fit.notes["workload.response.growth_per_step"]
    # The real trend of the fixture (+1%/cycle) is kept.
    assert fit_scenario(read_metrics(VERL)).load().workload.response.growth_per_step > 0.005


def test_each_format_fits_every_section_once():
    # The fit's sections are written once; a format only orders them. One left out (or run twice)
    # would silently drop (or re-fit) a part of the scenario for that format.
    from dynres.runtime.sim.fit.fitter import SECTIONS
    from dynres.runtime.sim.fit.formats import FORMATS

    assert set(FORMATS) == {"dynres", "verl"}
    for fmt in FORMATS.values():
        assert sorted(fmt.section_order) == sorted(SECTIONS), fmt.name
