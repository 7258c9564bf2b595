"""The dynamic_resource/* formulas, checked against numbers worked out by hand."""

from __future__ import annotations

import pytest

from dynres.core.errors import DynresError, MetricsError
from dynres.core.metrics import (
    CLUSTER_UTILIZATION,
    METRIC_KEYS,
    MQ_SIZE,
    ROLLOUT_UTILIZATION,
    TRAIN_ALLOCATED_TIME,
    TRAIN_COMPUTE_TIME,
    TRAIN_UTILIZATION,
    MicroStep,
    RolloutPoint,
    cluster_resource_utilization,
    cycle_metrics,
    hybrid_rollout_fraction,
    rollout_capacity,
    rollout_resource_utilization,
    train_compute_time,
    train_resource_utilization,
)

approx = pytest.approx


def test_metric_keys_are_verls():
    assert METRIC_KEYS == (
        "dynamic_resource/train_resource_utilization",
        "dynamic_resource/rollout_resource_utilization",
        "dynamic_resource/resource_utilization",
        "dynamic_resource/mq_size",
        "dynamic_resource/train_compute_time_s",
        "dynamic_resource/train_allocated_time_s",
    )


# ---- Train ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phases", "compute"),
    [
        ({}, 0.0),
        ({"update_actor": 5.0}, 5.0),
        (
            {"reward": 1, "old_log_prob": 2, "ref": 3, "values": 4, "adv": 5, "update_critic": 6, "update_actor": 7},
            28.0,
        ),
        # param_sync, activation and waiting are allocated time, not compute
        ({"update_actor": 5.0, "param_sync": 3.0, "activate": 1.0, "wait": 9.0}, 5.0),
    ],
)
def test_train_compute_time_counts_only_compute_phases(phases, compute):
    assert train_compute_time(phases) == compute


def test_train_utilization_is_a_ratio_of_sums():
    # step 1: 8 s compute of 12 s; step 2: 4 s of 8 s -> 12 / 20 (not the mean of 2/3 and 1/2)
    assert train_resource_utilization([8.0, 4.0], [12.0, 8.0]) == approx(0.6)


def test_train_utilization_with_nothing_allocated_is_zero():
    assert train_resource_utilization([], []) == 0.0
    assert train_resource_utilization([1.0], [0.0]) == 0.0


def test_train_utilization_needs_parallel_lists():
    with pytest.raises(MetricsError, match="compute_s has 2 entries but allocated_s has 1"):
        train_resource_utilization([1.0, 2.0], [3.0])


# ---- Rollout ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("servers", "per_replica", "max_required", "cap"),
    [(3, 16, 100, 48), (8, 16, 100, 100), (0, 16, 100, 0), (2, 16, 0, 0)],
)
def test_rollout_capacity(servers, per_replica, max_required, cap):
    assert rollout_capacity(servers, per_replica, max_required) == cap


def test_rollout_utilization_with_capacity_changing_mid_window():
    points = [
        RolloutPoint(t=0.0, active=10, capacity=16),  # 10 s, 10 of 16 busy
        RolloutPoint(t=10.0, active=40, capacity=32),  # 5 s, hybrid joined, 40 clipped to 32
        RolloutPoint(t=15.0, active=5, capacity=0),  # 5 s with no capacity: skipped
        RolloutPoint(t=20.0, active=20, capacity=32),  # 10 s, 20 of 32
    ]
    used = 10 * 10 + 5 * 32 + 10 * 20  # 460
    weight = 10 * 16 + 5 * 32 + 10 * 32  # 640
    assert rollout_resource_utilization(points, end_t=30.0) == approx(used / weight)
    assert used / weight == approx(0.71875)


def test_zero_capacity_intervals_carry_no_weight():
    with_gap = [RolloutPoint(0.0, 8, 16), RolloutPoint(5.0, 8, 0), RolloutPoint(100.0, 8, 16)]
    without = [RolloutPoint(0.0, 8, 16), RolloutPoint(5.0, 8, 16)]
    # 5 s + 5 s at 8/16 either way; the 95 s with capacity 0 neither adds nor dilutes
    assert rollout_resource_utilization(with_gap, 105.0) == approx(0.5)
    assert rollout_resource_utilization(without, 10.0) == approx(0.5)


def test_negative_capacity_is_skipped_like_zero():
    # A bogus negative capacity must neither subtract weight nor count as use.
    points = [RolloutPoint(0.0, 8, 16), RolloutPoint(5.0, 8, -16), RolloutPoint(10.0, 8, 16)]
    assert rollout_resource_utilization(points, 15.0) == approx(0.5)


def test_zero_length_intervals_carry_no_weight():
    points = [RolloutPoint(0.0, 0, 16), RolloutPoint(0.0, 16, 16), RolloutPoint(4.0, 4, 16)]
    assert rollout_resource_utilization(points, 8.0) == approx((4 * 16 + 4 * 4) / (8 * 16))


def test_negative_active_counts_as_idle():
    assert rollout_resource_utilization([RolloutPoint(0.0, -3, 8)], 1.0) == 0.0


@pytest.mark.parametrize(
    "points",
    [[], [RolloutPoint(0.0, 5, 0)], [RolloutPoint(3.0, 5, 8)]],
    ids=["no points", "no capacity", "no time"],
)
def test_no_weight_gives_zero(points):
    assert rollout_resource_utilization(points, 3.0) == 0.0


def test_points_out_of_time_order_are_an_error():
    with pytest.raises(MetricsError, match="time order"):
        rollout_resource_utilization([RolloutPoint(5.0, 1, 1), RolloutPoint(2.0, 1, 1)], 9.0)
    with pytest.raises(MetricsError, match="end_t"):
        rollout_resource_utilization([RolloutPoint(5.0, 1, 1)], 4.0)


def test_metrics_errors_are_dynres_and_value_errors():
    assert issubclass(MetricsError, DynresError) and issubclass(MetricsError, ValueError)


# ---- Cluster ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wait", "step", "x"), [(3.0, 12.0, 0.25), (20.0, 10.0, 1.0), (0.0, 10.0, 0.0), (5.0, 0.0, 0.0)]
)
def test_hybrid_rollout_fraction(wait, step, x):
    assert hybrid_rollout_fraction(wait, step) == approx(x)


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        (0.25, (0.75 * 8 * 0.6 + (0.25 * 8 + 24) * 0.8) / 32),  # 0.7625
        (0.0, (8 * 0.6 + 24 * 0.8) / 32),  # 0.75
        (1.0, 0.8),  # hybrid GPUs count as rollout the whole cycle
        (1.5, 0.8),  # clipped to 1
        (-0.2, 0.75),  # clipped to 0
    ],
)
def test_cluster_utilization(x, expected):
    assert cluster_resource_utilization(0.6, 0.8, hybrid_gpus=8, standalone_gpus=24, x=x) == approx(expected)


def test_cluster_utilization_edge_shapes():
    assert cluster_resource_utilization(0.6, 0.8, 0, 0, 0.5) == 0.0
    assert cluster_resource_utilization(0.6, 0.8, 0, 16, 0.5) == approx(0.8)  # no hybrid GPUs
    assert cluster_resource_utilization(0.6, 0.8, 16, 0, 0.0) == approx(0.6)  # colocated, no wait


# ---- A whole cycle ----------------------------------------------------------------------------


def test_cycle_metrics_end_to_end():
    steps = [
        MicroStep(
            phase_times={"reward": 1.0, "old_log_prob": 2.0, "update_actor": 5.0, "param_sync": 3.0},
            allocated_s=12.0,
            wait_s=2.0,
            step_s=10.0,
            queue_size_after=5,
        ),
        MicroStep(
            phase_times={"ref": 1.0, "values": 1.0, "adv": 0.5, "update_critic": 1.5},
            allocated_s=8.0,
            wait_s=1.0,
            step_s=2.0,
            queue_size_after=9,
        ),
    ]
    points = [
        RolloutPoint(0.0, 10, 16),
        RolloutPoint(10.0, 40, 32),
        RolloutPoint(15.0, 5, 0),
        RolloutPoint(20.0, 20, 32),
    ]
    m = cycle_metrics(steps, points, 30.0, hybrid_gpus=8, standalone_gpus=24)
    assert set(m) == set(METRIC_KEYS)
    assert m[TRAIN_COMPUTE_TIME] == approx(12.0)
    assert m[TRAIN_ALLOCATED_TIME] == approx(20.0)
    assert m[TRAIN_UTILIZATION] == approx(0.6)
    assert m[ROLLOUT_UTILIZATION] == approx(0.71875)
    # x = (2 + 1) / (10 + 2) = 0.25
    assert m[CLUSTER_UTILIZATION] == approx((0.75 * 8 * 0.6 + (0.25 * 8 + 24) * 0.71875) / 32)
    assert m[CLUSTER_UTILIZATION] == approx(0.696484375)
    assert m[MQ_SIZE] == 9.0  # the queue right after the last fit step, not the first or a sum
    assert all(isinstance(v, float) for v in m.values())


def test_cycle_metrics_with_no_steps():
    m = cycle_metrics([], [], 0.0, hybrid_gpus=8, standalone_gpus=8)
    assert m == {k: 0.0 for k in METRIC_KEYS}
