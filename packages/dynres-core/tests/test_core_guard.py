"""The one policy guard (dynres.core.guard): fallbacks, clamps, the stuck-call budget, the report."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import Any

import pytest
from core_helpers import make_ctx

from dynres.core import BoundPolicy, Policy, ScheduleContext, get_plugin_manager, hookimpl
from dynres.core.guard import CallOutcome, DaemonThreadExecutor, GuardedDecision, PolicyGuard

ONLY_HYBRID = {"num_standalone_replicas": 0}


class Scripted(Policy):
    """Answers what the test put in ``answers`` (a callable is called, so it may raise or block)."""

    name = "scripted_guard"

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self.answers: dict[str, Any] = {}

    def _answer(self, method: str, default: Any) -> Any:
        a = self.answers.get(method, default)
        return a() if callable(a) else a

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        return self._answer("should_deactivate", False)

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        return self._answer("deactivate_wait_samples", 0)

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        return self._answer("should_activate_after_step", False)


class SeenDecisions:
    """Observer of dynres_decision_made."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any, bool]] = []

    @hookimpl
    def dynres_decision_made(self, decision: str, value: Any, ctx: ScheduleContext, policy_name: str, fallback: bool):
        self.seen.append((decision, value, fallback))


class BrokenObserver:
    @hookimpl
    def dynres_decision_made(self, decision: str, value: Any, ctx: ScheduleContext, policy_name: str, fallback: bool):
        raise RuntimeError("exporter down")


class BlockingGuard(PolicyGuard):
    """The smallest front-end: block on the call's future, as verl's SyncGuard does."""

    def decide(self, method: str, ctx: ScheduleContext) -> GuardedDecision:
        blocked = self.blocked()
        if blocked is not None:
            return self.settle(method, ctx, blocked)
        fut = self.executor.submit(self.policy.decision, method, ctx)
        try:
            outcome = CallOutcome.answered(fut.result(timeout=self.timeout_s))
        except concurrent.futures.TimeoutError:
            outcome = self.timed_out(fut)
        except Exception as exc:
            outcome = CallOutcome.raised(exc)
        return self.settle(method, ctx, outcome)


def make_guard(**answers: Any) -> tuple[BlockingGuard, SeenDecisions]:
    pol = Scripted()
    pol.answers.update(answers)
    pm = get_plugin_manager(load_plugins=False)
    seen = SeenDecisions()
    pm.register(seen)
    return BlockingGuard(BoundPolicy(pol, pm), timeout_s=5.0), seen


def _boom() -> bool:
    raise ValueError("policy bug")


def test_a_valid_answer_passes_unchanged_and_is_reported() -> None:
    guard, seen = make_guard(should_deactivate=True)
    d = guard.decide("should_deactivate", make_ctx(global_steps=3))
    assert d == GuardedDecision("should_deactivate", True, "True", False, False, "", 3)
    assert seen.seen == [("should_deactivate", True, False)] and guard.fallbacks == 0


def test_a_policy_that_raises_gets_the_safe_value(caplog: pytest.LogCaptureFixture) -> None:
    guard, seen = make_guard(should_deactivate=_boom)
    with caplog.at_level(logging.WARNING):
        d = guard.decide("should_deactivate", make_ctx(global_steps=2))
    assert (d.value, d.fallback, d.raw, d.reason) == (True, True, "<ValueError>", "raised ValueError: policy bug")
    assert guard.fallbacks == 1 and seen.seen == [("should_deactivate", True, True)]
    assert caplog.messages == [
        "policy 'scripted_guard' should_deactivate at global_steps=2: raised ValueError: policy bug; "
        "using the safe value True and continuing"
    ]


@pytest.mark.parametrize(
    ("method", "answer", "safe", "reason"),
    [
        ("should_deactivate", "yes", True, "expected bool, got str"),
        ("deactivate_wait_samples", 2.5, 0, "expected int >= 0, got float"),
        ("deactivate_wait_samples", -3, 0, "expected int >= 0, got -3"),
        ("should_activate_after_step", 1, False, "expected bool, got int"),
    ],
)
def test_a_wrong_answer_gets_the_safe_value(method: str, answer: Any, safe: Any, reason: str) -> None:
    guard, seen = make_guard(**{method: answer})
    d = guard.decide(method, make_ctx())
    assert d.fallback and not d.clamped and d.value == safe and d.reason == reason and d.raw == repr(answer)
    assert seen.seen == [(method, safe, True)]


def test_the_front_end_wording_is_used(caplog: pytest.LogCaptureFixture) -> None:
    pol = Scripted()
    pol.answers["should_deactivate"] = "yes"
    log = logging.getLogger("dynres.test_guard_front_end")
    guard = BlockingGuard(
        BoundPolicy(pol, get_plugin_manager(load_plugins=False)),
        logger=log,
        subject="dynres policy",
        carry_on=", verl continues",
    )
    with caplog.at_level(logging.WARNING, logger=log.name):
        guard.decide("should_deactivate", make_ctx())
    assert [r.name for r in caplog.records] == [log.name]
    assert caplog.messages[0].startswith("dynres policy 'scripted_guard' should_deactivate at global_steps=0")
    assert caplog.messages[0].endswith("using the safe value True, verl continues")


def test_a_clamp_is_recorded_and_reported_with_the_value_acted_on(caplog: pytest.LogCaptureFixture) -> None:
    guard, seen = make_guard(deactivate_wait_samples=10**6)
    ctx = make_ctx()
    hi = ctx.step_required_samples + ctx.buffer_samples
    with caplog.at_level(logging.INFO):
        d = guard.decide("deactivate_wait_samples", ctx)
    assert (d.value, d.clamped, d.fallback, d.raw) == (hi, True, False, "1000000")
    assert d.reason == f"never wait for more than step_required + buffer = {hi}"
    assert seen.seen == [("deactivate_wait_samples", hi, False)]  # the clamped value, not the answer
    assert caplog.messages == [
        f"policy 'scripted_guard' deactivate_wait_samples: 1000000 clamped to {hi}: never wait for more than "
        f"step_required + buffer = {hi}"
    ]


def test_a_fallback_is_clamped_too_and_both_reasons_are_kept() -> None:
    guard, seen = make_guard(deactivate_wait_samples=-1, should_activate_after_step=_boom)
    ctx = make_ctx(**ONLY_HYBRID)
    wait = guard.decide("deactivate_wait_samples", ctx)
    assert (wait.value, wait.fallback, wait.clamped) == (ctx.step_required_samples, True, True)
    assert wait.reason == (
        f"expected int >= 0, got -1; only-hybrid cluster: wait for at least step_required={ctx.step_required_samples}"
    )
    act = guard.decide("should_activate_after_step", ctx)
    assert act.value is True and act.fallback and not act.clamped  # the safe value is already True here
    assert seen.seen == [("deactivate_wait_samples", ctx.step_required_samples, True), (act.method, True, True)]


def test_an_only_hybrid_refusal_to_activate_is_clamped() -> None:
    guard, _ = make_guard(should_activate_after_step=False)
    d = guard.decide("should_activate_after_step", make_ctx(**ONLY_HYBRID))
    assert d.value is True and d.clamped and not d.fallback and "only-hybrid" in d.reason


def test_an_observer_that_fails_is_logged_and_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    guard, _ = make_guard(should_deactivate=True)
    guard.pm.register(BrokenObserver())
    with caplog.at_level(logging.ERROR):
        d = guard.decide("should_deactivate", make_ctx())
    assert d.value is True and not d.fallback and guard.fallbacks == 0
    assert any("observer failed; ignored" in m for m in caplog.messages)
    assert any(r.exc_info and "exporter down" in str(r.exc_info[1]) for r in caplog.records)


def test_timed_out_calls_spend_the_budget_until_they_finish() -> None:
    release = threading.Event()
    calls: list[int] = []

    def hang() -> bool:
        calls.append(1)
        release.wait(30)
        return True

    guard, seen = make_guard(should_deactivate=hang)
    guard.timeout_s = 0.05
    guard.max_stuck_calls = 2
    try:
        first = guard.decide("should_deactivate", make_ctx())
        assert (first.fallback, first.raw, first.reason) == (True, "<timeout>", "no answer within 0.05 s")
        guard.decide("should_deactivate", make_ctx())
        third = guard.decide("should_deactivate", make_ctx())
        assert len(calls) == 2  # the budget is spent: the third decision did not call the policy
        assert (third.fallback, third.raw) == (True, "<not called>")
        assert third.reason == "not called: 2 earlier calls are still running"
    finally:
        release.set()
    for _ in range(500):  # up to 5 s: the released threads finish, which frees the budget
        if guard.blocked() is None:
            break
        time.sleep(0.01)
    scripted = guard.policy.policy
    assert isinstance(scripted, Scripted)
    scripted.answers["should_deactivate"] = False
    assert guard.decide("should_deactivate", make_ctx()).value is False
    assert guard.fallbacks == 3 and [s[2] for s in seen.seen] == [True, True, True, False]


def test_the_runner_uses_named_daemon_threads_and_delivers_every_exception() -> None:
    ex = DaemonThreadExecutor("probe-thread")
    fut = ex.submit(lambda: threading.current_thread())
    thread = fut.result(timeout=5)
    assert thread.daemon and thread.name == "probe-thread"

    def leave() -> None:
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        ex.submit(leave).result(timeout=5)


def test_a_recorded_answer_is_short() -> None:
    guard, _ = make_guard(should_deactivate=lambda: "x" * 500)
    d = guard.decide("should_deactivate", make_ctx())
    assert len(d.raw) == 80 and d.raw.endswith("...")
