"""The analytic lower bound on hand-made cases."""

from __future__ import annotations

import pytest

from dynres.runtime.sim.bound import BoundInputs, CycleWork, lower_bound, lower_bound_naive


def _inputs(**kw: object) -> BoundInputs:
    base: dict[str, object] = dict(
        trainer_gpus=8,
        rollout_gpus=8,
        train_step_s=[10.0] * 4,
        sample_work=[1000.0] * 8,
        sample_critical_work=[100.0] * 8,
        peak_tokens_per_gpu_s=100.0,
        lone_request_tokens_per_s=50.0,
        required_samples=2,
    )
    base.update(kw)
    return BoundInputs(**base)  # type: ignore[arg-type]  # test inputs built from a dict of mixed values


def test_training_bound_case() -> None:
    # 40 s of training; 8000 units / 100 per GPU-s = 80 GPU-s -> (8*40 + 80)/16 = 25 s.
    # First batch: 2nd smallest critical path 100/50 = 2 s vs cheapest work 2000/(16*100) = 1.25 s.
    lb = lower_bound(_inputs())
    assert lb.terms["train_serial"] == pytest.approx(40.0)
    assert lb.terms["gpu_seconds"] == pytest.approx(25.0)
    assert lb.terms["first_batch_then_train"] == pytest.approx(42.0)
    assert lb.total_s == pytest.approx(42.0) and lb.binding == "first_batch_then_train"


def test_generation_bound_case() -> None:
    # Lots of generation: 8 samples x 100k units = 8000 GPU-s -> (8*40 + 8000)/16 = 520 s.
    lb = lower_bound(_inputs(sample_work=[100_000.0] * 8))
    assert lb.terms["gpu_seconds"] == pytest.approx(520.0)
    assert lb.total_s == pytest.approx(520.0) and lb.binding == "gpu_seconds"


def test_more_gpus_never_raise_the_bound_and_trainer_gpus_cannot_train_elsewhere() -> None:
    small = lower_bound(_inputs(sample_work=[100_000.0] * 8))
    big = lower_bound(_inputs(sample_work=[100_000.0] * 8, rollout_gpus=24))
    assert big.total_s < small.total_s
    # Rollout GPUs never train: with no generation at all, the bound is the serial training.
    lb = lower_bound(_inputs(sample_work=[0.0] * 8, sample_critical_work=[0.0] * 8, rollout_gpus=1000))
    assert lb.total_s == pytest.approx(40.0)


def test_critical_path_uses_kth_smallest_sample() -> None:
    lb = lower_bound(_inputs(sample_critical_work=[1000.0, 50.0, 200.0, 5000.0] + [9999.0] * 4))
    # k = 2: the 2nd smallest critical path is 200 units at 50 units/s = 4 s.
    assert lb.terms["first_batch_then_train"] == pytest.approx(4.0 + 40.0)


def test_invalid_inputs() -> None:
    with pytest.raises(ValueError):
        lower_bound(_inputs(trainer_gpus=0))
    with pytest.raises(ValueError):
        lower_bound(_inputs(sample_work=[1.0]))


# ---- The tight bound (docs/simulator.md, "The tight lower bound") ------------------------------


def _tight(**kw: object) -> BoundInputs:
    # 2 cycles x 2 fit steps of 10 s, 4 samples per cycle (k = 2, staleness 0.5: max_required 6),
    # export 1 s + standalone load 2 s per sync, activation 5 s, deactivation 3 s.
    base: dict[str, object] = dict(
        train_step_s=[10.0] * 4,
        sample_work=[1000.0] * 8,
        sample_critical_work=[100.0] * 8,
        cycles=[CycleWork([10.0, 10.0], [1000.0] * 4, [100.0] * 4)] * 2,
        step_required_samples=4,
        max_required_samples=6,
        export_s=1.0,
        standalone_update_s=2.0,
        activate_s=5.0,
        deactivate_s=3.0,
    )
    base.update(kw)
    return _inputs(**base)


def test_tight_bound_counts_every_sync_when_training_binds() -> None:
    # Whole run: 2 syncs (start-up, cycle 1) + 3 fit steps before the last = 36 s; standalone
    # generation 8000 / 800 + 2 x 2 s paused = 14 s; + last fit 10 + sync 3 = 49 s.
    # Per cycle: (10 + 3 start-up sync) + 10 + 3 = 26, then 10 + 10 + 3 = 23: 49 s as well.
    lb = lower_bound(_tight())
    assert lb.terms["whole_run"] == pytest.approx(49.0)
    assert lb.terms["per_cycle"] == pytest.approx(49.0)
    assert lb.total_s == pytest.approx(49.0)
    naive = lower_bound_naive(_tight())
    assert naive.total_s == pytest.approx(42.0) and "whole_run" not in naive.terms


def test_tight_bound_takes_the_better_of_no_hybrid_and_hybrid() -> None:
    # 800k units: standalone alone need 1000 s (+ 4 s paused); with the 8 trainer GPUs at half
    # speed after one switch (8 s): (8000 + 8 x 4 + 4 x (36 + 8)) / 12 = 684 s; + 13 = 697 s.
    work = {"sample_work": [100_000.0] * 8, "cycles": [CycleWork([10.0, 10.0], [100_000.0] * 4, [100.0] * 4)] * 2}
    lb = lower_bound(_tight(hybrid_gpus=8, hybrid_speed_factor=0.5, **work))
    assert lb.terms["whole_run"] == pytest.approx(697.0)
    # Per cycle: cycle 1 (400k) (4000 + 8 x 2 + 4 x 21) / 12 + 13; cycle 2 (2 of 4 samples admitted
    # after its sync, 200k) (2000 + 4 x 18) / 12 + 13.
    assert lb.terms["per_cycle"] == pytest.approx(4100 / 12 + 13 + 2072 / 12 + 13)
    assert lb.total_s == pytest.approx(697.0) and lb.binding == "whole_run"
    # Without hybrid replicas (dynamic scheduling off) only the standalone alternative remains.
    assert lower_bound(_tight(**work)).terms["whole_run"] == pytest.approx(1004.0 + 13.0)
    # A hybrid GPU as fast as a standalone one can only lower the bound.
    faster = lower_bound(_tight(hybrid_gpus=8, hybrid_speed_factor=1.0, **work))
    assert faster.terms["whole_run"] < lb.terms["whole_run"]


def test_only_hybrid_cluster_pays_a_switch_per_cycle() -> None:
    # No standalone replica (no load time per sync): chain 2 x 1 + 30 = 32 s, two switches 16 s,
    # hybrid generation 8000 / 800 = 10 s -> 58 s; + last fit 10 + export 1 = 69 s.
    lb = lower_bound(_tight(rollout_gpus=0, hybrid_gpus=8, standalone_update_s=0.0))
    assert lb.terms["whole_run"] == pytest.approx(69.0)
    # Staleness >= 1 (max_required 8): cycle 2 may be produced entirely before its sync, so only
    # the first cycle must switch.
    lb = lower_bound(_tight(rollout_gpus=0, hybrid_gpus=8, standalone_update_s=0.0, max_required_samples=8))
    assert lb.terms["whole_run"] == pytest.approx(69.0 - 8.0)


def test_per_cycle_admission_rule_uses_the_cheapest_admitted_samples() -> None:
    # Cycle 2 of 4 samples, max_required 5: at most 1 crosses the sync, 3 are admitted after it;
    # their work is the 3 smallest (10 + 20 + 30 units x 1000), critical path the 3rd smallest.
    cyc2 = CycleWork([10.0, 10.0], [40_000.0, 10_000.0, 30_000.0, 20_000.0], [900.0, 100.0, 800.0, 700.0])
    inp = _tight(cycles=[CycleWork([10.0, 10.0], [1000.0] * 4, [100.0] * 4), cyc2], max_required_samples=5)
    lb = lower_bound(inp)
    # Window of cycle 2: max(chain 10, 60_000 / 800 = 75, critical 800 / 50 = 16) = 75.
    assert lb.terms["per_cycle"] == pytest.approx(26.0 + 75.0 + 13.0)
