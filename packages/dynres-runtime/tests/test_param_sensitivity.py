"""The one-at-a-time param sweep (benchmarks/param_sensitivity.py): which variants run, and their figures."""

from __future__ import annotations

import json

import pytest
from bench_module import load_bench


@pytest.fixture(scope="module")
def sweep():
    return load_bench("param_sensitivity.py")


def test_numbers_scale_within_their_bounds_and_booleans_flip(sweep) -> None:
    swept, skipped = sweep.variants("predictive", [0.5, 4.0])
    entries = dict.fromkeys(entry for _, entry in swept)
    # in_flight_credit is at most 1: 0.5 x 4 is clamped, 0.5 x 0.5 is not.
    assert "predictive[in_flight_credit=1.0]" in entries
    assert "predictive[in_flight_credit=0.25]" in entries
    # An integer stays one: backoff_after 3 -> 2 (1.5 rounded) and 12.
    assert "predictive[backoff_after=2]" in entries
    assert "predictive[backoff_after=12]" in entries
    assert "predictive[rebalance=false]" in entries
    assert "predictive[activate_at_start=false]" in entries
    # A param at 0 is a switch, not a scale; it is named as not swept, never run.
    assert not any("extra_admission" in entry for entry in entries)
    assert any(line.startswith("extra_admission: default 0") for line in skipped)


def test_a_variant_the_policy_refuses_is_listed_not_run(sweep) -> None:
    # backoff_max_cycles 32 x 0.1 = 3 is below backoff_min_cycles 4: the policy's own check refuses it.
    swept, skipped = sweep.variants("predictive", [0.1], ["backoff_max_cycles"])
    assert swept == []
    assert any("backoff_max_cycles=3: refused by the policy" in line for line in skipped)


def test_an_unknown_param_is_refused_by_name_with_the_policys_params(sweep, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        sweep.main(["--param", "wait_margni", "--scenario", "seed-dynamic-16-16"])
    assert "no param 'wait_margni'" in str(exc.value)
    assert "wait_margin" in str(exc.value)  # the fix: the params it has
    assert "runs" not in capsys.readouterr().err  # nothing was simulated


@pytest.mark.parametrize("factors", ["1", "0.5,x", "-2", ""])
def test_bad_factors_stop_before_any_run(sweep, factors, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        sweep.main(["--factors", factors, "--scenario", "seed-dynamic-16-16"])
    assert exc.value.code == 2
    assert "--factors" in capsys.readouterr().err


@pytest.mark.slow
def test_a_sweep_shows_which_param_moves_the_result(sweep, tmp_path, capsys) -> None:
    # 16 hybrid and 16 standalone replicas: a start activation needs activate_at_start_min_gain <= 1,
    # so 2.0 drops it and changes the run.
    scenario = tmp_path / "short.yaml"
    scenario.write_text("extends: seed-dynamic-16-16\nsteps: 3\n")
    out = tmp_path / "sweep.json"
    sweep.main(
        [
            "--scenario",
            str(scenario),
            "--param",
            "activate_at_start_min_gain",
            "--param",
            "calibrate_static",
            "--json",
            str(out),
        ]
    )
    figures = json.loads(out.read_text())
    runs = {(r["policy"], r["seed"]) for r in figures["rows"]}
    assert ("predictive[activate_at_start_min_gain=2.0]", 0) in runs
    assert ("static_fully_async", 0) in runs
    moved = figures["variants"]["predictive[activate_at_start_min_gain=2.0]"]
    assert moved["change_pct"] != 0.0
    assert figures["sensitivity_pct"]["activate_at_start_min_gain"] == pytest.approx(abs(moved["change_pct"]))
    assert figures["changed_scenarios"]["activate_at_start_min_gain"] == 1  # the one scenario moved
    printed = capsys.readouterr().out
    assert "predictive[activate_at_start_min_gain=0.5]" in printed
    assert "sensitivity (largest geomean change of a param's variants;" in printed
