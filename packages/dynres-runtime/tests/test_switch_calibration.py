"""The switch calibration (``run.calibration_switches``) and the fit that reads it.

A static run never switches; the calibration measures one idle switch of the hybrid replicas and the
trainer before the first cycle, records it in report.json apart from the cycles' operations, and
``dynres scenario fit`` takes the switch costs from it instead of the GPU-sized defaults.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from terminal import popen_like_a_terminal

from dynres.core import get_plugin_manager, load_config, load_policy
from dynres.runtime.backends.fake import FakeCluster, FakeReplica, fake_prompts
from dynres.runtime.cli import main
from dynres.runtime.loop.driver import FullyAsyncRun, RunSpec, run_fully_async
from dynres.runtime.protocols import ReplicaKind
from dynres.runtime.sim.fit import fit_scenario
from dynres.runtime.sim.metrics_io import read_metrics
from dynres.runtime.sim.scenario import Scenario

LAT = {"sleep": 0.06, "wake_up": 0.1}
"""Fake replica latencies (seconds per call)."""
TRAIN_LAT = {"offload": 0.04, "onload": 0.08}
"""Fake trainer latencies (seconds per call)."""

FAKE_RUN: dict[str, Any] = {  # a run file's document
    "run": {"steps": 3, "seed": 0},
    "engines": {
        "runtime": "local",
        "rollout": "fake",
        "trainer": "fake",
        "rollout_options": {"tokens_per_s": 400.0, "response_tokens": 16, "latency": LAT},
        "trainer_options": {"phase_times": {"update_actor": 0.05}, "latency": TRAIN_LAT},
    },
    "async_training": {
        "use_dynamic_resource_scheduling": True,
        "dynamic_schedule_policy": "static_fully_async",
        "trigger_parameter_sync_step": 2,
        "concurrent_samples_per_replica": 4,
    },
    "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 4}, "rollout": {"n": 2}},
    "rollout": {"nnodes": 1, "n_gpus_per_node": 1},
    "trainer": {"nnodes": 1, "n_gpus_per_node": 1},
}


def _dynres_run(tmp_path: Path, **run: int) -> tuple[Path, dict]:
    """``dynres run`` of FAKE_RUN with ``run`` overrides: its --out directory and report.json."""
    data = copy.deepcopy(FAKE_RUN)
    data["run"].update(run)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", str(cfg), "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    # The summary shows the calibration apart from the cycles' operations, or nothing when it is off.
    assert ("switch calibration (run.calibration_switches" in result.output) == (
        run.get("calibration_switches", 1) > 0
    ), result.output
    return out, json.loads((out / "report.json").read_text())


def test_calibration_is_in_report_json_before_the_first_cycle_and_not_a_cycle_switch(tmp_path):
    _, report = _dynres_run(tmp_path)
    calibration = report["switch_calibration"]
    ops = [(s["op"], s["detail"]) for s in calibration["steps"]]
    # The controller's order: offload, wake weights, load them, wake KV cache, sleep, onload.
    assert ops == [
        ("offload", ""),
        ("wake_up", "weights"),
        ("update_weights", ""),
        ("wake_up", "kv_cache"),
        ("sleep", ""),
        ("onload", ""),
    ]
    assert all(s["ok"] for s in calibration["steps"]) and calibration["failures"] == []
    timed = {(s["op"], s["detail"]): s["duration_s"] for s in calibration["steps"]}
    assert timed["sleep", ""] == pytest.approx(LAT["sleep"], abs=0.03)
    assert timed["offload", ""] == pytest.approx(TRAIN_LAT["offload"], abs=0.03)
    # Not a cycle switch: no switch operation in the run's timings, no activation counted, and
    # the first cycle starts after the calibration ended.
    engine_ops = set(report["operations"]["engine"])
    assert not engine_ops & {"sleep", "wake_up", "offload", "onload"}, engine_ops
    assert report["operations"]["activations"] == 0 and report["operations"]["deactivations"] == 0
    assert report["timeline"] == []
    assert report["cycles"][0]["start_s"] >= calibration["end_s"] > calibration["start_s"]
    assert report["samples"]["consumed"] == 3 * 8  # the run trained on every cycle after the calibration


def test_calibration_switches_0_turns_it_off(tmp_path):
    _, report = _dynres_run(tmp_path, calibration_switches=0)
    assert report["switch_calibration"] is None
    # And the engines see no switch at all: the static run never touches the hybrid or the trainer's memory.
    cl = FakeCluster(1, 1, latency=0.001)
    asyncio.run(run_fully_async(_spec(cl, calibration_switches=0)))
    touched = {r.op for r in cl.log if r.op in ("sleep", "wake_up", "offload", "onload")}
    assert touched == set()


def _spec(cl: FakeCluster, **kw) -> RunSpec:
    config = load_config(
        {
            "async_training": {
                "use_dynamic_resource_scheduling": True,
                "trigger_parameter_sync_step": 1,
                "concurrent_samples_per_replica": 4,
            },
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 4}, "rollout": {"n": 2}},
            "rollout": {"nnodes": 1, "n_gpus_per_node": 1},
            "trainer": {"nnodes": 1, "n_gpus_per_node": 1},
        }
    )
    return RunSpec(
        config=config,
        policy=load_policy("static_fully_async"),
        standalone=cl.standalone,
        hybrid=cl.hybrid,
        train_engine=cl.engine,
        prompts=fake_prompts(n=2),
        num_cycles=2,
        plugin_manager=get_plugin_manager(load_plugins=False),
        **kw,
    )


def test_calibration_puts_an_awake_hybrid_replica_to_sleep_and_leaves_the_trainer_onloaded():
    cl = FakeCluster(1, 0, latency=0.001)
    # A vLLM engine starts awake; the controller assumes its hybrid replicas asleep.
    awake = FakeReplica("h0", ReplicaKind.HYBRID, asleep=False, latency=LAT, log=cl.log)
    cl.hybrid = [awake]
    report = asyncio.run(run_fully_async(_spec(cl, calibration_switches=2)))
    calibration = report.switch_calibration
    assert calibration is not None
    assert [(s.round, s.op, s.detail) for s in calibration.steps if s.op == "sleep"] == [
        (0, "sleep", "initial"),
        (0, "sleep", ""),
        (1, "sleep", ""),
    ]
    assert len(calibration.durations("wake_up")) == 4  # 2 rounds x (weights, kv_cache)
    # What the run is left with: the hybrid asleep (no weights, no KV cache), the trainer onloaded
    # and trained on every cycle, no lifecycle violation anywhere.
    assert not awake.weights_loaded and not awake.kv_cache_allocated
    assert not cl.engine.offloaded and cl.engine.steps == 2
    assert cl.violations() == []


def test_an_awake_hybrid_replica_is_put_to_sleep_before_the_first_cycle_even_without_a_calibration():
    cl = FakeCluster(1, 0, latency=0.001)
    awake = FakeReplica("h0", ReplicaKind.HYBRID, asleep=False, latency=LAT, log=cl.log)
    cl.hybrid = [awake]
    report = asyncio.run(run_fully_async(_spec(cl, calibration_switches=0)))
    # It holds no memory from the start (the trainer trains on every cycle next to it), and the
    # report shows that one sleep, no round trip.
    first_train = next(i for i, r in enumerate(cl.log) if r.op == "train_step")
    sleeps = [r for r in cl.log[:first_train] if r.target == "h0" and r.op == "sleep" and r.event == "start"]
    assert len(sleeps) == 1
    assert not awake.weights_loaded and not awake.kv_cache_allocated
    assert report.switch_calibration is not None
    assert [(s.op, s.detail) for s in report.switch_calibration.steps if s.op != "health"] == [("sleep", "initial")]
    assert cl.engine.steps == 2 and cl.violations() == []


def test_a_replica_failing_in_the_calibration_is_quarantined_and_the_run_goes_on():
    cl = FakeCluster(1, 0, latency=0.001)
    bad = FakeReplica("h0", ReplicaKind.HYBRID, fail_on={"wake_up": RuntimeError}, log=cl.log)
    cl.hybrid = [bad]
    report = asyncio.run(run_fully_async(_spec(cl, calibration_switches=1)))
    assert report.quarantined == {"h0": "wake_up failed in the switch calibration"}
    assert [f.op for f in report.op_failures] == ["wake_up"]
    assert report.switch_calibration is not None and report.switch_calibration.durations("wake_up") == []
    assert len(report.cycles) == 2 and not cl.engine.offloaded


# ---- Interrupted (Ctrl-C) -------------------------------------------------------------------------


def test_a_run_cancelled_during_the_calibration_keeps_what_the_calibration_measured():
    cl = FakeCluster(1, 0, latency=0.001)
    slow = FakeReplica("h0", ReplicaKind.HYBRID, latency={"wake_up": 30.0}, log=cl.log)
    cl.hybrid = [slow]
    run = FullyAsyncRun(_spec(cl, calibration_switches=1))

    async def main() -> None:
        task = asyncio.ensure_future(run.run())
        while not any(r.target == "h0" and r.op == "wake_up" for r in cl.log):
            await asyncio.sleep(0.01)
        task.cancel()  # what asyncio.run does on Ctrl-C
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    report = run.interrupted_report
    assert report is not None
    assert report.stopped_early == "interrupted during the switch calibration (0 of 2 cycles done)"
    assert report.cycles == [] and report.samples.consumed == 0
    # The offload finished and is in the report; the wake-up it was waiting for is not.
    assert report.switch_calibration is not None
    assert [(s.op, s.detail) for s in report.switch_calibration.steps if s.op != "health"] == [("offload", "")]
    assert report.checkpoint is not None


def test_a_run_cancelled_between_cycles_drains_and_keeps_its_cycles():
    cl = FakeCluster(1, 1, latency=0.001)
    holder: dict[str, asyncio.Future] = {}

    def progress(cycle) -> None:
        if cycle.step == 1:
            holder["task"].cancel()

    run = FullyAsyncRun(_spec(cl, calibration_switches=1, progress=progress))

    async def main() -> None:
        holder["task"] = asyncio.ensure_future(run.run())
        with pytest.raises(asyncio.CancelledError):
            await holder["task"]

    asyncio.run(main())
    report = run.interrupted_report
    assert report is not None and report.stopped_early == "interrupted after 1 of 2 cycles"
    assert len(report.cycles) == 1 and report.switch_calibration is not None
    assert all(not r.in_flight_ids for r in cl.replicas)  # drained: nothing left generating
    assert report.checkpoint is not None


@pytest.mark.slow
def test_ctrl_c_during_the_calibration_of_dynres_run_writes_the_report_and_says_interrupted(tmp_path):
    data = copy.deepcopy(FAKE_RUN)
    data["engines"]["hybrid_options"] = {"latency": {"wake_up": 60.0}}  # the calibration waits here
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    cmd = [str(Path(sys.executable).parent / "dynres"), "run", str(cfg), "--out", str(out), "--no-plot", "-q"]
    # A terminal's Ctrl-C signals the whole foreground process group: do the same.
    proc = popen_like_a_terminal(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    try:
        started = proc.stderr.readline()  # "dynres run: 3 cycles, ..." comes before any engine starts
        assert started.startswith("dynres run:"), started + proc.stderr.read()
        # Fake engines start at once and the offload takes 0.04 s: the calibration is then in its wake-up.
        time.sleep(3.0)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert stdout == ""  # no summary: the run did not finish
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("dynres: interrupted during the switch calibration (0 of 3 cycles done); "), lines[0]
    assert f"report (what the run had) in {out / 'report.json'}" in lines[0]
    report = json.loads((out / "report.json").read_text())
    assert report["cycles"] == [] and report["stopped_early"].startswith("interrupted during the switch calibration")
    assert [(s["op"], s["detail"]) for s in report["switch_calibration"]["steps"]] == [("offload", "")]
    assert report["checkpoint"] is not None
    assert (out / "metrics.jsonl").read_text() == ""
    assert json.loads((out / "backend.json").read_text())["interrupted"] is True


# ---- The fit --------------------------------------------------------------------------------------


def test_fit_takes_switch_costs_from_the_calibration(tmp_path):
    out, _ = _dynres_run(tmp_path)
    fit = fit_scenario(read_metrics(out / "metrics.jsonl"))
    costs = fit.load().costs
    assert costs.sleep_s == pytest.approx(LAT["sleep"], abs=0.03)
    # The scenario's wake_up_s is a whole wake-up: the weights call and the kv_cache call.
    assert costs.wake_up_s == pytest.approx(2 * LAT["wake_up"], abs=0.03)
    assert costs.trainer_offload_s == pytest.approx(TRAIN_LAT["offload"], abs=0.03)
    assert costs.trainer_onload_s == pytest.approx(TRAIN_LAT["onload"], abs=0.03)
    for key in ("sleep_s", "wake_up_s", "trainer_offload_s", "trainer_onload_s"):
        assert "switch calibration" in fit.notes[f"costs.{key}"] and "[M]" in fit.notes[f"costs.{key}"]
    assert not [m for m in fit.missing if "sleep" in m or "wake_up" in m or "offload" in m]
    assert "switch calibration" in fit.to_yaml()


def test_fit_without_a_calibration_names_the_defaults_and_why(tmp_path):
    out, _ = _dynres_run(tmp_path, calibration_switches=0)
    fit = fit_scenario(read_metrics(out / "metrics.jsonl"))
    assert fit.load().costs.sleep_s == Scenario().costs.sleep_s
    assert any("sleep" in m and "no switch calibration" in m for m in fit.missing), fit.missing


def test_costs_from_wake_up_counts_both_calls_of_an_activation(tmp_path):
    out, _ = _dynres_run(tmp_path, calibration_switches=0)
    other = {"operations": {"engine": {"wake_up": {"count": 4, "total_s": 2.0, "max_s": 0.6}}}}
    fit = fit_scenario(read_metrics(out / "metrics.jsonl"), costs_from=other, costs_source="default run")
    assert fit.load().costs.wake_up_s == pytest.approx(1.0)  # 2 calls x 0.5 s per activation


def _cycle(work_tokens: float, busy: float, share: float, active: bool) -> dict:
    """A report.json cycle whose generated work is ``work_tokens`` (16-token responses, n=2)."""
    return {
        "duration_s": busy,
        "weight_sync_s": 0.0,
        "metrics": {"dynamic_resource/rollout_resource_utilization": 1.0},
        "batch": {"response_tokens_mean": 16.0},
        "samples_generated": work_tokens / (2 * (16.0 + 0.1 * 8)),  # prefill_cost default 0.1, prompt 8
        "wait_for_enough_samples_s": share * busy,
        "hybrid_active_at_start": active,
    }


def test_hybrid_speed_factor_is_solved_from_costs_from_cycles(tmp_path):
    out, _ = _dynres_run(tmp_path, calibration_switches=0, steps=4)
    run = read_metrics(out / "metrics.jsonl")
    base = fit_scenario(run)
    sc = base.load()
    assert "DEFAULT" in base.notes["workload.decode.hybrid_speed_factor"]
    c = sc.async_training.concurrent_samples_per_replica * sc.responses_per_sample
    tput = sc.workload.decode.peak_tokens_per_s * c / (c + sc.workload.decode.c_half)
    assert sc.workload.prompt_tokens == 8 and sc.num_standalone_replicas == 1 and sc.num_hybrid_replicas == 1
    # A made-up default run: a hybrid at 0.4 of a standalone replica, generating for part of each cycle.
    f = 0.4
    cycles = [_cycle(tput * 2.0 * (1 + f * s), 2.0, s, True) for s in (0.5, 0.8, 0.3)]
    cycles.append(_cycle(tput * 2.0, 2.0, 0.0, False))  # hybrid asleep: says nothing about f
    fit = fit_scenario(read_metrics(out / "metrics.jsonl"), costs_from={"cycles": cycles}, costs_source="other")
    assert fit.load().workload.decode.hybrid_speed_factor == pytest.approx(f, rel=0.01)
    note = fit.notes["workload.decode.hybrid_speed_factor"]
    assert note.startswith("[D] other") and "n=3 cycles" in note
    # A hybrid that added nothing is clamped to the scenario's range, and says so.
    flat = [_cycle(tput * 2.0, 2.0, s, True) for s in (0.5, 0.8)]
    fit0 = fit_scenario(read_metrics(out / "metrics.jsonl"), costs_from={"cycles": flat}, costs_source="other")
    assert fit0.load().workload.decode.hybrid_speed_factor == pytest.approx(0.05)
    assert "clamped" in fit0.notes["workload.decode.hybrid_speed_factor"]
