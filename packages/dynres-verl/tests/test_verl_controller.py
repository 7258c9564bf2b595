"""verl's own DynamicResourceController, unmodified, driven with ``dynres:default`` and with verl's ``default``.

The rollouter and the hybrid checkpoint manager are stubs that record every call. verl's
controller and policy call ``ray.get`` on what the rollouter's ``.remote()`` returns; the stubs
return plain values and the test replaces ``ray.get`` by the identity, so no Ray session starts
(verl's code itself is not touched). The driver plays the fully-async trainer's call order of
verl 0.9.1: per collection ``should_deactivate`` (then the wait and the deactivation), after
the cycle the activation question, the hybrid weight sync and activation, the rebalance, and
``update_after_step``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import time

import pytest
import ray
from verl_helpers import CycleInput

from dynres.core import Policy, ScheduleContext
from dynres.verl._verl import schedule_module

REQUIRED, TRIGGER = 8, 2
STEP = REQUIRED * TRIGGER

# 12 sync cycles: waits and backlog, deficits and surpluses, with and without switch times.
CYCLES = [
    CycleInput((40.0, 20.0), (6, 2), 4, 1.5, 2.0),
    CycleInput((0.0, 0.0), (0, 0), 30, 1.0, 1.0),
    CycleInput((10.0, 0.0), (3, 0), 10, 0.0, 2.5),
    CycleInput((0.0, 0.0), (0, 0), 40, 2.0, 0.0),
    CycleInput((0.0, 0.0), (0, 0), 5, 1.0, 1.0),
    CycleInput((60.0, 60.0), (8, 8), 0, 3.0, 3.0),
    CycleInput((20.0, 5.0), (4, 1), 8, 0.5, 0.5),
    CycleInput((0.0, 0.0), (0, 0), 18, 1.0, 2.0),
    CycleInput((0.0, 30.0), (0, 5), 6, 1.0, 1.0),
    CycleInput((0.0, 0.0), (0, 0), 50, 4.0, 4.0),
    CycleInput((0.0, 0.0), (0, 0), 0, 1.0, 1.0),
    CycleInput((90.0, 10.0), (8, 2), 16, 2.0, 2.0),
]


class StubRollouter:
    """Stands in for verl's rollouter actor handle; each ``<method>.remote(...)`` is recorded."""

    def __init__(self, calls: list[tuple]) -> None:
        self.calls = calls

    def __getattr__(self, method: str):
        if method.startswith("__"):
            raise AttributeError(method)
        calls = self.calls

        class Method:
            @staticmethod
            def remote(*args):
                calls.append(("rollouter." + method, *args))
                if method == "get_all_hybrid_replicas":
                    return {"hybrid-0": object(), "hybrid-1": object()}
                if method == "get_standalone_replicas":
                    return [object(), object()]
                if method == "rebalance_requests":
                    return {"cleared_entries": 0, "server_loads": {}}
                if method == "get_total_train_steps":
                    return len(CYCLES)
                if method == "get_hybrid_statistics":
                    return {"monitor/queue/mq_queue_size": 3, "count/total_generated_samples": 0}

                async def done():
                    return None

                return done()  # add_replicas / remove_replicas are awaited by the controller

        return Method


class StubCheckpointManager:
    """Stands in for verl's hybrid CheckpointEngineManager; each awaited method is recorded."""

    def __init__(self, calls: list[tuple]) -> None:
        self.calls = calls
        self.replicas = ["hybrid-0", "hybrid-1"]

    def __getattr__(self, method: str):
        if method.startswith("__"):
            raise AttributeError(method)

        async def call(**kwargs):
            self.calls.append(("checkpoint." + method, *sorted(kwargs.items())))

        return call


async def drive(policy_name: str, cycles: list[CycleInput]) -> list[tuple]:
    """Play verl's trainer call order over ``cycles``; return every call the stubs and the driver saw."""
    mod = schedule_module()
    calls: list[tuple] = []
    policy = mod.build_policy(policy_name, deactivate_ratio=0.3, only_hybrid=False)
    ctrl = mod.DynamicResourceController(
        rollouter=StubRollouter(calls),
        hybrid_checkpoint_manager=StubCheckpointManager(calls),
        num_standalone_replicas=2,
        num_hybrid_replicas=2,
        policy=policy,
    )
    ctx = mod.DynamicScheduleContext(
        required_samples=REQUIRED,
        trigger_parameter_sync_step=TRIGGER,
        total_generated_samples=0,
        expected_samples=0,
        buffer_samples=0,
    )
    generated = 0
    for version, cyc in enumerate(cycles):
        for _ in range(TRIGGER):
            if ctrl.policy.should_deactivate(global_steps=version, is_hybrid_active=ctrl.is_hybrid_active, ctx=ctx):
                wait = ctrl.policy.deactivate_wait_samples(ctx)
                calls.append(("trainer.wait_for_enough_samples", wait))
                await ctrl.deactivate_hybrid_replicas(version)
                ctx.last_deactivate_duration_s += cyc.deactivate_s
        version += 1
        generated += cyc.generated
        ctx.total_generated_samples = generated
        ctx.expected_samples = STEP * version
        ctx.buffer_samples = STEP * 0.5
        ctx.step_wait_times = list(cyc.wait_times)
        ctx.step_wait_samples = list(cyc.wait_samples)
        activate = ctrl.policy.should_activate_after_step(
            global_steps=version, is_hybrid_active=ctrl.is_hybrid_active, ctx=ctx
        )
        calls.append(("trainer.should_activate", version, activate))
        if activate:
            await ctrl.sync_hybrid_weights(global_steps=version)
            await ctrl.activate_hybrid_replicas(version)
            ctrl.policy.request_rebalance(global_steps=version, ctx=ctx)
            ctx.last_activate_duration_s += cyc.activate_s
        ctrl.policy.update_after_step(global_steps=version, ctx=ctx)
        ctx.last_activate_duration_s = ctx.last_deactivate_duration_s = 0.0
    calls.append(("controller.counts", ctrl.activate_count, ctrl.deactivate_count))
    return calls


def run_drive(policy_name: str, cycles: list[CycleInput] = CYCLES) -> list[tuple]:
    with contextlib.redirect_stdout(io.StringIO()):  # verl's controller and policies print
        return asyncio.run(drive(policy_name, cycles))


@pytest.fixture(autouse=True)
def no_ray_session(monkeypatch):
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref)
    yield
    assert not ray.is_initialized()


def test_dynres_default_makes_verls_controller_do_what_verls_default_does():
    ours, theirs = run_drive("dynres:default"), run_drive("default")
    # The adapter's only extra calls are reads: the replica counts and the run's length once (at its
    # first decision, before verl's controller calls anything), the rollouter's counters at the calls
    # that start a fit step, end its training and end a cycle.
    assert ours[:4] == [
        ("rollouter.get_total_train_steps",),
        ("rollouter.get_hybrid_statistics",),
        ("rollouter.get_standalone_replicas",),
        ("rollouter.get_all_hybrid_replicas",),
    ]
    ours = ours[4:]
    stats = sum(1 for c in ours if c[0] == "rollouter.get_hybrid_statistics")
    assert stats == TRIGGER * len(CYCLES) - 1 + 2 * len(CYCLES)
    ours = [c for c in ours if c[0] not in ("rollouter.get_hybrid_statistics", "rollouter.get_total_train_steps")]
    assert ours == theirs
    # The run exercised every branch: activations, skipped activations, waits, rebalances.
    names = [c[0] for c in ours]
    assert len(CYCLES) >= 10
    assert sum(1 for c in ours if c[0] == "trainer.should_activate" and c[2] is False) >= 2
    assert sum(1 for c in ours if c[0] == "trainer.should_activate" and c[2] is True) >= 2
    assert names.count("rollouter.rebalance_requests") >= 2
    assert names.count("rollouter.remove_replicas") >= 2
    assert ours[-1][0] == "controller.counts" and ours[-1][1] >= 2


class Exploding(Policy):
    """Raises from every decision."""

    name = "exploding"

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        raise RuntimeError("boom")

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        raise RuntimeError("boom")

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        raise RuntimeError("boom")

    def update_after_step(self, ctx: ScheduleContext) -> None:
        raise RuntimeError("boom")


class Hanging(Exploding):
    """Answers activation after a long sleep (a hung policy), wrong types elsewhere."""

    name = "hanging"

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        return "yes"  # type: ignore[return-value]

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        time.sleep(30)
        return True


@pytest.mark.parametrize("cls", [Exploding, Hanging])
def test_a_broken_dynres_policy_never_stops_verls_trainer(cls, monkeypatch, caplog):
    from dynres.verl import adapter

    monkeypatch.setattr(adapter, "DECISION_TIMEOUT_S", 0.2)
    monkeypatch.setattr(adapter, "resolve_policy_class", lambda name: cls)
    schedule_module().base._policy_registry["dynres:broken-test"] = adapter.adapter_class("broken-test")
    try:
        with caplog.at_level(logging.WARNING, logger="dynres.verl"):
            calls = run_drive("dynres:broken-test", CYCLES[:4])
    finally:
        del schedule_module().base._policy_registry["dynres:broken-test"]
    # Safe values: activation never (standalone replicas exist), so nothing to deactivate.
    assert [c for c in calls if c[0] == "trainer.should_activate"] == [
        ("trainer.should_activate", step, False) for step in range(1, 5)
    ]
    assert calls[-1] == ("controller.counts", 0, 0)
    warned = [r.getMessage() for r in caplog.records]
    assert any("safe value" in m and ("boom" in m or "no answer within" in m) for m in warned), warned
