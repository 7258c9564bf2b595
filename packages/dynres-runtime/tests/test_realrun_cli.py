"""``dynres run``: config errors are one line + exit 2, a fake run writes its files, Ctrl-C is clean."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from terminal import popen_like_a_terminal

from dynres.core.errors import ConfigError
from dynres.core.metrics import METRIC_KEYS
from dynres.runtime.cli import main
from dynres.runtime.realrun import load_run_config
from dynres.runtime.sim.runner import simulate

FAKE = {
    "run": {"steps": 3, "seed": 0},
    "ray": {"num_cpus": 2, "slot": {"CPU": 0.1}},
    "engines": {
        "runtime": "local",
        "rollout": "fake",
        "trainer": "fake",
        "rollout_options": {"tokens_per_s": 400.0, "response_tokens": 16, "latency": {"sleep": 0.02, "wake_up": 0.02}},
        "trainer_options": {"phase_times": {"update_actor": 0.1}, "latency": {"offload": 0.01, "onload": 0.01}},
    },
    "async_training": {
        "use_dynamic_resource_scheduling": True,
        "trigger_parameter_sync_step": 2,
        "concurrent_samples_per_replica": 4,
    },
    "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 4}, "rollout": {"n": 2}},
    "rollout": {"nnodes": 1, "n_gpus_per_node": 1},
    "trainer": {"nnodes": 1, "n_gpus_per_node": 1},
}


def _write(tmp_path: Path, data: dict, name: str = "run.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def _invoke(*args: str):
    return CliRunner().invoke(main, ["run", *args])


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("dynres: error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"engines": {"rolout": "fake"}}, "unknown key 'engines.rolout' (did you mean 'rollout'?)"),
        ({"async_training": {"staleness_treshold": 0.1}}, "did you mean 'staleness_threshold'"),
        ({"ray": {"adress": "auto"}}, "did you mean 'address'"),
        ({"model": {"tiny": {"hiden_size": 32}}}, "did you mean 'hidden_size'"),
        ({"engines": {"rollout": "tgi"}}, "engines.rollout"),
        ({"run": {"steps": 0}}, "run.steps"),
        ({"task": {"max_tokens": 600}}, "max_position_embeddings"),
    ],
)
def test_config_errors_are_one_line_exit_2(tmp_path, change, expected):
    data = json.loads(json.dumps(FAKE))
    for section, values in change.items():
        data.setdefault(section, {}).update(values)
    line = _one_error_line(_invoke(str(_write(tmp_path, data)), "--out", str(tmp_path / "out")))
    assert expected in line


def test_missing_steps_unknown_policy_bad_yaml_and_bad_set(tmp_path):
    data = json.loads(json.dumps(FAKE))
    del data["run"]
    assert "missing key 'run'" in _one_error_line(_invoke(str(_write(tmp_path, data))))
    line = _one_error_line(_invoke(str(_write(tmp_path, FAKE)), "--policy", "defualt", "--out", str(tmp_path / "o")))
    assert "unknown policy 'defualt'" in line and "did you mean 'default'" in line
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: {steps: 2\n")
    assert "invalid YAML" in _one_error_line(_invoke(str(bad)))
    assert "file not found" in _one_error_line(_invoke(str(tmp_path / "nope.yaml")))
    assert "section.key=value" in _one_error_line(_invoke(str(_write(tmp_path, FAKE)), "--set", "oops"))


def test_overrides_are_dotted_and_typed():
    cfg = load_run_config(FAKE, {"run.steps": 7, "async_training.dynamic_schedule_policy": "static_fully_async"})
    assert cfg.run.steps == 7 and cfg.async_training.dynamic_schedule_policy == "static_fully_async"
    assert cfg.dynres_config().num_hybrid_replicas == 1
    with pytest.raises(ConfigError, match="not a section"):
        load_run_config(FAKE, {"run.steps.x": 1})


def test_plan_launch_applies_shorthands_and_decides_output_before_anything_starts(tmp_path, monkeypatch):
    from dynres.runtime import plots
    from dynres.runtime.realrun import plan_launch
    from dynres.runtime.realrun.launch import NO_PLOTS_NOTE

    monkeypatch.chdir(tmp_path)
    run_file = _write(tmp_path, FAKE, "tiny.yaml")
    plan = plan_launch(run_file, sets=["run.seed=4"], steps=2, policy="fixed_ratio")
    at = plan.config.async_training
    assert (plan.config.run.steps, plan.config.run.seed, at.dynamic_schedule_policy) == (2, 4, "fixed_ratio")
    assert plan.out_dir == Path("dynres-runs") / "tiny" and plan.plot_dir is None
    assert not (tmp_path / "dynres-runs").exists()  # a plan starts and writes nothing
    with pytest.raises(ConfigError, match=r"--steps and --set run.steps=\.\.\. both set run.steps"):
        plan_launch(run_file, sets=["run.steps=3"], steps=2)
    monkeypatch.setattr(plots, "plotting_available", lambda: False)
    plan = plan_launch(run_file, out_dir=tmp_path / "o")
    assert not plan.plots and plan.notes == (NO_PLOTS_NOTE,) and plan.out_dir == tmp_path / "o"
    assert plan_launch(run_file, plots=False).notes == ()
    with pytest.raises(ConfigError, match="--plot needs matplotlib"):
        plan_launch(run_file, plot_dir=tmp_path / "p")


def test_fake_run_writes_metrics_report_and_plots(tmp_path):
    out = tmp_path / "out"
    result = _invoke(str(_write(tmp_path, FAKE)), "--out", str(out), "-q")
    assert result.exit_code == 0, result.output
    assert "controller overhead" in result.output and "engine sleep" in result.output
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert set(METRIC_KEYS) <= set(r)
    report = json.loads((out / "report.json").read_text())
    assert len(report["cycles"]) == 3 and report["policy"] == "default"
    assert sorted(p.name for p in (out / "plots").iterdir())
    s = report["samples"]
    assert s["generated"] == s["consumed"] + s["dropped_stale"] + s["queued_at_end"]
    # One record per cycle for both apps: the same keys as `dynres simulate --json` steps (train
    # metrics aside) and the values the report holds.
    sim_step = simulate("seed-dynamic-16-16", overrides={"steps": 1}).to_dict()["steps"][0]
    own = {k for k in sim_step if not k.startswith("sim/")}
    for r, c in zip(records, report["cycles"], strict=True):
        assert {k for k in r if not k.startswith(("train/", "cycle_mean/"))} == own
        for key in ("end_s", "samples_consumed", "activated", "rebalanced_requests", "step_wait_times"):
            assert r[key] == c[key], key
        assert r["train/samples"] == c["train_metrics"]["samples"]


def _session_processes(marker: str) -> list[int]:
    """Processes whose command line mentions ``marker`` (a Ray session's private temp dir)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if marker in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                    found.append(int(pid))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_ctrl_c_aborts_in_flight_work_and_stops_ray(tmp_path):
    pytest.importorskip("ray")
    data = json.loads(json.dumps(FAKE))
    data["run"]["steps"] = 500
    data["engines"]["runtime"] = "ray"
    data["engines"]["rollout_options"]["tokens_per_s"] = 50.0
    ray_tmp = tempfile.mkdtemp(prefix="dynres-ray-", dir="/tmp")
    data["ray"]["temp_dir"] = ray_tmp
    out = tmp_path / "out"
    cmd = [
        str(Path(sys.executable).parent / "dynres"),
        "run",
        str(_write(tmp_path, data)),
        "--out",
        str(out),
        "--no-plot",
    ]
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    # A terminal's Ctrl-C signals the whole foreground process group: do the same.
    proc = popen_like_a_terminal(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            metrics = out / "metrics.jsonl"
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[0]
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    try:
        assert proc.returncode == 130, output
        assert "dynres: interrupted after " in output
        assert "; in-flight work aborted, engines shut down, Ray stopped; report (what the run had) in " in output
        assert "Traceback" not in output and "never retrieved" not in output, output
        backend = json.loads((out / "backend.json").read_text())
        assert backend["interrupted"] is True
        assert backend["stop"]["stopped"] is True and backend["stop"]["in_flight"] == 0, backend
        assert backend["shutdown_problems"] == []
        cycles = len((out / "metrics.jsonl").read_text().splitlines())
        assert cycles >= 2
        report = json.loads((out / "report.json").read_text())  # what the run had, from the coordinator
        assert len(report["cycles"]) == cycles
        assert report["stopped_early"] == f"interrupted after {cycles} of 500 cycles"
        # Nothing of that Ray session survives (raylet, GCS, workers).
        for _ in range(50):
            if not _session_processes(ray_tmp):
                break
            time.sleep(0.2)
        assert _session_processes(ray_tmp) == []
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


NEVER_POLICY = (
    "from dynres.core import Policy\n"
    "class Never(Policy):\n"
    "    name = 'never'\n"
    "    def should_deactivate(self, ctx): return ctx.is_hybrid_active\n"
    "    def deactivate_wait_samples(self, ctx): return 0\n"
    "    def should_activate_after_step(self, ctx): return False\n"
)


def test_policy_from_a_file_runs_and_a_missing_one_is_one_line(tmp_path):
    pol = tmp_path / "never.py"
    pol.write_text(NEVER_POLICY)
    out = tmp_path / "out"
    cfg = _write(tmp_path, FAKE)
    result = _invoke(str(cfg), "--policy", f"{pol}:Never", "--out", str(out), "-q", "--no-plot")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["policy"] == "never"
    # The policy never activates the hybrid replica, so no cycle after the first has one running.
    assert not any(c["activated"] for c in report["cycles"])
    line = _one_error_line(_invoke(str(cfg), "--policy", f"{tmp_path}/gone.py:Never", "--out", str(out)))
    assert "gone.py' not found" in line


def test_bad_yaml_in_set_is_one_line_naming_the_key(tmp_path):
    out = tmp_path / "out"
    line = _one_error_line(_invoke(str(_write(tmp_path, FAKE)), "--set", "run.steps=[1,", "--out", str(out)))
    assert "--set run.steps: value '[1,' is not valid YAML" in line and "quote the whole value" in line
    assert not out.exists()  # checked before any work starts


def test_a_failing_train_step_is_one_line_and_the_report_keeps_a_checkpoint(tmp_path):
    data = json.loads(json.dumps(FAKE))
    data["engines"]["trainer_options"]["fail_on"] = {"train_step": "RuntimeError"}
    cfg = tmp_path / "r.yaml"
    cfg.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(main, ["run", str(cfg), "--out", str(tmp_path / "o"), "-q"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("dynres: error:")]
    assert len(lines) == 1 and "train_step on trainer failed" in lines[0] and "report.json" in lines[0]
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["checkpoint"]["queue"], "the failed batch must be in the checkpoint"


@pytest.mark.slow
def test_an_error_inside_the_ray_coordinator_is_its_own_one_line(tmp_path):
    # Ray re-raises a remote error (the trainer's, then the coordinator's BackendError) as a class
    # deriving from both RayTaskError and the error, whose text is the whole remote traceback: the
    # user must see only dynres's line.
    pytest.importorskip("ray")
    data = json.loads(json.dumps(FAKE))
    data["engines"]["runtime"] = "ray"
    data["engines"]["trainer_options"]["fail_on"] = {"train_step": "RuntimeError"}
    ray_tmp = tempfile.mkdtemp(prefix="dynres-ray-", dir="/tmp")
    data["ray"]["temp_dir"] = ray_tmp
    try:
        res = CliRunner().invoke(main, ["run", str(_write(tmp_path, data)), "--out", str(tmp_path / "o"), "-q"])
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("dynres: error:")]
    assert len(lines) == 1 and "train_step on trainer failed" in lines[0], res.stderr
    assert "ray::" not in lines[0] and 'File "' not in lines[0], lines[0]
    assert json.loads((tmp_path / "o" / "report.json").read_text())["checkpoint"]["queue"]


@pytest.mark.slow
def test_json_dash_prints_the_report_on_stdout(tmp_path):
    out = tmp_path / "out"
    result = _invoke(str(_write(tmp_path, FAKE)), "--out", str(out), "-q", "--no-plot", "--json", "-")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert len(report["cycles"]) == 3
    assert "finished 3 cycles" in result.stderr and not (out / "plots").exists()
    dest = tmp_path / "r.json"
    result = _invoke(str(_write(tmp_path, FAKE)), "--out", str(out), "-q", "--json", str(dest))
    assert result.exit_code == 0 and json.loads(dest.read_text())["policy"] == "default"
    assert "finished 3 cycles" in result.stdout
