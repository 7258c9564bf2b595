"""The tiny real-run benchmark's rounds (benchmarks/tiny_grpo_bench.py): order, medians, per-round ratios."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_module import BENCHMARKS, load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("tiny_grpo_bench.py")


def run(policy: str, rnd: int, e2e: float) -> dict:
    """A run row as run_one builds it (only the numbers the summary reads)."""
    return {
        "policy": policy,
        "round": rnd,
        "end_to_end_s": e2e,
        "mean_cycle_s": e2e / 10,
        "activations": 0,
        "deactivations": 0,
        "wait_s": 1.0,
        "utilization": 0.5,
        "reward_last3": 0.9,
        "wall_s": 60.0,
        "engines_start_s": None,
    }


def test_every_policy_runs_once_per_round_and_first_in_turn(bench) -> None:
    order = bench.rounds(["a", "b", "c"], 3)
    assert all(sorted(r) == ["a", "b", "c"] for r in order)
    assert [r[0] for r in order] == ["a", "b", "c"]


def test_a_comparison_pairs_the_runs_of_one_round(bench) -> None:
    # b is 10% slower than a in two rounds and equal in one; pooled medians (12 vs 12) would say 0%.
    runs = [run("a", 0, 10.0), run("b", 0, 11.0), run("a", 1, 20.0), run("b", 1, 22.0)]
    runs += [run("a", 2, 12.0), run("b", 2, 12.0)]
    table, lines = bench.summarize(runs, ["a", "b"])
    assert [(r["policy"], r["end_to_end_s"], r["end_to_end_min_s"], r["end_to_end_max_s"]) for r in table] == [
        ("a", 12.0, 10.0, 20.0),
        ("b", 12.0, 11.0, 22.0),
    ]
    assert lines == ["b vs a: end-to-end +10.0% (median of 3 rounds; per round +0.0% .. +10.0%)"]


@pytest.mark.slow
def test_repeats_on_fake_engines(bench, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = str(BENCHMARKS.parent / "examples" / "fake-minimal.yaml")
    args = ["--config", config, "--policies", "static_fully_async,default", "--repeats", "2"]
    assert bench.main([*args, "--out", str(tmp_path), "--json"]) == 0
    out = capsys.readouterr()
    runs = json.loads(out.out)
    assert [(r["round"], r["policy"]) for r in runs] == [
        (0, "static_fully_async"),
        (0, "default"),
        (1, "default"),
        (1, "static_fully_async"),
    ]
    assert all(r["end_to_end_s"] > 0 for r in runs)
    assert {r["policy"]: r["activations"] > 0 for r in runs} == {"static_fully_async": False, "default": True}
    with pytest.raises(SystemExit) as exc:
        bench.main([*args[:-1], "0"])
    assert exc.value.code == 2
    assert "--repeats must be at least 1" in capsys.readouterr().err


def test_an_entry_with_params_gets_its_own_folder_and_a_bad_one_stops_the_bench(bench) -> None:
    assert bench.folder_name("predictive[extra_admission=0.5]") == "predictive-extra_admission=0.5"
    assert bench.folder_name("examples/policies/length_routing.py:LengthRouting") == "LengthRouting"
    with pytest.raises(SystemExit, match="no_such_param"):
        bench.main(["--policies", "default,predictive[no_such_param=1]"])
