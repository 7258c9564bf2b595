"""The `default` policy, method by method, table-driven from the reference algorithm.

Every context below has 25 samples x 4 collections = 100 samples per cycle unless stated, so a
ratio r means a target backlog of 100 r samples.
"""

from __future__ import annotations

import json
import math

import pytest
from policies_helpers import ReferenceDefault, make_ctx

from dynres.core.errors import PolicyParamsError, PolicyValidationError
from dynres.policies.default import DefaultPolicy

approx = pytest.approx


def with_state(ratio=0.3, switch_costs=(), per_sample_time_s=1000.0, **params) -> DefaultPolicy:
    policy = DefaultPolicy(params)
    policy.load_state_dict({"ratio": ratio, "switch_costs": list(switch_costs), "per_sample_time_s": per_sample_time_s})
    return policy


def test_reference_constants_are_the_defaults():
    p = DefaultPolicy().params
    assert p.deactivate_ratio == 0.3
    assert (p.ratio_increase_min, p.ratio_increase_max) == (0.02, 0.1)
    assert p.ratio_decrease_step == 0.02
    assert p.switch_cost_window == 3
    assert p.switch_cost_fallback_s == 10.0
    assert p.initial_per_sample_time_s == 1000.0
    fresh = DefaultPolicy()
    assert fresh.ratio == 0.3 and fresh.switch_cost() == 10.0 and fresh.per_sample_time_s == 1000.0


# ---- should_deactivate ----------------------------------------------------------------------


@pytest.mark.parametrize("active", [True, False])
@pytest.mark.parametrize("standalone", [0, 2])
def test_should_deactivate_is_is_hybrid_active(active, standalone):
    ctx = make_ctx(is_hybrid_active=active, num_standalone_replicas=standalone)
    assert DefaultPolicy().should_deactivate(ctx) is active


# ---- deactivate_wait_samples ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ratio", "required", "trigger", "wait"),
    [
        (0.3, 25, 4, 30),
        (0.3, 8, 4, 9),  # 9.6 truncates
        (0.5, 5, 3, 7),  # 7.5 truncates
        (0.0, 25, 4, 0),
        (1.0, 25, 4, 100),
        (0.999, 1, 1, 0),
    ],
)
def test_deactivate_wait_samples_is_ratio_of_a_cycle(ratio, required, trigger, wait):
    ctx = make_ctx(required_samples=required, trigger_parameter_sync_step=trigger)
    got = with_state(ratio=ratio).deactivate_wait_samples(ctx)
    assert got == wait and type(got) is int


def test_deactivate_wait_samples_follows_the_adapted_ratio():
    policy = DefaultPolicy({"deactivate_ratio": 0.5})
    policy.update_after_step(make_ctx(step_wait_times=(1.0,), step_wait_samples=(10,)))
    assert policy.deactivate_wait_samples(make_ctx()) == 60  # 0.5 + 0.1


def test_a_subnormal_wait_keeps_the_estimate_positive_and_the_state_loadable():
    # 5e-324 s over 3 samples rounds to 0.0 s per sample; hypothesis found it.
    policy = DefaultPolicy()
    policy.update_after_step(make_ctx(step_wait_times=(5e-324,), step_wait_samples=(3,)))
    assert policy.per_sample_time_s > 0
    DefaultPolicy().load_state_dict(policy.state_dict())


# ---- should_activate_after_step: the cost/benefit gate ------------------------------------------

GATE = [
    # (case, state: ratio / switch costs / stored s-per-sample, surplus, wait times, wait samples, expected)
    ("first cycle: pessimistic 1000 s/sample beats the 10 s fallback", (0.3, (), 1000.0), 0, (), (), True),
    ("gap of one sample is enough at 1000 s/sample", (0.3, (), 1000.0), 29, (), (), True),
    ("no gap", (0.3, (), 1000.0), 30, (), (), False),
    ("backlog above target: negative gap counts as 0", (0.3, (), 1000.0), 45, (), (), False),
    ("measured 0.5 s/sample, gap 21 -> 10.5 s > 10 s", (0.3, (), 1000.0), 9, (2.0, 3.0), (4, 6), True),
    ("measured 0.5 s/sample, gap 20 -> 10 s is not > 10 s", (0.3, (), 1000.0), 10, (2.0, 3.0), (4, 6), False),
    ("wait time without waited samples keeps the estimate", (0.3, (), 1000.0), 29, (5.0,), (0,), True),
    ("waited samples without wait time keep the estimate", (0.3, (), 1000.0), 29, (0.0,), (5,), True),
    ("stored estimate used when the cycle did not wait", (0.3, (), 0.5), 10, (), (), False),
    ("stored estimate used when the cycle did not wait (over)", (0.3, (), 0.5), 9, (), (), True),
    ("fresh measurement replaces the stored estimate", (0.3, (), 0.01), 9, (2.0, 3.0), (4, 6), True),
    ("mean of 3 switch costs 13.33 s: gap 26 x 0.5 = 13 s", (0.3, (8.0, 12.0, 20.0), 0.5), 4, (), (), False),
    ("mean of 3 switch costs 13.33 s: gap 27 x 0.5 = 13.5 s", (0.3, (8.0, 12.0, 20.0), 0.5), 3, (), (), True),
    ("one switch cost of 2 s: gap 5 x 0.5 = 2.5 s", (0.3, (2.0,), 0.5), 25, (), (), True),
    ("ratio 0 and no surplus: no gap", (0.0, (), 1000.0), 0, (), (), False),
    ("ratio 0 with a deficit: gap from the deficit", (0.0, (), 1000.0), -1, (), (), True),
    ("ratio 1, deficit 40: gap 140", (1.0, (), 0.1), -40, (), (), True),
]


@pytest.mark.parametrize(
    ("state", "surplus", "times", "samples", "expected"),
    [case[1:] for case in GATE],
    ids=[case[0] for case in GATE],
)
def test_activation_gate(state, surplus, times, samples, expected):
    ratio, costs, per_sample = state
    policy = with_state(ratio, costs, per_sample)
    ctx = make_ctx(
        total_generated_samples=500 + surplus, expected_samples=500, step_wait_times=times, step_wait_samples=samples
    )
    reference = ReferenceDefault(ratio)
    reference.switch_costs = list(costs)
    reference.per_sample_time_s = per_sample
    assert reference.should_activate_after_step(ctx) is expected  # the table is the reference's
    assert policy.should_activate_after_step(ctx) is expected


def test_switch_cost_window_keeps_the_last_three():
    policy = DefaultPolicy()
    durations = [(1.0, 3.0), (2.0, 6.0), (5.0, 7.0), (8.0, 12.0)]  # 4, 8, 12, 20 s
    for step, (act, deact) in enumerate(durations, start=1):
        policy.update_after_step(
            make_ctx(global_steps=step, last_activate_duration_s=act, last_deactivate_duration_s=deact)
        )
    assert policy.state_dict()["switch_costs"] == [8.0, 12.0, 20.0]
    assert policy.switch_cost() == approx(40.0 / 3)


def test_zero_switch_duration_is_not_recorded():
    policy = DefaultPolicy()
    policy.update_after_step(make_ctx(last_activate_duration_s=0.0, last_deactivate_duration_s=0.0))
    assert policy.state_dict()["switch_costs"] == []
    assert policy.switch_cost() == 10.0
    policy.update_after_step(make_ctx(last_activate_duration_s=0.0, last_deactivate_duration_s=2.5))
    assert policy.state_dict()["switch_costs"] == [2.5]


def test_switch_cost_window_and_fallback_are_params():
    policy = DefaultPolicy({"switch_cost_window": 1, "switch_cost_fallback_s": 0.0})
    assert policy.switch_cost() == 0.0
    for step, cost in enumerate([4.0, 9.0], start=1):
        policy.update_after_step(make_ctx(global_steps=step, last_activate_duration_s=cost))
    assert policy.switch_cost() == 9.0


def test_per_sample_estimate_is_learned_by_update_after_step():
    policy = DefaultPolicy()
    policy.update_after_step(make_ctx(step_wait_times=(6.0, 2.0), step_wait_samples=(3, 1)))
    assert policy.per_sample_time_s == approx(2.0)
    # A cycle without waiting keeps it.
    policy.update_after_step(make_ctx(global_steps=2))
    assert policy.per_sample_time_s == approx(2.0)


# ---- update_after_step: ratio adaptation ------------------------------------------------------

ADAPT = [
    # (start ratio, wait samples per collection, expected ratio)
    (0.3, (0, 0, 0, 0), 0.28),  # no wait: -0.02
    (0.3, (), 0.28),
    (0.3, (1, 0, 0, 0), 0.32),  # 1/100 = 0.01 is clipped up to 0.02
    (0.3, (2, 0, 0, 0), 0.32),  # exactly the lower clip
    (0.3, (2, 3, 0, 0), 0.35),  # 5/100 inside the clip range
    (0.3, (4, 3, 2, 0), 0.39),
    (0.3, (10, 0, 0, 0), 0.40),  # exactly the upper clip
    (0.3, (25, 25, 0, 0), 0.40),  # 0.5 is clipped down to 0.1
    (0.95, (25, 25, 25, 25), 1.0),  # capped at 1
    (1.0, (1, 0, 0, 0), 1.0),
    (0.02, (0, 0, 0, 0), 0.0),
    (0.0, (), 0.0),  # floor (the reference would reach -0.02)
    (0.01, (), 0.0),
]


@pytest.mark.parametrize(("start", "samples", "expected"), ADAPT)
def test_ratio_adaptation(start, samples, expected):
    policy = with_state(ratio=start)
    ctx = make_ctx(step_wait_times=tuple(1.0 for _ in samples), step_wait_samples=samples)
    policy.update_after_step(ctx)
    assert policy.ratio == approx(expected, abs=1e-12)
    reference = ReferenceDefault(start)
    reference.update_after_step(ctx)
    assert max(0.0, reference.ratio) == approx(expected, abs=1e-12)


def test_ratio_adaptation_uses_the_params():
    policy = DefaultPolicy({"ratio_increase_min": 0.05, "ratio_increase_max": 0.2, "ratio_decrease_step": 0.1})
    policy.update_after_step(make_ctx(step_wait_times=(1.0,), step_wait_samples=(1,)))
    assert policy.ratio == approx(0.35)
    policy.update_after_step(make_ctx(step_wait_times=(1.0,), step_wait_samples=(50,)))
    assert policy.ratio == approx(0.55)
    policy.update_after_step(make_ctx())
    assert policy.ratio == approx(0.45)


def test_skip_at_global_steps_zero():
    policy = DefaultPolicy()
    policy.update_after_step(
        make_ctx(
            global_steps=0,
            step_wait_times=(4.0,),
            step_wait_samples=(10,),
            last_activate_duration_s=3.0,
            last_deactivate_duration_s=4.0,
        )
    )
    assert policy.ratio == 0.3
    assert policy.state_dict()["switch_costs"] == []
    # The reference's gate stores the estimate at step 0 too, so ours keeps it (parity).
    assert policy.per_sample_time_s == approx(0.4)


# ---- Only-hybrid clusters ---------------------------------------------------------------------


def only_hybrid(**kw):
    return make_ctx(num_standalone_replicas=0, **kw)


@pytest.mark.parametrize("surplus", [-100, 0, 30, 1000])
def test_only_hybrid_always_activates(surplus):
    policy = with_state(ratio=0.3, switch_costs=(1e6,), per_sample_time_s=1e-6)
    ctx = only_hybrid(total_generated_samples=1000 + surplus, expected_samples=1000)
    assert policy.should_activate_after_step(ctx) is True


def test_only_hybrid_does_not_adapt():
    policy = DefaultPolicy()
    before = policy.state_dict()
    for step in range(1, 5):
        policy.update_after_step(
            only_hybrid(
                global_steps=step, step_wait_times=(5.0,), step_wait_samples=(10,), last_activate_duration_s=2.0
            )
        )
        policy.update_after_step(only_hybrid(global_steps=step))
    assert policy.state_dict() == before


def test_only_hybrid_waits_for_a_whole_cycle_like_the_reference():
    # The reference forces its ratio to 1 in an only-hybrid cluster: int(100 x 1.0) samples.
    policy = DefaultPolicy()
    assert policy.should_deactivate(only_hybrid(is_hybrid_active=True)) is True
    assert policy.deactivate_wait_samples(only_hybrid(is_hybrid_active=True)) == 100
    assert policy.deactivate_wait_samples(only_hybrid(is_hybrid_active=True, required_samples=7)) == 28


def test_should_rebalance_says_yes():
    assert DefaultPolicy().should_rebalance(make_ctx()) is True
    assert DefaultPolicy().should_rebalance(only_hybrid()) is True


# ---- Deliberate differences from the reference (see the DefaultPolicy docstring) --------------


def test_difference_1_ratio_floor_at_zero():
    ours, reference = DefaultPolicy(), ReferenceDefault()
    idle = make_ctx(total_generated_samples=10_000, expected_samples=100)
    for step in range(1, 21):
        ctx = make_ctx(global_steps=step)
        ours.update_after_step(ctx)
        reference.update_after_step(ctx)
    assert reference.ratio == approx(-0.1)  # the reference drifts below zero ...
    assert reference.deactivate_wait_samples(idle) == -10  # ... and asks for a negative wait
    assert ours.ratio == 0.0
    assert ours.deactivate_wait_samples(idle) == 0
    # One waiting cycle lifts ours off the floor; the reference is still below zero.
    waited = make_ctx(global_steps=21, step_wait_times=(1.0,), step_wait_samples=(5,))
    ours.update_after_step(waited)
    reference.update_after_step(waited)
    assert ours.ratio == approx(0.05)
    assert reference.ratio == approx(-0.05)


def test_difference_1_floor_is_a_param():
    policy = DefaultPolicy({"min_ratio": 0.1})
    for step in range(1, 30):
        policy.update_after_step(make_ctx(global_steps=step))
    assert policy.ratio == 0.1


def test_difference_2_decisions_are_side_effect_free():
    ours, reference = DefaultPolicy(), ReferenceDefault()
    waited = make_ctx(
        total_generated_samples=509, expected_samples=500, step_wait_times=(2.0, 3.0), step_wait_samples=(4, 6)
    )
    before = ours.state_dict()
    for _ in range(3):
        assert ours.should_deactivate(waited) is False
        assert ours.deactivate_wait_samples(waited) == 30
        assert ours.should_activate_after_step(waited) is True
        assert ours.should_rebalance(waited) is True
    assert ours.state_dict() == before

    # The reference's gate stores the estimate, so asking changes later answers.
    quiet = make_ctx(total_generated_samples=509, expected_samples=500)
    reference.should_activate_after_step(waited)
    assert reference.per_sample_time_s == 0.5
    assert ours.should_activate_after_step(quiet) is True  # still 1000 s/sample
    assert reference.should_activate_after_step(quiet) is True
    near = make_ctx(total_generated_samples=510, expected_samples=500)
    assert ours.should_activate_after_step(near) is True
    assert reference.should_activate_after_step(near) is False  # 20 x 0.5 = 10 s, not > 10 s


@pytest.mark.parametrize(
    ("surplus", "changes"),
    [(29, True), (30, False), (45, False)],
    ids=["positive gap: refreshed", "zero gap: kept", "negative gap: kept"],
)
def test_difference_2_estimate_changes_only_after_a_positive_gap(surplus, changes):
    # The reference refreshes its estimate inside the activation gate, which it reaches only
    # when the backlog gap (0.3 x 100 - surplus) is positive; ours must store the same value.
    ours, reference = DefaultPolicy(), ReferenceDefault()
    waited = make_ctx(
        total_generated_samples=500 + surplus,
        expected_samples=500,
        step_wait_times=(2.0, 3.0),
        step_wait_samples=(4, 6),
    )
    assert ours.should_activate_after_step(waited) == reference.should_activate_after_step(waited)
    ours.update_after_step(waited)
    reference.update_after_step(waited)
    assert ours.per_sample_time_s == reference.per_sample_time_s == (0.5 if changes else 1000.0)


def test_difference_2_call_order_gives_the_reference_values():
    # activate then update with the same context: the next cycle sees the same estimate.
    ours, reference = DefaultPolicy(), ReferenceDefault()
    waited = make_ctx(step_wait_times=(2.0, 3.0), step_wait_samples=(4, 6))
    assert ours.should_activate_after_step(waited) == reference.should_activate_after_step(waited)
    ours.update_after_step(waited)
    reference.update_after_step(waited)
    assert ours.per_sample_time_s == reference.per_sample_time_s == 0.5


def test_difference_3_state_round_trip_through_json_gives_identical_decisions():
    trained = DefaultPolicy({"deactivate_ratio": 0.4})
    history = [
        make_ctx(
            global_steps=1,
            step_wait_times=(3.0, 1.0),
            step_wait_samples=(6, 2),
            last_activate_duration_s=4.0,
            last_deactivate_duration_s=2.0,
        ),
        make_ctx(global_steps=2, last_activate_duration_s=3.0),
        make_ctx(global_steps=3, step_wait_times=(0.5,), step_wait_samples=(1,), last_deactivate_duration_s=7.5),
    ]
    for ctx in history:
        trained.should_activate_after_step(ctx)
        trained.update_after_step(ctx)

    saved = json.loads(json.dumps(trained.state_dict()))
    resumed = DefaultPolicy({"deactivate_ratio": 0.4})
    assert resumed.state_dict() != trained.state_dict()
    resumed.load_state_dict(saved)
    assert resumed.state_dict() == trained.state_dict()
    assert vars(resumed) == vars(trained)

    for step in range(4, 16):
        ctx = make_ctx(
            global_steps=step,
            total_generated_samples=100 * step + (step * 7) % 40 - 20,
            expected_samples=100 * step,
            step_wait_times=(0.25 * (step % 3),),
            step_wait_samples=((step * 5) % 4,),
            last_activate_duration_s=float(step % 5),
            is_hybrid_active=step % 2 == 0,
        )
        for method in (
            "should_deactivate",
            "deactivate_wait_samples",
            "should_activate_after_step",
            "should_rebalance",
        ):
            assert getattr(resumed, method)(ctx) == getattr(trained, method)(ctx), (step, method)
        resumed.update_after_step(ctx)
        trained.update_after_step(ctx)
        assert resumed.state_dict() == trained.state_dict()


def test_state_is_plain_json():
    state = with_state(ratio=0.25, switch_costs=(1.0, 2.0), per_sample_time_s=0.5).state_dict()
    assert state == {"ratio": 0.25, "switch_costs": [1.0, 2.0], "per_sample_time_s": 0.5}
    assert json.loads(json.dumps(state, allow_nan=False)) == state


# ---- load_state_dict and params validation ----------------------------------------------------


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({"ratio": 0.3}, "do not match"),
        ({"ratio": 0.3, "switch_costs": [], "per_sample_time_s": 1.0, "extra": 1}, "do not match"),
        ({"ratio": 1.5, "switch_costs": [], "per_sample_time_s": 1.0}, "outside \\[0, 1\\]"),
        ({"ratio": -0.1, "switch_costs": [], "per_sample_time_s": 1.0}, "outside \\[0, 1\\]"),
        ({"ratio": math.nan, "switch_costs": [], "per_sample_time_s": 1.0}, "outside \\[0, 1\\]"),
        ({"ratio": "high", "switch_costs": [], "per_sample_time_s": 1.0}, "must be numbers"),
        ({"ratio": 0.3, "switch_costs": 5, "per_sample_time_s": 1.0}, "must be numbers"),
        ({"ratio": 0.3, "switch_costs": [-1.0], "per_sample_time_s": 1.0}, "switch_costs"),
        ({"ratio": 0.3, "switch_costs": [math.inf], "per_sample_time_s": 1.0}, "switch_costs"),
        ({"ratio": 0.3, "switch_costs": [], "per_sample_time_s": 0.0}, "per_sample_time_s"),
        ({"ratio": 0.3, "switch_costs": [], "per_sample_time_s": math.nan}, "per_sample_time_s"),
    ],
)
def test_bad_state_is_rejected_and_leaves_the_policy_alone(state, match):
    policy = with_state(ratio=0.5, switch_costs=(3.0,), per_sample_time_s=2.0)
    before = policy.state_dict()
    with pytest.raises(PolicyValidationError, match=match):
        policy.load_state_dict(state)
    assert policy.state_dict() == before


def test_state_longer_than_the_window_keeps_the_newest():
    policy = with_state(switch_costs=(1.0, 2.0, 3.0, 4.0, 5.0))
    assert policy.state_dict()["switch_costs"] == [3.0, 4.0, 5.0]


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"ratio_increase_min": 0.2, "ratio_increase_max": 0.1}, "ratio_increase_min must be <="),
        ({"min_ratio": 0.5, "deactivate_ratio": 0.3}, "min_ratio must be <= deactivate_ratio"),
        ({"deactivate_ratio": 1.2}, "deactivate_ratio"),
        ({"switch_cost_window": 0}, "switch_cost_window"),
        ({"initial_per_sample_time_s": 0.0}, "initial_per_sample_time_s"),
        ({"switch_cost_fallback_s": math.inf}, "switch_cost_fallback_s"),
        ({"initial_per_sample_time_s": math.inf}, "initial_per_sample_time_s"),
        ({"deactivate_raito": 0.5}, "did you mean 'deactivate_ratio'"),
    ],
)
def test_bad_params_are_named(params, match):
    with pytest.raises(PolicyParamsError, match=match):
        DefaultPolicy(params)
