"""The policy conformance suite: one plain function per property, usable with or without pytest.

Each ``check_<property>(policy)`` takes a policy given as an instance, a class, a registered
name or a ``"module:Class"`` path, returns ``None`` when the property holds, and raises
:class:`PolicyCheckFailure` (an ``AssertionError`` and a ``DynresError``) whose message says what
was expected, what came back, and the context that triggered it.

Three ways to run them::

    from dynres.testkit.checks import check_policy, parametrize_with_checks

    check_policy(MyPolicy)                       # anywhere: raises on the first report of failures

    @parametrize_with_checks([MyPolicy, MyPolicy({"floor": 0.2})])
    def test_my_policy(policy, check):           # in pytest: one test per check, ids check_x[name]
        check(policy)

    $ pytest --dynres-policy my_policy           # the pytest plugin, no test file needed

When an instance is given, checks work on deep copies of it, so its params (and any state it
already has) are what is tested; a class or name is built with default params.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import inspect
import json
import math
import pickle
import statistics
import time
import unittest
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dynres.core.answers import ANSWERS, check_answer
from dynres.core.context import ScheduleContext
from dynres.core.errors import (
    ConfigError,
    DynresError,
    PolicyImportError,
    PolicyValidationError,
    did_you_mean,
)
from dynres.core.policy import CYCLE_METHODS, Policy, validate_policy_class
from dynres.core.requests import REQUEST_METHODS, RequestContext, check_length_answer, check_route_answer

__all__ = [
    "BASELINE_MARGIN",
    "BASELINE_POLICY",
    "END_TO_END_CHECKS",
    "LATENCY_MAX_S",
    "LATENCY_MEDIAN_S",
    "CheckResult",
    "CheckSkipped",
    "PolicyCheckFailure",
    "PolicyCheckWarning",
    "all_checks",
    "all_policies",
    "budget_kwargs",
    "check_constructible_with_defaults",
    "check_context_not_mutated",
    "check_decision_latency",
    "check_decision_types",
    "check_decisions_do_not_change_state",
    "check_deterministic",
    "check_e2e_not_slower_than_baseline",
    "check_e2e_samples_accounted",
    "check_e2e_training_finishes",
    "check_extra_admission_bounds",
    "check_grace_bounds",
    "check_no_clock_reads",
    "check_no_global_random",
    "check_only_hybrid_never_deadlocks",
    "check_params_reject_unknown_keys",
    "check_picklable",
    "check_policy",
    "check_policy_api",
    "check_request_answers",
    "check_state_dict_json_round_trip",
    "check_wait_bounds",
    "parametrize_with_checks",
    "policy_label",
    "yield_policy_checks",
]

PolicySpec = Policy | type[Policy] | str
"""Ways to name the policy under test: an instance, a class, a registered name, ``module:Class``."""

LATENCY_MEDIAN_S = 1e-3
"""Budget for the median time of one decision call (seconds)."""

LATENCY_MAX_S = 50e-3
"""Budget for the slowest decision call (seconds)."""

REQUEST_LATENCY_MEDIAN_S = 0.2e-3
"""Budget for the median time of one request decision, ``predict_length`` or ``route`` (seconds):
the balancer asks them for every request, inline on the event loop, so at a few hundred requests
a second this holds the loop under a tenth of the time."""

EXAMPLES = 40
"""Generated context sequences per property check, after the edge runs (each holds 1-8 contexts;
``max_examples`` of a check, ``--dynres-examples`` of the pytest plugin)."""

UNKNOWN_PARAM = "dynres_check_no_such_param"
"""The key check_params_reject_unknown_keys adds to a policy's params."""


# ---- Failures and results ----------------------------------------------------------------------


class PolicyCheckFailure(DynresError, AssertionError):
    """A policy broke the property a conformance check tests; the message says how."""

    def __init__(self, check: str, policy: str, message: str) -> None:
        """Build ``"check[policy]: message"``."""
        super().__init__(f"{check}[{policy}]: {message}")
        self.check = check
        self.policy = policy
        self.detail = message

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by the three parts, so failures cross process boundaries (pytest-xdist, pools)."""
        return (type(self), (self.check, self.policy, self.detail))


class CheckSkipped(unittest.SkipTest):
    """A check does not apply here (e.g. the simulator is not installed); pytest reports a skip."""


class PolicyCheckWarning(UserWarning):
    """Emitted by ``check_policy(..., on_fail="warn")`` for each failed check."""


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check on one policy, as returned by :func:`check_policy`."""

    check: str
    """Name of the check function."""
    policy: str
    """Label of the policy (see :func:`policy_label`)."""
    status: Literal["passed", "failed", "xfail", "xpass", "skipped"]
    """``xfail``/``xpass``: the check was listed in ``expected_failed_checks``."""
    message: str = ""
    """The failure or skip message."""
    seconds: float = 0.0
    """Wall time the check took."""


# ---- Naming the policy under test ----------------------------------------------------------------


@dataclass(frozen=True)
class _Subject:
    """The resolved policy under test: its class, a label, and the instance to copy if one was given."""

    cls: type[Policy]
    label: str
    template: Policy | None

    def fresh(self, check: str) -> Policy:
        """A new policy to test: a deep copy of the given instance, or the class with defaults."""
        try:
            if self.template is not None:
                return copy.deepcopy(self.template)
            return self.cls()
        except Exception as exc:
            how = "deepcopy of the given instance" if self.template is not None else f"{self.cls.__qualname__}()"
            if self.template is None and check != "check_constructible_with_defaults":
                # One root cause, one failure: check_constructible_with_defaults reports it; the
                # checks that only need a policy to test are skipped instead of failing alike.
                raise CheckSkipped(f"{how} failed; check_constructible_with_defaults says why") from exc
            raise PolicyCheckFailure(
                check, self.label, f"could not build the policy to test: {how} raised {_exc(exc)}"
            ) from exc

    def fail(self, check: str, message: str) -> PolicyCheckFailure:
        """A failure of ``check`` for this policy."""
        return PolicyCheckFailure(check, self.label, message)


def _import_unvalidated(spec: str) -> object:
    # Import without validate_policy_class so that check_policy_api, not the import, reports an
    # API defect of a class found by name or path.
    from importlib.metadata import EntryPoint

    from dynres.core.loading import POLICIES_GROUP, import_policy_path, policy_entry, resolve_by_plugin

    if ":" not in spec:
        entry = policy_entry(spec)  # raises PolicyNotFoundError listing the installed names
        try:
            return EntryPoint(name=entry.name, value=entry.value, group=POLICIES_GROUP).load()
        except Exception as exc:
            raise PolicyImportError(
                f"policy {spec!r} from distribution {entry.distribution!r} ({entry.value}) "
                f"failed to import: {_exc(exc)}; fix or reinstall {entry.distribution!r}"
            ) from exc
    # A name a plugin claims (verl:<name> with dynres-verl) comes back already validated.
    claimed = resolve_by_plugin(spec)
    if claimed is not None:
        return claimed
    return import_policy_path(spec)


def _subject(policy: PolicySpec | _Subject) -> _Subject:
    if isinstance(policy, _Subject):
        return policy
    if isinstance(policy, Policy):
        return _Subject(type(policy), policy_label(policy), policy)
    obj: object = policy
    if isinstance(policy, str):
        obj = _import_unvalidated(policy.strip())
    if not (isinstance(obj, type) and issubclass(obj, Policy)):
        raise PolicyValidationError(
            f"{policy!r} is not a dynres policy; pass a Policy instance, a Policy subclass, a "
            "registered policy name or a 'module:Class' path"
        )
    label = policy.strip() if isinstance(policy, str) else policy_label(obj)
    return _Subject(obj, label, None)


def policy_label(policy: PolicySpec) -> str:
    """Short label used in check ids: the name as given, or the class's name plus non-default params."""
    if isinstance(policy, str):
        return policy.strip()
    if isinstance(policy, type):
        return getattr(policy, "name", "") or policy.__qualname__
    base = getattr(policy, "name", "") or type(policy).__qualname__
    try:
        changed = policy.params.model_dump(exclude_defaults=True)
    except Exception:  # a broken Params must not break labelling; the checks will report it
        changed = {}
    if not changed:
        return base
    return base + "(" + ", ".join(f"{k}={v!r}" for k, v in sorted(changed.items())) + ")"


# ---- Helpers shared by the checks ----------------------------------------------------------------


def _exc(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _show(ctx: ScheduleContext) -> str:
    """A context as a short constructor call (non-default fields only), to paste into a test."""
    fields = ctx.model_dump(exclude_defaults=True, exclude=set(_computed_fields()))
    args = ", ".join(f"{k}={v!r}" for k, v in fields.items())
    return f"ScheduleContext({args})"


def _computed_fields() -> tuple[str, ...]:
    return tuple(ScheduleContext.model_computed_fields)


def _call(subject: _Subject, check: str, policy: Policy, method: str, ctx: ScheduleContext) -> Any:
    try:
        return getattr(policy, method)(ctx)
    except PolicyCheckFailure:
        raise
    except Exception as exc:
        raise subject.fail(
            check, f"{method} raised {_exc(exc)}; a policy must answer every valid context. Context: {_show(ctx)}"
        ) from exc


def _cycle(subject: _Subject, check: str, policy: Policy, ctx: ScheduleContext) -> tuple[Any, ...]:
    """Call the cycle methods in the dynres runtime's order; return what each answered."""
    return tuple(_call(subject, check, policy, m, ctx) for m in CYCLE_METHODS)


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> tuple[str, Any, Any] | None:
    for method, x, y in zip(CYCLE_METHODS, a, b, strict=True):
        if type(x) is not type(y) or x != y:
            return method, x, y
    return None


# Successful shrinks hypothesis may make on one failure (its own limit is 500, or five minutes).
# Each shrink of a context sequence (about 40 numbers) costs a tenth of a second or more, so 500
# made one failing check take two minutes; after 80 the reported context has lost the cycles and
# numbers that do not matter (measured on the broken policies of dynres.testkit.broken_policies).
MAX_SHRINKS = 80


@contextlib.contextmanager
def _shrink_limit(limit: int) -> Iterator[None]:
    """Lower hypothesis's cap on successful shrinks for one run; restored afterwards.

    The cap is a module constant of hypothesis's engine, not a setting: where a hypothesis
    version lacks it, shrinking keeps hypothesis's own limit (slower, same verdicts).
    """
    from hypothesis.internal.conjecture import engine

    old = getattr(engine, "MAX_SHRINKS", None)
    if not isinstance(old, int):
        yield
        return
    engine.MAX_SHRINKS = min(old, limit)
    try:
        yield
    finally:
        engine.MAX_SHRINKS = old


def _for_all(
    strategy: Any,
    body: Callable[[Any], None],
    *,
    max_examples: int,
    shrink: bool = True,
    examples: Sequence[Any] = (),
) -> None:
    """Run ``body`` on examples of ``strategy`` with reproducible, side-effect-free settings.

    The example database is off and generation is derandomized, so the same policy gets the
    same verdict and the same reported context on every run and machine. A failure is shrunk
    (fewer cycles, smaller numbers), at most ``MAX_SHRINKS`` times, before it is reported, so the
    context in the message is a small one to paste into a test and a failing check ends in seconds.
    ``examples`` run first, whatever ``max_examples`` is (hypothesis explicit examples, not shrunk).
    """
    from hypothesis import HealthCheck, Phase, example, given, settings
    from hypothesis.errors import Flaky

    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
    test = given(strategy)(body)
    for value in reversed(examples):  # hypothesis runs the last one applied first
        test = example(value)(test)
    runner = settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=phases,
        report_multiple_bugs=False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )(test)
    try:
        with _shrink_limit(MAX_SHRINKS):
            runner()
    except PolicyCheckFailure as exc:
        # Hypothesis attaches the whole generated run as a note; the message already shows the
        # context that failed, and pages of repr would bury it.
        if hasattr(exc, "__notes__"):
            del exc.__notes__
        raise
    except Flaky as exc:
        # The failure did not repeat when hypothesis replayed the same input: report the
        # original failure and say that the policy's answers vary.
        inner = [e for e in getattr(exc, "exceptions", ()) if isinstance(e, PolicyCheckFailure)]
        if not inner:
            raise
        first = inner[0]
        raise PolicyCheckFailure(
            first.check,
            first.policy,
            first.detail + " (the same input did not fail again when replayed, so the policy's "
            "answers are not repeatable)",
        ) from exc


def _sequences(min_size: int = 1, only_hybrid: bool | None = None) -> Any:
    from dynres.testkit.strategies import context_sequences

    return context_sequences(min_size=min_size, max_size=8, only_hybrid=only_hybrid)


def _for_all_runs(
    body: Callable[[list[ScheduleContext]], None],
    *,
    max_examples: int,
    min_size: int = 1,
    only_hybrid: bool | None = None,
    shrink: bool = True,
) -> None:
    """Run ``body`` on the edge runs (:func:`dynres.testkit.strategies.edge_runs`), then on
    ``max_examples`` generated runs of ``min_size`` to 8 consecutive cycles."""
    from dynres.testkit.strategies import edge_runs

    # Built anew for every check: a policy that mutates its contexts must not reach the next check.
    edges = [run for run in edge_runs(only_hybrid=only_hybrid) if len(run) >= min_size]
    _for_all(_sequences(min_size, only_hybrid), body, max_examples=max_examples, shrink=shrink, examples=edges)


def _sorted_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=False, default=repr)


# ---- The checks ----------------------------------------------------------------------------------


def check_policy_api(policy: PolicySpec) -> None:
    """The class passes dynres's API validation: name, Params model, method signatures, no hooks."""
    subject = _subject(policy)
    try:
        validate_policy_class(subject.cls)
    except PolicyValidationError as exc:
        raise subject.fail("check_policy_api", f"the class does not satisfy the policy API: {exc}") from None


def check_constructible_with_defaults(policy: PolicySpec) -> None:
    """``Cls()``, ``Cls(None)`` and ``Cls({})`` all build a policy whose params equal ``Cls.Params()``."""
    name = "check_constructible_with_defaults"
    subject = _subject(policy)
    cls = subject.cls
    for args, shown in (((), "()"), ((None,), "(None)"), (({},), "({})")):
        call = f"{cls.__qualname__}{shown}"
        try:
            built = cls(*args)
        except Exception as exc:
            raise subject.fail(
                name,
                f"{call} raised {_exc(exc)}; a policy must build with no params, so give every Params field a default",
            ) from exc
        params = getattr(built, "params", None)
        if not isinstance(params, cls.Params):
            raise subject.fail(
                name,
                f"{call}.params is {params!r} ({type(params).__name__}); expected an "
                f"instance of {cls.__qualname__}.Params (call super().__init__(params))",
            )
        try:
            defaults = cls.Params()
        except Exception as exc:
            raise subject.fail(name, f"{cls.__qualname__}.Params() raised {_exc(exc)}") from exc
        if params != defaults:
            raise subject.fail(name, f"{call}.params is {params!r}; expected the defaults {defaults!r}")


def check_params_reject_unknown_keys(policy: PolicySpec) -> None:
    """An unknown params key raises a dynres error (PolicyParamsError) that names the key."""
    name = "check_params_reject_unknown_keys"
    subject = _subject(policy)
    known = subject.fresh(name).params.model_dump()
    bad = {**known, UNKNOWN_PARAM: 1}
    try:
        built = subject.cls(bad)
    except DynresError as exc:
        if UNKNOWN_PARAM not in str(exc):
            raise subject.fail(name, f"the error for unknown param {UNKNOWN_PARAM!r} does not name it: {exc}") from None
        return
    except Exception as exc:
        raise subject.fail(
            name,
            f"unknown param {UNKNOWN_PARAM!r} raised {_exc(exc)}; expected a "
            "dynres.core.errors.PolicyParamsError naming the key (let Policy.__init__ validate)",
        ) from exc
    raise subject.fail(
        name,
        f"{subject.cls.__qualname__}({{..., {UNKNOWN_PARAM!r}: 1}}) was accepted "
        f"(params={getattr(built, 'params', None)!r}); expected PolicyParamsError, because a "
        "typo in a config must not be ignored (keep extra='forbid' and pass params to "
        "Policy.__init__ unfiltered)",
    )


def check_decision_types(policy: PolicySpec, *, max_examples: int = EXAMPLES) -> None:
    """Over generated runs, every method answers without raising and with its documented type."""
    name = "check_decision_types"
    subject = _subject(policy)

    def body(contexts: list[ScheduleContext]) -> None:
        pol = subject.fresh(name)
        for ctx in contexts:
            for method in CYCLE_METHODS:
                value = _call(subject, name, pol, method, ctx)
                # The runtime's own checker: what it accepts (numpy scalars included) passes here.
                if not check_answer(method, value).type_ok:
                    spec = ANSWERS[method]
                    raise subject.fail(
                        name,
                        f"{method} returned {value!r} of type {type(value).__name__}; "
                        f"expected {spec.kind} ({spec.hint}). Context: {_show(ctx)}",
                    )

    _for_all_runs(body, max_examples=max_examples)


def check_request_answers(policy: PolicySpec, *, max_examples: int = EXAMPLES) -> None:
    """After every cycle of generated runs, ``predict_length`` answers a finite number of tokens
    ``>= 0`` or None and ``route`` one of the request's routable replica ids or None, without raising."""
    from dynres.testkit.strategies import edge_requests

    name = "check_request_answers"
    subject = _subject(policy)
    if all(getattr(subject.cls, m) is getattr(Policy, m) for m in REQUEST_METHODS):
        return  # the base class's None: the built-in routing, nothing of the policy's to check

    def body(contexts: list[ScheduleContext]) -> None:
        pol = subject.fresh(name)
        for ctx in contexts:
            _cycle(subject, name, pol, ctx)
            for request in edge_requests(ctx):
                _check_request(subject, name, pol, request, ctx)

    _for_all_runs(body, max_examples=max_examples)


def _check_request(subject: _Subject, check: str, pol: Policy, request: RequestContext, ctx: ScheduleContext) -> None:
    where = f"Request: {request!r}; after the cycle of context {_show(ctx)}"
    for method in REQUEST_METHODS:
        try:
            value = getattr(pol, method)(request)
        except Exception as exc:
            raise subject.fail(
                check, f"{method} raised {_exc(exc)}; the runtime then routes by load (return None for that). {where}"
            ) from exc
        if method == "predict_length":
            tokens, reason = check_length_answer(value)
            if not reason and tokens is not None:
                request = dataclasses.replace(request, predicted_tokens=tokens)
        else:
            _, reason = check_route_answer(value, request.replicas)
        if reason:
            raise subject.fail(check, f"{method} {reason}; the runtime would ignore it and route by load. {where}")


def check_wait_bounds(policy: PolicySpec, *, max_examples: int = EXAMPLES) -> None:
    """``deactivate_wait_samples`` stays within ``[0, step_required_samples + buffer_samples]``."""
    _check_answer_range(
        policy,
        "check_wait_bounds",
        "deactivate_wait_samples",
        upper=lambda ctx: ctx.step_required_samples + ctx.buffer_samples,
        expected="a count in [0, step_required_samples + buffer_samples]",
        why_above="the queue never holds more than a cycle's samples plus the staleness buffer, so the "
        "trainer would wait for samples that cannot come",
        max_examples=max_examples,
    )


def check_grace_bounds(policy: PolicySpec, *, max_examples: int = EXAMPLES) -> None:
    """``deactivate_grace_s`` is a finite number of seconds in ``[0, last_cycle_time_s]``."""
    _check_answer_range(
        policy,
        "check_grace_bounds",
        "deactivate_grace_s",
        upper=lambda ctx: ctx.last_cycle_time_s,
        expected="seconds in [0, last_cycle_time_s]",
        why_above="a grace is taken from the trainer's time, and the runtime never lets it outlast the latest "
        "cycle (last_cycle_time_s; 0 before one was measured)",
        max_examples=max_examples,
    )


def check_extra_admission_bounds(policy: PolicySpec, *, max_examples: int = EXAMPLES) -> None:
    """``admit_extra_samples`` is a count in ``[0, step_required_samples]``."""
    _check_answer_range(
        policy,
        "check_extra_admission_bounds",
        "admit_extra_samples",
        upper=lambda ctx: ctx.step_required_samples,
        expected="a count in [0, step_required_samples]",
        why_above="more than one cycle's batch beyond the staleness budget would be trained more than a cycle "
        "staler than the threshold allows, and the runtime clamps it",
        max_examples=max_examples,
    )


def _check_answer_range(
    policy: PolicySpec,
    name: str,
    method: str,
    *,
    upper: Callable[[ScheduleContext], float],
    expected: str,
    why_above: str,
    max_examples: int,
) -> None:
    # One shape for the range checks: every context of a run is asked ``method``, whose answer must
    # lie in [0, upper(ctx)]; the activation and update calls between them advance the policy as
    # the runtime would.
    subject = _subject(policy)

    def body(contexts: list[ScheduleContext]) -> None:
        pol = subject.fresh(name)
        for ctx in contexts:
            raw = _call(subject, name, pol, method, ctx)
            checked = check_answer(method, raw)
            # A wrong type is check_decision_types' finding; a float count is still range-checked.
            if checked.type_ok or isinstance(raw, float):
                value, limit = checked.value, upper(ctx)
                if checked.type_ok and checked.reason:
                    why = checked.reason  # below 0 or not finite, in the answer table's words
                elif value < 0:
                    why = "a negative answer is meaningless"
                else:
                    why = why_above if value > limit else ""
                if why:
                    raise subject.fail(
                        name,
                        f"{method} returned {value!r}; expected {expected} = [0, {limit}] ({why}). "
                        f"Context: {_show(ctx)}",
                    )
            for later in ("should_activate_after_step", "update_after_step"):
                _call(subject, name, pol, later, ctx)

    _for_all_runs(body, max_examples=max_examples)


def check_deterministic(policy: PolicySpec, *, max_examples: int = EXAMPLES) -> None:
    """Two copies in the same state (``copy.deepcopy``) give the same answers to the same context."""
    name = "check_deterministic"
    subject = _subject(policy)
    found: list[PolicyCheckFailure] = []

    def body(contexts: list[ScheduleContext]) -> None:
        if found:
            return
        pol = subject.fresh(name)
        for index, ctx in enumerate(contexts):
            try:
                twin = copy.deepcopy(pol)
            except Exception as exc:
                found.append(subject.fail(name, f"copy.deepcopy(policy) raised {_exc(exc)}"))
                return
            first = _cycle(subject, name, pol, ctx)
            second = _cycle(subject, name, twin, ctx)
            diff = _first_difference(first, second)
            if diff:
                method, x, y = diff
                found.append(
                    subject.fail(
                        name,
                        f"{method} answered {x!r} and then {y!r} for the same context "
                        f"and equal state (a deepcopy, after {index} earlier cycles); decisions "
                        "must depend only on the policy's state and the context (no clocks, "
                        f"random numbers or globals). Context: {_show(ctx)}",
                    )
                )
                return

    # Record-then-raise instead of raising inside hypothesis: a random policy would not fail the
    # same way on replay, and the first disagreement is already the clearest report.
    _for_all_runs(body, max_examples=max_examples, shrink=False)
    if found:
        raise found[0]


def check_context_not_mutated(policy: PolicySpec, *, max_examples: int = EXAMPLES) -> None:
    """No method changes the context it was given (the runtime hands the same object on)."""
    name = "check_context_not_mutated"
    subject = _subject(policy)

    def body(contexts: list[ScheduleContext]) -> None:
        pol = subject.fresh(name)
        for ctx in contexts:
            for method in CYCLE_METHODS:
                before = dict(ctx.__dict__)
                _call(subject, name, pol, method, ctx)
                after = dict(ctx.__dict__)
                if before != after:
                    changed = sorted(
                        set(before) ^ set(after) | {k for k in before if k in after and before[k] != after[k]}
                    )
                    shown = ", ".join(
                        f"{k}: {before.get(k, '<absent>')!r} -> {after.get(k, '<absent>')!r}" for k in changed
                    )
                    raise subject.fail(
                        name,
                        f"{method} changed the context ({shown}); a policy must treat the "
                        "context as read-only and keep its own state on self. Context before: "
                        f"{_show(ScheduleContext.model_construct(**before))}",
                    )

    _for_all_runs(body, max_examples=max_examples)


# ---- Reads of clocks and global random generators --------------------------------------------

_CLOCK_NAMES = frozenset(
    {
        "time",
        "time_ns",
        "monotonic",
        "monotonic_ns",
        "perf_counter",
        "perf_counter_ns",
        "process_time",
        "process_time_ns",
        "thread_time",
        "thread_time_ns",
        "clock_gettime",
        "clock_gettime_ns",
    }
)
"""Functions of the ``time`` module that read a clock."""

_DATETIME_NOW = frozenset({"now", "utcnow", "today"})
"""``datetime.datetime`` / ``datetime.date`` class methods that read the clock."""


_TOOL_MODULES = ("hypothesis", "_pytest", "pytest", "coverage", "pluggy")
"""Modules whose reads inside a watched call come from the test tools, not the policy."""

_NUMPY_HINT = "np.random.random(), .rand(), .choice() ...: the process-global generator"


def _numpy_global() -> Any:
    """numpy's process-global RandomState (behind ``np.random.random()`` etc.), or None without numpy."""
    try:
        from numpy.random import mtrand
    except ImportError:
        return None
    return mtrand._rand


def _numpy_draws(generator: Any) -> Any:
    # The Mersenne Twister's position and key change with every draw. numpy's Cython methods are
    # invisible to a profile hook, so a draw is found by its effect on the generator instead.
    if generator is None:
        return None
    state = generator.get_state(legacy=False)
    return state["state"]["pos"], state["state"]["key"].tobytes(), state["has_gauss"]


def _forbidden_read(fn: Any) -> tuple[str, str] | None:
    """``("clock"|"random", "time.time()")`` when the C function ``fn`` reads a clock or global randomness."""
    import datetime
    import random

    owner = getattr(fn, "__self__", None)
    name = getattr(fn, "__name__", "")
    if owner is time and name in _CLOCK_NAMES:
        return "clock", f"time.{name}()"
    if owner in (datetime.datetime, datetime.date) and name in _DATETIME_NOW:
        return "clock", f"datetime.{owner.__name__}.{name}()"
    if name == "urandom" and getattr(owner, "__name__", "") in ("os", "posix", "nt"):
        return "random", "os.urandom() (also behind secrets, uuid4 and random.SystemRandom)"
    if owner is not None and owner is random._inst:  # behind random.random() etc.
        return "random", f"random.{name}() (the process-global generator)"
    return None


def _call_watched(policy: Policy, method: str, ctx: ScheduleContext) -> tuple[Any, list[tuple[str, str]]]:
    """Call ``policy.method(ctx)`` while recording every clock or global-random read it makes.

    A profile hook sees each C call, so it finds ``time.time()`` however the policy imported it
    (``from time import time``, an alias, a helper in another module), unlike patching names.
    """
    import sys

    reads: list[tuple[str, str]] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        # Test-tool callbacks can run inside the call (hypothesis times garbage collections from
        # gc.callbacks, even while the collector is paused here); their reads are not the policy's.
        if event == "c_call" and not frame.f_globals.get("__name__", "").startswith(_TOOL_MODULES):
            found = _forbidden_read(arg)
            if found is not None and found not in reads:
                reads.append(found)

    numpy_rng = _numpy_global()
    numpy_before = _numpy_draws(numpy_rng)
    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        answer = getattr(policy, method)(ctx)
    finally:
        sys.setprofile(previous)
    if numpy_rng is not None and _numpy_draws(numpy_rng) != numpy_before:
        reads.append(
            ("random", "numpy.random (np.random.random(), .rand(), .choice() ...: the process-global generator)")
        )
    return answer, reads


def _check_reads(policy: PolicySpec, name: str, kind: str, why: str, max_examples: int) -> None:
    subject = _subject(policy)

    def body(contexts: list[ScheduleContext]) -> None:
        pol = subject.fresh(name)
        for ctx in contexts:
            for method in CYCLE_METHODS:
                try:
                    _, reads = _call_watched(pol, method, ctx)
                except Exception as exc:
                    raise subject.fail(
                        name,
                        f"{method} raised {_exc(exc)}; a policy must answer every valid context. Context: {_show(ctx)}",
                    ) from exc
                hits = [what for k, what in reads if k == kind]
                if hits:
                    raise subject.fail(name, f"{method} called {', '.join(hits)}; {why}. Context: {_show(ctx)}")

    _for_all_runs(body, max_examples=max_examples)


def check_no_clock_reads(policy: PolicySpec, *, max_examples: int = EXAMPLES) -> None:
    """No method reads a clock (``time.time``/``monotonic``/``perf_counter``..., ``datetime.now``/``today``)."""
    _check_reads(
        policy,
        "check_no_clock_reads",
        "clock",
        "a policy must not read a clock: the simulator runs on virtual time and a resumed run "
        "replays decisions, so a clock makes answers differ between runs; use ctx.now (seconds "
        "on the run's clock) and the context's measured durations instead",
        max_examples,
    )


def check_no_global_random(policy: PolicySpec, *, max_examples: int = EXAMPLES) -> None:
    """No method draws from a process-global random generator (``random``, ``numpy.random``, ``os.urandom``)."""
    _check_reads(
        policy,
        "check_no_global_random",
        "random",
        "a policy must not use process-global randomness: its answers then depend on whatever "
        "else drew numbers before and cannot be reproduced or restored; keep a seeded "
        "random.Random(params.seed) on self and save what it needs in state_dict",
        max_examples,
    )


# ---- State changed inside a decision -----------------------------------------------------------

DECISION_METHODS: tuple[str, ...] = tuple(m for m in CYCLE_METHODS if m != "update_after_step")
"""The methods that only answer; ``update_after_step`` is the one place a policy changes its state."""

_MISSING = object()


def _state_diff(before: Any, after: Any, path: str, depth: int = 0) -> str | None:  # noqa: C901  # a branch per kind of value
    """The first place where two snapshots of a policy's attributes differ, as ``path: a -> b``."""
    if depth > 8:
        return None
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        for key in list(before) + [k for k in after if k not in before]:
            b, a = before.get(key, _MISSING), after.get(key, _MISSING)
            if b is _MISSING or a is _MISSING:
                shown = lambda v: "<absent>" if v is _MISSING else repr(v)  # noqa: E731  # local formatting
                return f"{path}.{key}: {shown(b)} -> {shown(a)}"
            found = _state_diff(b, a, f"{path}.{key}", depth + 1)
            if found:
                return found
        return None
    if isinstance(before, list | tuple) and isinstance(after, list | tuple) and type(before) is type(after):
        if len(before) != len(after):
            return f"{path}: {before!r} -> {after!r}"
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            found = _state_diff(b, a, f"{path}[{i}]", depth + 1)
            if found:
                return found
        return None
    if type(before) is not type(after):
        return f"{path}: {before!r} -> {after!r}"
    if hasattr(before, "__dict__") and not isinstance(before, type):
        return _state_diff(vars(before), vars(after), path, depth + 1)
    try:
        same = bool(before == after) or (before != before and after != after)  # NaN stays NaN
    except Exception:  # arrays and other odd types: compare their repr
        same = repr(before) == repr(after)
    return None if same else f"{path}: {before!r} -> {after!r}"


def _snapshot(policy: Policy) -> Any:
    try:
        return copy.deepcopy(vars(policy))
    except Exception:  # not copyable: compare what repr shows (check_picklable reports the cause)
        return {k: repr(v) for k, v in vars(policy).items()}


def check_decisions_do_not_change_state(policy: PolicySpec, *, max_examples: int = EXAMPLES) -> None:
    """``should_deactivate``, ``deactivate_wait_samples``, ``should_activate_after_step`` and
    ``should_rebalance`` leave the policy's attributes as they were; only ``update_after_step`` changes them.
    """
    name = "check_decisions_do_not_change_state"
    subject = _subject(policy)

    def body(contexts: list[ScheduleContext]) -> None:
        pol = subject.fresh(name)
        for ctx in contexts:
            for method in CYCLE_METHODS:
                before = _snapshot(pol) if method in DECISION_METHODS else None
                _call(subject, name, pol, method, ctx)
                if before is None:
                    continue
                diff = _state_diff(before, _snapshot(pol), "self")
                if diff:
                    raise subject.fail(
                        name,
                        f"{method} changed the policy's state ({diff}); a decision method must only "
                        "answer: the runtime may call it again, skip it after a timeout or replace its "
                        "answer, so state changed there drifts from what happened. Record what you need "
                        f"in update_after_step, which runs exactly once per cycle. Context: {_show(ctx)}",
                    )

    _for_all_runs(body, max_examples=max_examples)


def _restore_from_json(
    subject: _Subject, check: str, policy: Policy, cycles: int, ctx: ScheduleContext
) -> tuple[Policy, str]:
    """A fresh instance loaded from ``policy.state_dict()`` through JSON after ``cycles`` cycles
    (the latest on ``ctx``), and that JSON text.

    The restored ``state_dict()`` must be what was saved, type included: a float field that
    holds an int (a clamp to an integer bound, say) comes back as a float, and a policy that
    decides on it, saves it again or compares it would then act on a different state.
    """
    try:
        state = policy.state_dict()
    except Exception as exc:
        raise subject.fail(check, f"state_dict() raised {_exc(exc)}") from exc
    if not isinstance(state, Mapping):
        raise subject.fail(check, f"state_dict() returned {type(state).__name__}; expected a dict of JSON data")
    try:
        text = json.dumps(state, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise subject.fail(
            check,
            f"state_dict() after {cycles} cycles is not JSON-serialisable ({_exc(exc)}); "
            f"state was {state!r}; convert deques/sets/tuples to lists and numpy numbers to "
            "float/int, and keep numbers finite",
        ) from None
    restored = subject.cls(policy.params)
    try:
        restored.load_state_dict(json.loads(text))
    except Exception as exc:
        raise subject.fail(
            check,
            f"load_state_dict(json.loads(json.dumps(state_dict()))) raised {_exc(exc)} "
            f"on a fresh instance; state was {text}",
        ) from exc
    try:
        again = _sorted_json(restored.state_dict())
    except (TypeError, ValueError) as exc:
        raise subject.fail(check, f"state_dict() of the restored policy raised {_exc(exc)}") from None
    if again != _sorted_json(json.loads(text)):
        diff = _state_diff(json.loads(text), json.loads(again), "state") or "the JSON text differs"
        raise subject.fail(
            check,
            f"after {cycles} cycles the state did not come back exactly through JSON and load_state_dict "
            f"({diff}, saved -> restored); a restored policy must hold the same state, type included: "
            "an int saved where the policy loads a float comes back as a float, so give the field "
            f"the same type on every path that sets it. Saved: {text}. Context of that cycle: {_show(ctx)}",
        )
    return restored, text


def check_state_dict_json_round_trip(policy: PolicySpec, *, max_examples: int = EXAMPLES) -> None:
    """``state_dict`` survives JSON and ``load_state_dict`` on a fresh instance exactly, after every
    cycle; a policy restored halfway through a run then answers like the original."""
    name = "check_state_dict_json_round_trip"
    subject = _subject(policy)

    def body(contexts: list[ScheduleContext]) -> None:
        split = max(1, len(contexts) // 2)
        pol = subject.fresh(name)
        # Every cycle's state is round-tripped, not only the one restored from: a state that
        # breaks only at a boundary (a clamp, a cap) is then found in whichever cycle reaches it.
        for index, ctx in enumerate(contexts[:split]):
            _cycle(subject, name, pol, ctx)
            restored, text = _restore_from_json(subject, name, pol, index + 1, ctx)
        for index, ctx in enumerate(contexts[split:]):
            diff = _first_difference(_cycle(subject, name, pol, ctx), _cycle(subject, name, restored, ctx))
            if diff:
                method, x, y = diff
                raise subject.fail(
                    name,
                    f"{method} answered {x!r} on the original policy but {y!r} on a fresh "
                    f"instance restored from its state_dict ({text}), {index} cycles after the "
                    "save; state_dict must hold everything the decisions depend on. Context: "
                    f"{_show(ctx)}",
                )
            _restore_from_json(subject, name, pol, split + index + 1, ctx)

    _for_all_runs(body, max_examples=max_examples, min_size=2)


def check_only_hybrid_never_deadlocks(policy: PolicySpec, *, max_examples: int = EXAMPLES) -> None:
    """With no standalone replicas and hybrid inactive, ``should_activate_after_step`` is True.

    Nothing else could generate, so answering False would leave the trainer waiting forever.
    Checked at every point of generated only-hybrid runs, whatever state the policy has built.
    """
    name = "check_only_hybrid_never_deadlocks"
    subject = _subject(policy)

    def body(contexts: list[ScheduleContext]) -> None:
        pol = subject.fresh(name)
        for ctx in contexts:
            idle = ctx
            if ctx.is_hybrid_active:
                data = ctx.model_dump(exclude=set(_computed_fields()))
                idle = ScheduleContext(**{**data, "is_hybrid_active": False, "num_active_replicas": 0})
            answer = _call(subject, name, pol, "should_activate_after_step", idle)
            if answer is not True:
                raise subject.fail(
                    name,
                    f"should_activate_after_step returned {answer!r} in an only-hybrid "
                    "cluster (num_standalone_replicas=0) with hybrid replicas inactive; expected "
                    "True, since no replica would generate and training would deadlock (test "
                    f"ctx.only_hybrid first). Context: {_show(idle)}",
                )
            _cycle(subject, name, pol, ctx)

    _for_all_runs(body, max_examples=max_examples, only_hybrid=True)


def check_picklable(policy: PolicySpec, *, max_examples: int = EXAMPLES // 2) -> None:
    """A policy survives ``pickle`` (it may be shipped to a Ray actor) and then answers the same."""
    name = "check_picklable"
    subject = _subject(policy)

    def body(contexts: list[ScheduleContext]) -> None:
        split = max(1, len(contexts) // 2)
        pol = subject.fresh(name)
        for ctx in contexts[:split]:
            _cycle(subject, name, pol, ctx)
        try:
            clone = pickle.loads(pickle.dumps(pol))
        except Exception as exc:
            raise subject.fail(
                name,
                f"pickle round trip failed: {_exc(exc)}; a policy may be sent to another "
                "process (a Ray actor), so keep lambdas, locks, open files and clients off self",
            ) from None
        for index, ctx in enumerate(contexts[split:]):
            diff = _first_difference(_cycle(subject, name, pol, ctx), _cycle(subject, name, clone, ctx))
            if diff:
                method, x, y = diff
                raise subject.fail(
                    name,
                    f"{method} answered {x!r} on the original but {y!r} on its pickled "
                    f"copy, {index} cycles after the copy; pickling must keep the state the "
                    f"decisions depend on. Context: {_show(ctx)}",
                )

    _for_all_runs(body, max_examples=max_examples, min_size=2)


def check_decision_latency(
    policy: PolicySpec,
    *,
    median_s: float = LATENCY_MEDIAN_S,
    max_s: float = LATENCY_MAX_S,
    calls: int = 200,
    request_median_s: float = REQUEST_LATENCY_MEDIAN_S,
) -> None:
    """Each cycle method's median call is under ``median_s``, each request method's (when the policy
    writes one) under ``request_median_s``, and every call under ``max_s`` (perf_counter)."""
    from dynres.testkit.strategies import edge_requests

    name = "check_decision_latency"
    subject = _subject(policy)
    contexts: list[ScheduleContext] = []

    def gather(seq: list[ScheduleContext]) -> None:
        contexts.extend(seq)

    _for_all(_sequences(), gather, max_examples=max(1, calls // 4), shrink=False)
    contexts = contexts[:calls]
    pol = subject.fresh(name)
    _cycle(subject, name, pol, contexts[0])  # warm-up: first calls pay for imports and caches
    requests = [m for m in REQUEST_METHODS if getattr(subject.cls, m) is not getattr(Policy, m)]
    timings: dict[str, list[float]] = {m: [] for m in (*CYCLE_METHODS, *requests)}
    # The collector's pauses belong to the test process, not to the policy.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for ctx in contexts:
            for method in CYCLE_METHODS:
                start = time.perf_counter()
                _call(subject, name, pol, method, ctx)
                elapsed = time.perf_counter() - start
                if elapsed > max_s:
                    elapsed = min(elapsed, _retime(subject, name, pol, method, ctx))
                timings[method].append(elapsed)
            for request in edge_requests(ctx) if requests else ():
                for method in requests:
                    took = _time_request(pol, method, request, max_s)
                    if took is not None:
                        timings[method].append(took)
    finally:
        if was_enabled:
            gc.enable()
    for method, samples in timings.items():
        if not samples:
            continue  # every call raised: check_request_answers' finding
        budget = request_median_s if method in REQUEST_METHODS else median_s
        median, worst = statistics.median(samples), max(samples)
        if median > budget or worst > max_s:
            where = (
                "the load balancer asks it for every request, inline on the event loop"
                if method in REQUEST_METHODS
                else "the controller calls the policy on the training loop's critical path"
            )
            raise subject.fail(
                name,
                f"{method} took a median {median * 1e3:.3f} ms and at most {worst * 1e3:.3f} "
                f"ms over {len(samples)} calls; the budget is a median under {budget * 1e3:g} ms "
                f"and every call under {max_s * 1e3:g} ms, because {where} (no I/O, no sleeping, "
                "no heavy computation per call)",
            )


def _time_request(policy: Policy, method: str, request: RequestContext, max_s: float) -> float | None:
    # Seconds one request decision took, or None when it raised: wrong answers and exceptions
    # are check_request_answers' findings, not this check's. A call over max_s is timed twice
    # more and the fastest kept, as _retime does for the cycle methods.
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        try:
            getattr(policy, method)(request)
        except Exception:
            return None
        best = min(best, time.perf_counter() - start)
        if best <= max_s:
            break
    return best


def _retime(subject: _Subject, check: str, policy: Policy, method: str, ctx: ScheduleContext) -> float:
    # A call over the budget is timed twice more on copies: a slow policy is slow every time,
    # while a busy host (another process took the CPU) rarely stalls the same call three times.
    best = math.inf
    for _ in range(2):
        twin = copy.deepcopy(policy)
        start = time.perf_counter()
        _call(subject, check, twin, method, ctx)
        best = min(best, time.perf_counter() - start)
    return best


# ---- End-to-end checks (the simulator) ------------------------------------------------------------

BASELINE_POLICY = "static_fully_async"
"""The policy every other one is compared with end to end."""

BASELINE_MARGIN = 0.10
"""How much slower than the baseline a policy may be on a short scenario (fraction: 0.10 = 10%)."""

_SIM_CACHE: OrderedDict[tuple[str, str], Any] = OrderedDict()
_SIM_CACHE_SIZE = 64


def _policy_key(subject: _Subject, policy: Policy) -> str | None:
    # Runs are cached by what determines them: the class, its params and its state. The three
    # end-to-end checks then share one simulation per scenario instead of running three.
    cls = type(policy)
    try:
        params = json.dumps(policy.params.model_dump(mode="json"), sort_keys=True)
        state = json.dumps(policy.state_dict(), sort_keys=True, allow_nan=False)
    except Exception:  # unserialisable state: run uncached (the round-trip check reports it)
        return None
    return f"{cls.__module__}:{cls.__qualname__}@{id(cls)}|{params}|{state}"


def _simulate(subject: _Subject | None, check: str, scenario: str) -> Any:
    """The SimResult of ``subject`` (None = the baseline) on a short scenario; failures raise."""
    try:
        from dynres.runtime.sim import simulate
        from dynres.testkit.scenarios import short_scenario
    except ImportError as exc:
        raise CheckSkipped(
            f"{check} needs the dynres simulator, which could not be imported ({exc}); install dynres-runtime"
        ) from None
    if subject is not None:
        try:
            validate_policy_class(subject.cls)
        except PolicyValidationError:
            # The runtime refuses such a class outright; check_policy_api reports why, and four
            # failures for one cause would only bury it.
            raise CheckSkipped(
                f"{check}[{subject.label}]: the runtime refuses this class because it fails "
                "check_policy_api; fix that first"
            ) from None
    if subject is None:
        policy: Policy | str = BASELINE_POLICY
        key: str | None = f"baseline:{BASELINE_POLICY}"
        label = BASELINE_POLICY
    else:
        policy = subject.fresh(check)
        key = _policy_key(subject, policy)
        label = subject.label
    cache_key = (key or "", scenario)
    if key is not None and cache_key in _SIM_CACHE:
        _SIM_CACHE.move_to_end(cache_key)
        outcome = _SIM_CACHE[cache_key]
    else:
        try:
            outcome = simulate(short_scenario(scenario), policy=policy)
        except Exception as exc:  # the run itself broke: report it as this check's failure
            outcome = exc
        if key is not None:
            _SIM_CACHE[cache_key] = outcome
            while len(_SIM_CACHE) > _SIM_CACHE_SIZE:
                _SIM_CACHE.popitem(last=False)
    if isinstance(outcome, BaseException):
        raise PolicyCheckFailure(
            check,
            label,
            f"the simulated run of short scenario {scenario!r} failed: {_exc(outcome)}{_reproduce(scenario)}",
        ) from outcome
    return outcome


def _reproduce(scenario: str) -> str:
    return (
        f" (reproduce: dynres.runtime.sim.simulate(dynres.testkit.scenarios.short_scenario({scenario!r}), policy=...))"
    )


def _scenarios() -> list[str]:
    from dynres.testkit.scenarios import short_scenario_names

    return short_scenario_names()


def _first_fallback(report: Any) -> Any:
    records = list(getattr(report, "startup_decisions", []))
    for cycle in report.cycles:
        records.extend(cycle.decisions)
    return next((r for r in records if r.fallback), None)


def check_e2e_training_finishes(policy: PolicySpec) -> None:
    """On each short scenario the simulated run completes every cycle with no decision fallback.

    A fallback means the real runtime could not use the policy's answer (it raised, timed out
    or returned a wrong type there), although the unit checks may have passed: for example a
    policy that only works on the main thread, while the runtime calls it from a worker thread.
    """
    name = "check_e2e_training_finishes"
    subject = _subject(policy)
    for scenario in _scenarios():
        result = _simulate(subject, name, scenario)
        report = result.report
        steps = result.scenario.steps
        if len(report.cycles) != steps:
            raise subject.fail(
                name,
                f"short scenario {scenario!r} ran {len(report.cycles)} of {steps} sync cycles{_reproduce(scenario)}",
            )
        needed = steps * result.scenario.step_required_samples
        if report.samples.consumed != needed:
            raise subject.fail(
                name,
                f"short scenario {scenario!r}: the trainer consumed "
                f"{report.samples.consumed} samples; expected {needed} ({steps} cycles x "
                f"{result.scenario.step_required_samples}){_reproduce(scenario)}",
            )
        if report.policy_fallbacks:
            first = _first_fallback(report)
            detail = (
                f"; first: {first.method} at step {first.global_steps}: {first.reason}" if first is not None else ""
            )
            raise subject.fail(
                name,
                f"short scenario {scenario!r}: the runtime had to replace "
                f"{report.policy_fallbacks} of the policy's answers with safe fallbacks{detail}; "
                "the runtime calls the policy from a worker thread, under a timeout, and needs "
                f"the documented return types{_reproduce(scenario)}",
            )


def check_e2e_samples_accounted(policy: PolicySpec) -> None:
    """On each short scenario no sample is lost or duplicated, followed by id (what the prompt
    source handed out against what the trainer received, and what the run still held or
    dropped) and by the run report's sample counters."""
    name = "check_e2e_samples_accounted"
    subject = _subject(policy)
    for scenario in _scenarios():
        result = _simulate(subject, name, scenario)
        s = result.report.samples
        ledger = getattr(result, "ledger", None)
        problems = list(ledger.problems()) if ledger is not None else []
        if s.duplicates:
            problems.append(f"{s.duplicates} sample(s) or request(s) produced twice")
        if s.failed:
            problems.append(f"{s.failed} sample(s) failed on every replica")
        started = s.generated + s.partial_at_end + s.failed
        if s.admitted != started:
            problems.append(
                f"{s.admitted} samples admitted but generated + partial_at_end + failed = "
                f"{s.generated} + {s.partial_at_end} + {s.failed} = {started}"
            )
        ended = s.consumed + s.dropped_stale + s.queued_at_end
        if s.generated != ended:
            problems.append(
                f"{s.generated} samples generated but consumed + dropped_stale + queued_at_end = "
                f"{s.consumed} + {s.dropped_stale} + {s.queued_at_end} = {ended} "
                f"({s.generated - ended:+d} unaccounted)"
            )
        if problems:
            raise subject.fail(
                name,
                f"short scenario {scenario!r}: "
                + "; ".join(problems)
                + f"; every sample must be trained on, dropped as stale or still queued, exactly "
                f"once{_reproduce(scenario)}",
            )


def check_e2e_not_slower_than_baseline(policy: PolicySpec, *, margin: float = BASELINE_MARGIN) -> None:
    """On each short scenario the end-to-end time is within ``margin`` of static_fully_async's."""
    name = "check_e2e_not_slower_than_baseline"
    subject = _subject(policy)
    for scenario in _scenarios():
        mine = _simulate(subject, name, scenario).end_to_end_s
        base = _simulate(None, name, scenario).end_to_end_s
        if mine > base * (1.0 + margin):
            raise subject.fail(
                name,
                f"short scenario {scenario!r}: end-to-end {mine:.1f} s vs {base:.1f} s for "
                f"the {BASELINE_POLICY} baseline ({mine / base - 1:+.1%}); expected at most "
                f"{margin:.0%} slower. Lending trainer GPUs must not cost more than it saves "
                f"(too many switches, or waiting too long before deactivating){_reproduce(scenario)}",
            )


END_TO_END_CHECKS: tuple[Callable[..., None], ...] = (
    check_e2e_training_finishes,
    check_e2e_samples_accounted,
    check_e2e_not_slower_than_baseline,
)
"""The checks that run the policy in the simulator on the short scenarios."""


# ---- Collections of checks -----------------------------------------------------------------------

_UNIT_CHECKS: tuple[Callable[..., None], ...] = (
    check_policy_api,
    check_constructible_with_defaults,
    check_params_reject_unknown_keys,
    check_decision_types,
    check_request_answers,
    check_wait_bounds,
    check_grace_bounds,
    check_extra_admission_bounds,
    check_deterministic,
    check_context_not_mutated,
    check_decisions_do_not_change_state,
    check_no_clock_reads,
    check_no_global_random,
    check_state_dict_json_round_trip,
    check_only_hybrid_never_deadlocks,
    check_picklable,
    check_decision_latency,
)


def all_checks(*, end_to_end: bool = True) -> tuple[Callable[..., None], ...]:
    """Every check function, in the order they run (the end-to-end ones last)."""
    return _UNIT_CHECKS + (END_TO_END_CHECKS if end_to_end else ())


def budget_kwargs(check: Callable[..., None], max_examples: int | None) -> dict[str, Any]:
    """``{"max_examples": max_examples}`` for a property check, ``{}`` for a check without a budget
    or when ``max_examples`` is None (the check's own default then applies)."""
    if max_examples is None or "max_examples" not in inspect.signature(check).parameters:
        return {}
    return {"max_examples": max_examples}


def all_policies() -> list[str]:
    """The names of every policy registered in the ``dynres.policies`` entry-point group, sorted.

    The built-ins register there the way a third-party distribution does, so a suite over this
    list (``parametrize_with_checks(all_policies())``) covers every installed policy, one added
    later included, with no list to keep up by hand.
    """
    from dynres.core.loading import installed_policies

    return list(installed_policies())


def yield_policy_checks(policy: PolicySpec, *, end_to_end: bool = True) -> Iterator[Callable[..., None]]:
    """Yield the checks that apply to ``policy``, each a function taking the policy.

    Every check applies to every policy; the end-to-end ones (which run the simulator) are left
    out with ``end_to_end=False``, and report a skip when the simulator cannot be imported.
    """
    _subject(policy)  # fail early and clearly on a name that does not resolve
    yield from all_checks(end_to_end=end_to_end)


def _check_names(expected: Mapping[str, str] | None, checks: Iterable[Callable[..., None]]) -> dict[str, str]:
    if not expected:
        return {}
    names = [c.__name__ for c in checks]
    for key in expected:
        if key not in names:
            raise ConfigError(
                f"expected_failed_checks names {key!r}, which is not a check"
                f"{did_you_mean(key, names)}; checks: {', '.join(names)}"
            )
    return dict(expected)


def check_policy(
    policy: PolicySpec,
    *,
    expected_failed_checks: Mapping[str, str] | None = None,
    on_fail: Literal["raise", "warn"] | None = "raise",
    end_to_end: bool = True,
    max_examples: int | None = None,
) -> list[CheckResult]:
    """Run every applicable check on ``policy`` without pytest and return one result per check.

    ``expected_failed_checks`` maps a check name to the reason it is expected to fail; such a
    check is reported as ``xfail`` (or ``xpass``, with a warning, when it passes). Other
    failures raise one :class:`PolicyCheckFailure` listing all of them after every check has run
    (``on_fail="raise"``), emit a :class:`PolicyCheckWarning` each (``"warn"``), or are only
    returned (``None``). ``max_examples`` overrides how many generated runs each property check
    tries (fewer is faster, more finds rarer bugs).
    """
    if on_fail not in ("raise", "warn", None):
        raise ConfigError(f"on_fail must be 'raise', 'warn' or None, not {on_fail!r}")
    subject = _subject(policy)
    checks = list(yield_policy_checks(policy, end_to_end=end_to_end))
    expected = _check_names(expected_failed_checks, checks)
    results: list[CheckResult] = []
    for check in checks:
        start = time.perf_counter()
        status: Literal["passed", "failed", "xfail", "xpass", "skipped"]
        message = ""
        try:
            check(policy, **budget_kwargs(check, max_examples))
            status = "xpass" if check.__name__ in expected else "passed"
        except CheckSkipped as exc:
            status, message = "skipped", str(exc)
        except PolicyCheckFailure as exc:
            status, message = ("xfail" if check.__name__ in expected else "failed"), str(exc)
        results.append(CheckResult(check.__name__, subject.label, status, message, time.perf_counter() - start))
    for result in results:
        if result.status == "xpass":
            warnings.warn(
                f"{result.check}[{result.policy}] passed although expected_failed_checks lists it "
                f"({expected[result.check]!r}); remove it from the list",
                PolicyCheckWarning,
                stacklevel=2,
            )
    failed = [r for r in results if r.status == "failed"]
    if failed and on_fail == "warn":
        for result in failed:
            warnings.warn(result.message, PolicyCheckWarning, stacklevel=2)
    elif failed and on_fail == "raise":
        lines = "\n".join(f"- {r.message}" for r in failed)
        raise PolicyCheckFailure(
            "check_policy",
            subject.label,
            f"{len(failed)} of {len(results)} checks failed:\n{lines}",
        )
    return results


def parametrize_with_checks(
    policies: Sequence[PolicySpec],
    *,
    expected_failed_checks: Callable[[PolicySpec], Mapping[str, str] | None] | Mapping[str, str] | None = None,
    end_to_end: bool = True,
) -> Any:
    """A ``pytest.mark.parametrize("policy, check", ...)`` over every check of every policy.

    Test ids read ``check_name[policy]``. ``expected_failed_checks`` (a mapping, or a function of
    the policy returning one) marks checks as ``xfail`` with the given reason. Use it as::

        @parametrize_with_checks([MyPolicy])
        def test_conformance(policy, check):
            check(policy)
    """
    import pytest

    params = []
    for policy in policies:
        label = _subject(policy).label
        checks = list(yield_policy_checks(policy, end_to_end=end_to_end))
        raw = expected_failed_checks(policy) if callable(expected_failed_checks) else expected_failed_checks
        expected = _check_names(raw, checks)
        for check in checks:
            marks = []
            if check.__name__ in expected:
                marks.append(pytest.mark.xfail(reason=expected[check.__name__], raises=PolicyCheckFailure))
            params.append(pytest.param(policy, check, id=f"{check.__name__}[{label}]", marks=marks))
    return pytest.mark.parametrize("policy, check", params)
