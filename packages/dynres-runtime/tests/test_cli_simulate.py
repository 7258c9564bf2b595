"""``dynres simulate`` through click's CliRunner: output, JSON, plots, errors (exit 2, one line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dynres.runtime.cli import main


def _run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, list(args))
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.stdout, res.stderr


def _assert_one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]


SHORT = ("--set", "steps=2")


def test_list_presets() -> None:
    code, out, _ = _run("simulate", "--list-presets")
    assert code == 0
    for name in ("seed-dynamic-16-16", "seed-static-8-24", "verl-7b-async-64-64", "longcot-dynamic-16-16"):
        assert name in out


def test_simulate_preset_with_compare_json_and_plots(tmp_path: Path) -> None:
    js = tmp_path / "out.json"
    plots = tmp_path / "plots"
    code, out, err = _run(
        "simulate",
        "--preset",
        "seed-dynamic-16-16",
        "--compare",
        "seed-static-16-16",
        *SHORT,
        "--json",
        str(js),
        "--plot",
        str(plots),
        "--seed",
        "3",
    )
    assert code == 0, err
    assert "end-to-end" in out and "seed-static-16-16[static_fully_async]" in out
    assert "(min)" in out  # a short run's times in minutes, not 0.0xx hours
    data = json.loads(js.read_text())
    assert [r["scenario"] for r in data["runs"]] == ["seed-dynamic-16-16", "seed-static-16-16"]
    for run in data["runs"]:
        assert run["seed"] == 3 and len(run["steps"]) == 2
        assert run["end_to_end_s"] >= run["lower_bound_s"] > 0
        assert "dynamic_resource/mq_size" in run["steps"][0]
    assert data["runs"][0]["policy"] == "default"
    assert data["runs"][1]["policy"] == "static_fully_async"
    pngs = sorted(p.relative_to(plots).as_posix() for p in plots.rglob("*.png"))
    assert "compare_mq_size.png" in pngs
    assert "seed-dynamic-16-16.default/utilization.png" in pngs
    assert "seed-dynamic-16-16.default/hybrid_timeline.png" in pngs
    assert "seed-static-16-16.static_fully_async/step_time.png" in pngs


def test_policy_vs_policy_on_one_scenario(tmp_path: Path) -> None:
    """--compare-policy: runs labelled scenario[policy] in the table, the lines, the JSON and the plots."""
    js = tmp_path / "pp.json"
    plots = tmp_path / "pp"
    code, out, err = _run(
        "simulate",
        "--preset",
        "seed-dynamic-16-16",
        "--policy",
        "static_fully_async",
        "--compare-policy",
        "default",
        "--compare-policy",
        "fixed_ratio",
        *SHORT,
        "--json",
        str(js),
        "--plot",
        str(plots),
    )
    assert code == 0, err
    labels = [
        "seed-dynamic-16-16[static_fully_async]",
        "seed-dynamic-16-16[default]",
        "seed-dynamic-16-16[fixed_ratio]",
    ]
    for label in labels:
        assert label in out
    data = json.loads(js.read_text())
    assert [r["label"] for r in data["runs"]] == labels
    assert [r["policy"] for r in data["runs"]] == ["static_fully_async", "default", "fixed_ratio"]
    assert sorted(data["vs_first"]) == sorted(labels[1:])  # distinct keys: no collision
    first = data["runs"][0]["end_to_end_s"]
    for run in data["runs"][1:]:
        # One formula everywhere: (run - first) / first, in the JSON, the table and the lines.
        frac = (run["end_to_end_s"] - first) / first
        assert run["vs_first"] == pytest.approx(frac)
        assert f"{frac * 100:+.1f}%" in out
        word = "longer" if frac > 0 else "shorter"
        assert f"{run['label']}: {abs(frac) * 100:.1f}% {word} than #1" in out
    assert {p.name for p in plots.iterdir() if p.is_dir()} == {
        "seed-dynamic-16-16.static_fully_async",
        "seed-dynamic-16-16.default",
        "seed-dynamic-16-16.fixed_ratio",
    }


def test_set_run_applies_to_one_run_only(tmp_path: Path) -> None:
    """A param only the main run's policy has goes to that run with --set-run; --set would fail the others."""
    param = "async_training.dynamic_schedule_policy_params.no_such_in_static=1"
    js = tmp_path / "s.json"
    code, out, err = _run(
        "simulate",
        "--preset",
        "seed-dynamic-16-16",
        "--compare-policy",
        "fixed_ratio",
        "--set-run",
        "2",
        "steps=3",
        *SHORT,
        "--json",
        str(js),
    )
    assert code == 0, err
    runs = json.loads(js.read_text())["runs"]
    assert [len(r["steps"]) for r in runs] == [2, 3]
    code, out, err = _run("simulate", "--preset", "seed-dynamic-16-16", "--set-run", "2", param)
    _assert_one_line_error(code, out, err, "--set-run 2", "no run #2", "1..1")


def test_json_dash_prints_json_on_stdout_and_the_table_on_stderr() -> None:
    code, out, err = _run("simulate", "--preset", "seed-dynamic-16-16", *SHORT, "-q", "--json", "-")
    assert code == 0, err
    assert json.loads(out)["label"] == "seed-dynamic-16-16[default]"
    assert "simulated end-to-end time" in err
    assert not Path("-").exists()
    code, out, _ = _run("simulate", "--preset", "seed-dynamic-16-16", *SHORT, "-q", "--json")
    assert code == 0 and json.loads(out)["scenario"] == "seed-dynamic-16-16"


def test_table_fits_80_columns() -> None:
    """At 80 columns every number and every label is printed whole (no cut or folded values)."""
    from rich.console import Console

    from dynres.runtime.cli.simulate import _summary_tables, time_unit
    from dynres.runtime.sim import simulate
    from dynres.runtime.sim.comparison import Comparison

    results = [
        simulate("seed-dynamic-16-16", policy=p, overrides={"steps": 2}) for p in ("default", "static_fully_async")
    ]
    console = Console(width=80, record=True, markup=False)
    for table in _summary_tables(Comparison(results)):
        console.print(table)
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    unit, per, digits = time_unit([r.end_to_end_s for r in results])
    assert unit == "min" and f"({unit})" in text
    for r in results:
        assert r.label in text
        assert f"{r.end_to_end_s / per:.{digits}f}" in text and f"{r.lower_bound_s / per:.{digits}f}" in text


def test_simulate_scenario_file_single_json_object(tmp_path: Path) -> None:
    sc = tmp_path / "mine.yaml"
    sc.write_text(yaml.safe_dump({"extends": "seed-dynamic-16-16", "steps": 2}), encoding="utf-8")
    js = tmp_path / "one.json"
    plots = tmp_path / "p"
    code, _out, err = _run("simulate", str(sc), "--policy", "fixed_ratio", "--json", str(js), "--plot", str(plots))
    assert code == 0, err
    data = json.loads(js.read_text())
    assert data["policy"] == "fixed_ratio" and data["scenario"] == "mine"
    assert {"end_to_end_s", "lower_bound_s", "steps"} <= set(data)
    assert {p.name for p in plots.glob("*.png")} == {
        "mq_size.png",
        "utilization.png",
        "step_time.png",
        "hybrid_timeline.png",
    }


def test_policy_from_a_file(tmp_path: Path) -> None:
    pol = tmp_path / "mypol.py"
    pol.write_text(
        "from dynres.core import Policy\n"
        "class Never(Policy):\n"
        "    name = 'never'\n"
        "    def should_deactivate(self, ctx): return ctx.is_hybrid_active\n"
        "    def deactivate_wait_samples(self, ctx): return 0\n"
        "    def should_activate_after_step(self, ctx): return False\n",
        encoding="utf-8",
    )
    js = tmp_path / "o.json"
    code, _, err = _run(
        "simulate", "--preset", "seed-dynamic-16-16", "--policy", f"{pol}:Never", *SHORT, "--json", str(js)
    )
    assert code == 0, err
    assert json.loads(js.read_text())["policy"] == "never"


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--preset", "seed-dynamc-16-16"), ("unknown preset", "did you mean 'seed-dynamic-16-16'")),
        (
            ("--preset", "seed-dynamic-16-16", "--policy", "defualt"),
            ("unknown policy 'defualt'", "did you mean 'default'"),
        ),
        (
            ("--preset", "seed-dynamic-16-16", "--set", "async_training.staleness_threshol=0.3"),
            ("did you mean 'staleness_threshold'",),
        ),
        (
            ("--preset", "seed-dynamic-16-16", "--set", "async_training.staleness_threshold=-1"),
            ("staleness_threshold", "greater than or equal to 0"),
        ),
        (("--preset", "seed-dynamic-16-16", "--set", "workload.decode.peak_tokens_per_s=fast"), ("peak_tokens_per_s",)),
        (("--preset", "seed-dynamic-16-16", "--set", "nonsense"), ("key=value",)),
        (("--preset", "seed-dynamic-16-16", "--set", "steps=[1,"), ("--set steps: value '[1,' is not valid YAML",)),
        (("--preset", "seed-dynamic-16-16", "--compare", "seed-statc-8-24"), ("did you mean 'seed-static-8-24'",)),
        (("--preset", "seed-dynamic-16-16", "--policy", "no_such_module:Cls"), ("no_such_module",)),
        (("/nonexistent/scenario.yaml",), ("file not found",)),
    ],
)
def test_errors_are_one_line_exit_2(args: tuple[str, ...], needles: tuple[str, ...]) -> None:
    code, out, err = _run("simulate", *args)
    _assert_one_line_error(code, out, err, "dynres: error:", *needles)


def test_bad_scenario_files(tmp_path: Path) -> None:
    typo = tmp_path / "typo.yaml"
    typo.write_text("extends: seed-dynamic-16-16\ncluster: {trainer_gpu: 8}\n", encoding="utf-8")
    code, out, err = _run("simulate", str(typo))
    _assert_one_line_error(code, out, err, "cluster.trainer_gpu", "did you mean 'trainer_gpus'")
    rng = tmp_path / "range.yaml"
    rng.write_text("extends: seed-dynamic-16-16\nworkload: {decode: {lone_request_fraction: 2}}\n", encoding="utf-8")
    code, out, err = _run("simulate", str(rng))
    _assert_one_line_error(code, out, err, "lone_request_fraction", "less than or equal to 1")
    pol = tmp_path / "pol.yaml"
    pol.write_text("extends: seed-dynamic-16-16\nasync_training: {dynamic_schedule_policy: fancy}\n", encoding="utf-8")
    code, out, err = _run("simulate", str(pol))
    _assert_one_line_error(code, out, err, "unknown policy 'fancy'")
    broken = tmp_path / "broken.yaml"
    broken.write_text("steps: [\n", encoding="utf-8")
    code, out, err = _run("simulate", str(broken))
    _assert_one_line_error(code, out, err, "invalid YAML")


def test_usage_errors_exit_2() -> None:
    res = CliRunner().invoke(main, ["simulate"])
    assert res.exit_code == 2 and "exactly one of SCENARIO or --preset" in res.stderr
    res = CliRunner().invoke(main, ["simulate", "x.yaml", "--preset", "seed-dynamic-16-16"])
    assert res.exit_code == 2


def test_json_is_identical_across_processes(tmp_path: Path) -> None:
    """Same scenario + seed -> byte-identical JSON, even with different hash seeds per process."""
    import os
    import subprocess
    import sys

    outs = []
    for hashseed in ("1", "2"):
        out = tmp_path / f"run{hashseed}.json"
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        subprocess.run(
            [
                sys.executable,
                "-c",
                "from dynres.runtime.cli import main; main()",
                "simulate",
                "--preset",
                "seed-dynamic-16-16",
                "--set",
                "steps=2",
                "-q",
                "--json",
                str(out),
            ],
            check=True,
            env=env,
            capture_output=True,
        )
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


def test_a_dynamic_policy_on_a_static_preset_is_an_error_naming_the_fix() -> None:
    # The preset has no hybrid replicas: 'default' would silently run as static_fully_async.
    code, out, err = _run("simulate", "--preset", "seed-static-16-16", "--policy", "default", "--set", "steps=1")
    _assert_one_line_error(code, out, err, "use_dynamic_resource_scheduling: false", "--set async_training.")
    # static_fully_async there is what the preset means; with the --set the policy runs.
    assert (
        _run("simulate", "--preset", "seed-static-16-16", "--policy", "static_fully_async", "--set", "steps=1")[0] == 0
    )
    code, out, _ = _run(
        "simulate", "--preset", "seed-static-16-16", "--policy", "default", "--set", "steps=1",
        "--set", "async_training.use_dynamic_resource_scheduling=true",
    )  # fmt: skip
    assert code == 0 and "default" in out


def test_seeds_prints_mean_and_spread_and_writes_them(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    code, out, _ = _run(
        "simulate", "--preset", "seed-dynamic-16-16", "--set", "steps=1", "--seeds", "3", "--json", str(path)
    )
    assert code == 0 and "mean of seeds 0..2" in out and "#1 over seeds 0..2: " in out
    row = json.loads(path.read_text())["over_seeds"]["seed-dynamic-16-16[default]"]  # keyed by run label
    assert row["seeds"] == [0, 1, 2] and len(set(row["end_to_end_s"])) > 1
    assert row["min_s"] <= row["mean_s"] <= row["max_s"]


@pytest.mark.parametrize("command", [["simulate", "--preset", "seed-dynamic-16-16"], ["scenario", "compare", "."]])
def test_a_seed_count_below_one_is_a_one_line_error_in_every_command(command: list[str]) -> None:
    # simulate and scenario compare share one --seeds option: both refuse 0 before any work.
    _assert_one_line_error(*_run(*command, "--seeds", "0"), "--seeds", "give 1 or more")


VERL_CONFIG = Path(__file__).resolve().parents[3] / "examples" / "verl-fully-async.yaml"


def test_config_applies_a_verl_configs_dynres_keys_to_the_scenario() -> None:
    from dynres.core.config import DynresConfig, drop_verl_only_keys, read_yaml, validate_model
    from dynres.runtime.sim.scenario import config_overrides, load_scenario

    data, _ = drop_verl_only_keys(read_yaml(VERL_CONFIG), DynresConfig)
    sc = load_scenario("seed-dynamic-16-16", overrides=config_overrides(validate_model(DynresConfig, data)))
    base = load_scenario("seed-dynamic-16-16")
    at = sc.async_training
    assert (at.staleness_threshold, at.require_batches, at.concurrent_samples_per_replica) == (0.1, 1, 16)
    assert sc.actor_rollout_ref.actor.ppo_mini_batch_size == 32 and sc.actor_rollout_ref.rollout.n == 16
    assert (sc.cluster.trainer_gpus, sc.cluster.rollout_gpus, sc.cluster.gpus_per_replica) == (16, 16, 2)
    # What the config does not give keeps the scenario's own value.
    assert sc.workload == base.workload and sc.costs == base.costs and sc.steps == base.steps


@pytest.mark.skipif(not VERL_CONFIG.is_file(), reason="examples/ is only in a checkout of the repository")
def test_simulate_config_takes_a_verl_config_names_ignored_keys_and_set_wins() -> None:
    res = CliRunner().invoke(
        main,
        [
            *("simulate", "--preset", "seed-dynamic-16-16", "--config", str(VERL_CONFIG), "--set", "steps=2"),
            *("--set", "cluster.gpus_per_replica=4", "--json", "-", "-q"),
        ],
    )
    assert res.exit_code == 0, res.output
    ignored = [line for line in res.stderr.splitlines() if "verl key(s) dynres does not model" in line]
    assert len(ignored) == 1 and "algorithm" in ignored[0] and "data" in ignored[0]
    data = json.loads(res.stdout)
    cluster = {"trainer_gpus": 16, "rollout_gpus": 16, "gpus_per_replica": 4, "shared_host": False}
    assert data["cluster"] == cluster  # --set wins
    assert len(data["steps"]) == 2
    res = CliRunner().invoke(
        main, ["simulate", "--preset", "seed-dynamic-16-16", "--config", str(VERL_CONFIG), "--set", "steps=2", "--json"]
    )
    assert json.loads(res.stdout)["cluster"]["gpus_per_replica"] == 2  # the config's TP (the preset has 4)


@pytest.mark.skipif(not VERL_CONFIG.is_file(), reason="examples/ is only in a checkout of the repository")
def test_simulate_config_strict_rejects_verl_only_keys_in_one_line() -> None:
    code, _, err = _run("simulate", "--preset", "seed-dynamic-16-16", "--config", str(VERL_CONFIG), "--strict")
    # One line naming the first problems (verl keys dynres does not model) and counting the rest.
    assert code == 2 and err.count("\n") == 1 and err.startswith("dynres: error:"), err
    assert "unknown key 'async_training.use_trainer_do_validate'" in err and "more problem(s)" in err, err
    code, _, err = _run("simulate", "--preset", "seed-dynamic-16-16", "--strict")
    assert code == 2 and "--strict applies to --config" in err


def test_the_plan_numbers_the_runs_and_applies_overrides_in_order() -> None:
    """plan_simulations: table order, --set for all, --set-run N for run N, --seed over both, --policy for run 1."""
    from dynres.runtime.sim.plan import plan_simulations

    plan = plan_simulations(
        "seed-dynamic-16-16",
        is_preset=True,
        policy="fixed_ratio",
        compare_policies=["static_fully_async"],
        compare=["seed-static-16-16"],
        sets=["steps=3"],
        run_sets=[("2", "steps=2"), ("3", "seed=9")],
        seed=5,
        seeds=2,
    )
    assert [r.number for r in plan.runs] == [1, 2, 3]
    assert [r.label for r in plan.runs] == [
        "seed-dynamic-16-16[fixed_ratio]",
        "seed-dynamic-16-16[static_fully_async]",
        "seed-static-16-16[static_fully_async]",
    ]
    assert [r.policy_spec for r in plan.runs] == ["fixed_ratio", "static_fully_async", None]
    assert [r.scenario.steps for r in plan.runs] == [3, 2, 3]
    assert [r.scenario.seed for r in plan.runs] == [5, 5, 5]
    assert plan.seeds == 2


def test_simulate_plan_tells_the_observer_and_matches_simulate() -> None:
    """simulate_plan: start, one call per cycle, done, run by run; results as simulate() gives them."""
    from dynres.runtime.loop.report import CycleReport
    from dynres.runtime.sim import SimResult, simulate
    from dynres.runtime.sim.comparison import PlanObserver, simulate_plan
    from dynres.runtime.sim.plan import PlannedRun, plan_simulations

    plan = plan_simulations(
        "seed-dynamic-16-16", is_preset=True, compare_policies=["static_fully_async"], sets=["steps=2"]
    )
    events: list[tuple[object, ...]] = []

    class Record(PlanObserver):
        def run_started(self, run: PlannedRun) -> None:
            events.append(("start", run.number))

        def cycle_done(self, run: PlannedRun, cycle: CycleReport) -> None:
            events.append(("cycle", run.number, cycle.step))

        def run_done(self, run: PlannedRun, result: SimResult) -> None:
            events.append(("done", run.number, result.label))

    comparison = simulate_plan(plan, Record())
    assert events == [
        ("start", 1),
        ("cycle", 1, 1),
        ("cycle", 1, 2),
        ("done", 1, "seed-dynamic-16-16[default]"),
        ("start", 2),
        ("cycle", 2, 1),
        ("cycle", 2, 2),
        ("done", 2, "seed-dynamic-16-16[static_fully_async]"),
    ]
    direct = simulate("seed-dynamic-16-16", policy="static_fully_async", overrides={"steps": 2})
    assert comparison.results[1].to_dict() == direct.to_dict()
    payload = comparison.to_dict()
    assert payload["vs_first"] == {direct.label: comparison.vs_first[1]} and "over_seeds" not in payload
