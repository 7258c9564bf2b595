"""A newcomer's rough edges (issue 30): each test fails on the behaviour the issue reported.

Numbers refer to the issue's list: 5 clamped answers and fallbacks said in the terminal, 7 a missing
engine extra and the default output folder, 8 typos in engine options and policy files.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from dynres.runtime.cli import main

ROOT = Path(__file__).resolve().parents[3]
FAKE_RUN = ROOT / "examples" / "fake-minimal.yaml"

ROUGH_POLICY = '''
from dynres.core import Policy


class Rough(Policy):
    """Deactivates asking for far more samples than the queue holds, and raises when asked to activate."""

    name = "rough"

    def should_deactivate(self, ctx):
        return ctx.is_hybrid_active

    def deactivate_wait_samples(self, ctx):
        return 10**6

    def should_activate_after_step(self, ctx):
        if ctx.global_steps >= 1:
            raise RuntimeError("no estimate yet")
        return True
'''


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


# ---- 5: fallbacks and clamps are said in the terminal, [policy] labels intact -----------------


def test_5_simulate_names_fallbacks_and_clamps_with_the_label_and_the_json_key(tmp_path: Path) -> None:
    (tmp_path / "rough.py").write_text(ROUGH_POLICY)
    res = _invoke("simulate", "--preset", "seed-dynamic-16-16", "--policy", f"{tmp_path / 'rough.py'}:Rough",
                  "--set", "steps=3")  # fmt: skip
    assert res.exit_code == 0, res.output
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 2, res.stderr
    fallback, clamp = warnings
    assert "#1 seed-dynamic-16-16[rough]: policy 'rough' fell back" in fallback
    assert "should_activate_after_step" in fallback and "cycles[].decisions[] (fallback: true" in fallback
    assert "#1 seed-dynamic-16-16[rough]: policy 'rough' gave an answer outside the safe range" in clamp
    assert "deactivate_wait_samples" in clamp and "(clamped: true" in clamp


def test_5_run_summary_names_them_too(tmp_path: Path) -> None:
    (tmp_path / "rough.py").write_text(ROUGH_POLICY)
    res = _invoke("run", str(FAKE_RUN), "--out", str(tmp_path / "r"), "--no-plot",
                  "--policy", f"{tmp_path / 'rough.py'}:Rough")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "warning: run r: policy 'rough' gave an answer outside the safe range" in res.output


# ---- 7: a missing engine extra, the default output folder ----------------------------------------


def _hide(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in names else real(n, *a))


def test_7_missing_vllm_names_the_vllm_extra_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _hide(monkeypatch, "torch")  # torch is what vLLM replicas miss first; the extra to install is [vllm]
    out = tmp_path / "r"
    res = _invoke("run", str(FAKE_RUN), "--out", str(out), "--set", "engines.rollout=vllm")
    assert res.exit_code == 2
    assert res.output.splitlines() == [
        "dynres: error: engines.rollout=vllm needs 'torch', which is not installed; install it with: "
        "pip install 'dynres-runtime[vllm]'"
    ]  # no header line first
    assert not out.exists()  # no half-made output folder


@pytest.mark.slow
def test_7_default_folder_is_fresh_and_git_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for expected in ("fake-minimal", "fake-minimal-2"):
        res = _invoke("run", str(FAKE_RUN), "--no-plot", "-q")
        assert res.exit_code == 0, res.output
        assert f"output in dynres-runs/{expected}\n" in res.output
        assert (tmp_path / "dynres-runs" / expected / "metrics.jsonl").exists()
    assert (tmp_path / "dynres-runs" / ".gitignore").read_text().splitlines()[-1] == "*"
    res = _invoke("run", str(FAKE_RUN), "--no-plot", "-q", "--out", "dynres-runs/fake-minimal")
    assert "note: --out dynres-runs/fake-minimal holds an earlier run; its files are replaced" in res.output


# ---- 8: typos get a did-you-mean, in the user's words ---------------------------------------------


@pytest.mark.parametrize(
    ("key", "typo", "nearest", "cls"),
    [
        ("rollout_options", "tokens_per_sec", "tokens_per_s", "FakeReplica"),
        ("trainer_options", "phase_time", "phase_times", "FakeTrainEngine"),
    ],
)
def test_8_fake_engine_option_typo_says_did_you_mean(key: str, typo: str, nearest: str, cls: str) -> None:
    res = _invoke("run", str(FAKE_RUN), "--set", f"engines.{key}.{typo}=1")  # checked before anything starts
    assert res.exit_code == 2
    msg = res.output.strip()
    assert f"engines.{key}: unknown option '{typo}' (did you mean '{nearest}'?); the {cls} options are" in msg
    assert "__init__" not in msg and "TypeError" not in msg


def test_8_policy_file_without_class_says_how_to_name_it(tmp_path: Path) -> None:
    (tmp_path / "rough.py").write_text(ROUGH_POLICY)
    res = _invoke("simulate", "--preset", "seed-dynamic-16-16", "--policy", str(tmp_path / "rough.py"))
    assert res.exit_code == 2
    assert f"name the class too, as {tmp_path / 'rough.py'}:Rough" in res.output


# ---- 2, 4, 12: the simulate tables -------------------------------------------------------------


def _simulate_json(tmp_path: Path, *extra: str, columns: str = "80") -> tuple[str, dict]:
    import json

    path = tmp_path / "sim.json"
    res = CliRunner(env={"COLUMNS": columns}).invoke(
        main, ["simulate", "--preset", "seed-dynamic-16-16", "--set", "steps=3", "--json", str(path), *extra]
    )
    assert res.exit_code == 0, res.output
    return res.stdout, json.loads(path.read_text())


def test_2_with_seeds_the_table_and_vs_line_compare_means(tmp_path: Path) -> None:
    out, data = _simulate_json(tmp_path, "--compare-policy", "static_fully_async", "--seeds", "2")
    rows = data["over_seeds"]
    first, second = rows["seed-dynamic-16-16[default]"], rows["seed-dynamic-16-16[static_fully_async]"]
    of_means = (second["mean_s"] - first["mean_s"]) / first["mean_s"]
    assert second["vs_first_mean"] == pytest.approx(of_means)
    assert "simulated end-to-end time, mean of seeds 0..1" in out
    assert f"{of_means * 100:+.1f}%" in out  # the table's vs #1
    assert f"{abs(of_means) * 100:.1f}% longer than #1 (means)" in out
    assert f"{first['mean_s'] / 60:.1f}" in out  # the mean, in minutes, not seed 0's time


def test_4_a_short_run_is_not_printed_as_zero_hours(tmp_path: Path) -> None:
    out, data = _simulate_json(
        tmp_path, "--set", "workload.train.step_s=1", "--set", "workload.response.median_tokens=50"
    )
    assert data["end_to_end_s"] < 600
    assert "(s)" in out and f"{data['end_to_end_s']:.1f}" in out and "0.000" not in out


@pytest.mark.slow
def test_12_compare_policy_output_fits_80_columns_unwrapped(tmp_path: Path) -> None:
    # 200 columns: rich would not fold anything, so every line must fit 80 on its own.
    args = ("--compare-policy", "static_fully_async", "--compare-policy", "predictive", "--seeds", "2")
    out, _ = _simulate_json(tmp_path, *args, columns="200")
    lines = [ln.rstrip() for ln in out.splitlines() if not ln.startswith("wrote ")]  # a path is the user's
    assert max(len(ln) for ln in lines) <= 80, out


# ---- 10: the user docs define every column the simulate tables print -------------------------


def test_10_simulator_page_defines_every_utilization_column() -> None:
    from dynres.runtime.cli.simulate import _summary_tables
    from dynres.runtime.sim import simulate
    from dynres.runtime.sim.comparison import Comparison

    page = (ROOT / "docs" / "simulator.md").read_text(encoding="utf-8")
    _, util = _summary_tables(Comparison([simulate("seed-dynamic-16-16", overrides={"steps": 1})]))
    headers = [" ".join(str(c.header).split()) for c in util.columns if str(c.header) != "#"]
    assert headers == ["train util", "rollout util", "cluster util", "hybrid switches", "mq_size (samples)"]
    for header in headers:
        assert f"| `{header}` |" in page, header
    assert "0 rollout GPUs (only hybrid replicas) has a rollout util" in page


# ---- 1 and 9: writing-a-policy.md says where the testkit comes from and that Params is frozen -----


def test_1_the_walk_through_installs_the_testkit_before_the_test_extra() -> None:
    page = (ROOT / "docs" / "writing-a-policy.md").read_text(encoding="utf-8")
    extra = page.index("pip install -e '.[test]'")
    assert 0 <= page.find("pip install ./packages/dynres-testkit") < extra
    # The path it names is the distribution the example's test extra asks for.
    example = (ROOT / "examples" / "dynres-policy-example" / "pyproject.toml").read_text(encoding="utf-8")
    assert '"dynres-testkit' in example and (ROOT / "packages" / "dynres-testkit" / "pyproject.toml").exists()


def test_9_writing_a_policy_says_params_are_frozen() -> None:
    page = (ROOT / "docs" / "writing-a-policy.md").read_text(encoding="utf-8")
    assert "`self.params` is frozen" in page and "policy.params.floor = 0.5" in page


# ---- a Python warning (a renamed param) is one dynres line, not a source path and a code line -----


def test_a_future_warning_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    import subprocess
    import sys

    dynres = Path(sys.executable).parent / "dynres"
    key = "async_training.dynamic_schedule_policy_params.probe_interval_min=2"
    args = [str(dynres), "simulate", "--preset", "seed-dynamic-16-16", "--policy", "predictive", "--set", key]
    res = subprocess.run([*args, "--set", "steps=2"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [
        "dynres: warning: predictive param 'probe_interval_min' is deprecated; rename it to 'backoff_min_cycles'"
    ]
