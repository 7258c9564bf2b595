"""The fidelity benchmark's ranking rule (benchmarks/fidelity_bench.py, judge_pair): one verdict per pair."""

from __future__ import annotations

from statistics import median

import pytest
from bench_module import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("fidelity_bench.py")


def row(policy: str, predicted: float, switches: int, runs: list[float]) -> dict:
    """A table row as the benchmark builds it: prediction, decisions and the measured runs."""
    return {
        "policy": policy,
        "predicted_s": predicted,
        "predicted_switches": switches,
        "measured_s": median(runs),
        "measured_runs_s": runs,
    }


def test_predicted_tie_passes_only_when_the_measured_gap_is_noise(bench) -> None:
    # Same decisions, same predicted time; measured medians 30.0 vs 31.3 s, runs spread 2 s.
    a = row("static", 30.0, 0, [29.0, 30.0, 31.0])
    b = row("predictive", 30.1, 0, [30.5, 31.3, 32.0])
    ok, line = bench.judge_pair(a, b)
    assert ok, line
    assert "predicted tie (same decisions" in line and "measured gap 1.30 s inside range 2.00 s" in line
    # The same prediction against runs that barely vary: the 1.3 s gap is real, the tie is wrong.
    b_tight = row("predictive", 30.1, 0, [31.2, 31.3, 31.4])
    a_tight = row("static", 30.0, 0, [29.9, 30.0, 30.1])
    ok, line = bench.judge_pair(a_tight, b_tight)
    assert not ok and "exceeds range 0.20 s" in line, line


def test_predicted_tie_with_one_run_each_is_not_confirmed(bench) -> None:
    ok, line = bench.judge_pair(row("static", 30.0, 0, [30.0]), row("predictive", 30.0, 0, [30.2]))
    assert not ok and "range unknown" in line, line


def test_predicted_order_is_judged_against_the_measured_order_beyond_noise(bench) -> None:
    static = row("static", 30.0, 0, [29.9, 30.0, 30.2])
    fast = row("default", 26.0, 12, [27.0, 27.1, 27.3])
    slow = row("default", 26.0, 12, [33.0, 33.1, 33.3])
    ok, line = bench.judge_pair(static, fast)
    assert ok and "predicted default faster by 13.3%" in line and "same order" in line, line
    ok, line = bench.judge_pair(static, slow)
    assert not ok and "measured static faster by 3.10 s" in line and "order differs" in line, line


def test_a_reversed_order_inside_the_range_is_noise_and_says_so(bench) -> None:
    static = row("static", 30.0, 0, [28.0, 30.0, 32.0])
    default = row("default", 27.0, 12, [29.5, 31.0, 31.5])  # measured slower, by less than the range
    ok, line = bench.judge_pair(static, default)
    assert ok and "measured order is noise: gap 1.00 s inside range 4.00 s" in line, line


def test_the_ranking_target_is_the_and_of_the_pairs(bench) -> None:
    rows = [
        row("static", 30.0, 0, [29.9, 30.0, 30.1]),
        row("default", 26.0, 12, [26.9, 27.0, 27.1]),
        row("predictive", 30.0, 0, [31.2, 31.3, 31.4]),  # predicted tie with static, measured apart
    ]
    ok, lines = bench.judge_ranking(rows)
    assert not ok
    assert [ln.split()[0] for ln in lines] == ["PASS", "FAIL", "PASS"], lines
    rows[2] = row("predictive", 30.0, 0, [29.8, 30.0, 30.3])
    ok, lines = bench.judge_ranking(rows)
    assert ok, lines
