"""The policy benchmark's configurations (benchmarks/policy_bench.py): NAME[KEY=VALUE;...] and --headroom."""

from __future__ import annotations

import json

import pytest
from bench_module import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("policy_bench.py")


def test_a_policy_entry_carries_typed_params(bench) -> None:
    assert bench.parse_policy("predictive") == ("predictive", {})
    name, params = bench.parse_policy(" predictive[wait_margin=0.05; rebalance=false ;backoff_after=4] ")
    assert name == "predictive"
    assert params == {"wait_margin": 0.05, "rebalance": False, "backoff_after": 4}


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("predictive[wait_margin]", "'wait_margin' of"),
        ("predictive[=0.1]", "is not KEY=VALUE"),
        ("predictive[wait_margin=0.1", "is not NAME or NAME[KEY=VALUE;...]"),
        # Well-formed but wrong for the policy: refused up front too, not by the first simulation.
        ("predictive[wait_margni=0.1]", "did you mean 'wait_margin'"),
        ("predictive[wait_margin=5]", "wait_margin"),
        ("nosuch", "unknown policy 'nosuch'"),
    ],
)
def test_a_malformed_entry_is_refused_by_name_before_any_run(bench, spec, says, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--seeds", "1", "--policies", f"default,{spec}"])
    assert says in str(exc.value)
    assert "seeds per run" not in capsys.readouterr().out  # nothing was simulated


def summary(means: dict[str, dict[str, float]]) -> dict:
    """A summary as summarise() builds it, with only the means the headroom reads."""
    return {"table": {sc: {pol: {"mean_s": m} for pol, m in row.items()} for sc, row in means.items()}}


def test_headroom_takes_each_scenarios_best_configuration(bench) -> None:
    s = summary(
        {
            "a": {"default": 100.0, "x[r=1]": 90.0, "x[r=2]": 95.0},
            "b": {"default": 100.0, "x[r=1]": 110.0, "x[r=2]": 80.0},
            "c": {"default": 100.0, "x[r=1]": 120.0, "x[r=2]": 130.0},
        }
    )
    room = bench.headroom(s, ["default", "x[r=1]", "x[r=2]"])
    assert room["best"] == {"a": "x[r=1]", "b": "x[r=2]", "c": "default"}
    assert room["geomean_vs_default"] == pytest.approx((0.9 * 0.8 * 1.0) ** (1 / 3))


@pytest.mark.slow
def test_params_reach_the_policy_in_the_simulation(bench, tmp_path, capsys) -> None:
    # deactivate_ratio 0 never finds a backlog gap, so fixed_ratio never activates; 0.9 does.
    out = tmp_path / "bench.json"
    bench.main(
        [
            "--seeds",
            "1",
            "--scenario",
            "verl-7b-async-16-16",
            "--policies",
            "default,fixed_ratio[deactivate_ratio=0.0],fixed_ratio[deactivate_ratio=0.9]",
            "--headroom",
            "--json",
            str(out),
        ]
    )
    table = json.loads(out.read_text())["table"]["verl-7b-async-16-16"]
    assert table["fixed_ratio[deactivate_ratio=0.0]"]["switches"] == 0
    assert table["fixed_ratio[deactivate_ratio=0.9]"]["switches"] > 0
    printed = capsys.readouterr().out
    assert "hindsight best of 3 configurations per scenario:" in printed
    assert "geomean of the hindsight best vs default:" in printed
