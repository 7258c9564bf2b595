"""The fidelity benchmark's ``--reuse [POLICIES]`` (fidelity_bench.py): which runs it reads, which it runs."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import pytest
from bench_module import load_bench

DATA = Path(__file__).resolve().parent / "data" / "tiny-static"
ONE_RUN = ["--repeats", "1", "--seeds", "1"]


@pytest.fixture(scope="module")
def bench():
    return load_bench("fidelity_bench.py")


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch, bench) -> list[str]:
    """Stand in for the real run (tiny_grpo_bench.run_one, minutes of engines): record the policy and
    leave the stored static run's files as its folder."""
    calls: list[str] = []

    def run_one(config: str, policy: str, steps: int | None, out: Path) -> dict:
        calls.append(policy)
        shutil.copytree(DATA, out / policy)
        return bench.load_run(out / policy)

    monkeypatch.setitem(sys.modules, "tiny_grpo_bench", types.SimpleNamespace(run_one=run_one))
    return calls


def leave_run(out: Path, policy: str, k: int = 0) -> Path:
    """A finished run of ``policy`` in the bench's layout (the stored static run's files)."""
    shutil.copytree(DATA, out / f"rep{k}" / policy)
    return out / f"rep{k}" / policy


def test_reuse_of_one_policy_reads_its_run_and_runs_only_the_others(bench, runner, tmp_path, capsys) -> None:
    leave_run(tmp_path, "default")
    assert bench.main(["--reuse", "default", "--predict", "default", *ONE_RUN, "--out", str(tmp_path), "--json"]) == 0
    assert runner == ["static_fully_async"]
    result = json.loads(capsys.readouterr().out)
    rows = {r["policy"]: r for r in result["rows"]}
    stored = json.loads((DATA / "report.json").read_text())["end_to_end_s"]
    assert rows["default"]["measured_runs_s"] == [stored]
    assert rows["default"]["predicted_s"] > 0 and rows["static_fully_async"]["measured_s"] == stored


def test_reuse_without_a_value_reads_every_policy_and_runs_nothing(bench, runner, tmp_path, capsys) -> None:
    leave_run(tmp_path, "static_fully_async")
    assert bench.main(["--reuse", "--predict", "", *ONE_RUN, "--out", str(tmp_path), "--json"]) == 0
    assert runner == []
    assert [r["policy"] for r in json.loads(capsys.readouterr().out)["rows"]] == ["static_fully_async"]


def test_a_reused_run_that_is_missing_stops_the_bench_before_any_run(bench, runner, tmp_path, capsys) -> None:
    leave_run(tmp_path, "default")  # repeat 0 only; repeat 1 is missing
    with pytest.raises(SystemExit) as exc:
        bench.main(["--reuse", "default", "--predict", "default", "--repeats", "2", "--out", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'rep1' / 'default' / 'report.json'} is missing" in err
    assert runner == []


def test_reuse_of_a_policy_the_call_does_not_run_is_refused(bench, runner, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--reuse", "predictive", "--predict", "default", "--repeats", "1", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "--reuse predictive: not among this call's policies (static_fully_async, default)" in capsys.readouterr().err
    assert runner == []
