"""The analytic lower bound on hand-made cases."""

from __future__ import annotations

import pytest

from dynres.runtime.sim.bound import BoundInputs, lower_bound


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
