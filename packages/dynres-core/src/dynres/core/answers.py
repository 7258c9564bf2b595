"""The one table of valid policy answers, and the checker the runtime and the testkit share.

==============================  ==========  =========  =====================================
method                          type        range      safe fallback (applied by the runtime)
==============================  ==========  =========  =====================================
``should_deactivate``           ``bool``               ``True`` (give the GPUs back)
``deactivate_wait_samples``     ``int``     ``>= 0``   ``0`` (do not wait)
``deactivate_grace_s``          ``float``   ``>= 0``   ``0.0`` (abort at once)
``should_activate_after_step``  ``bool``               ``ctx.only_hybrid``
``should_abandon_activation``   ``bool``               ``False`` (finish the activation)
``should_rebalance``            ``bool``               ``False`` (never rebalance)
``admit_extra_samples``         ``int``     ``>= 0``   ``0`` (admit none beyond the budget)
``update_after_step``           ``None``               nothing
==============================  ==========  =========  =====================================

A ``float`` answer is a finite real number (an ``int`` or a numpy real scalar counts and is
converted to ``float``; a ``bool`` does not). One rule for every kind: a numpy boolean or integer
scalar (0-d, e.g. ``numpy.bool_`` from ``arr.mean() > x``) counts as ``bool`` or ``int`` and is
normalised to the Python type, so what the runtime acts on and what a recorded trace holds is
plain JSON. A Python ``bool`` is not an ``int`` here (``True`` samples to wait for is a bug), and
neither is a float, integral or not. numpy is recognised by the value's module and dtype, so this
module does not import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from dynres.core.context import ScheduleContext

__all__ = ["ANSWERS", "AnswerSpec", "CheckedAnswer", "check_answer", "clamp_answer", "is_real_number", "safe_answer"]


@dataclass(frozen=True)
class AnswerSpec:
    """What one policy method must return."""

    kind: Literal["bool", "int", "float", "None"]
    """Python type of a valid answer after normalisation."""
    minimum: int | None = None
    """Smallest valid value (for ``int`` and ``float`` answers; None: no lower bound)."""
    hint: str = ""
    """How a policy author fixes a wrong type, for error messages."""

    def describe(self) -> str:
        """The valid answers in words, e.g. ``int >= 0``."""
        return self.kind if self.minimum is None else f"{self.kind} >= {self.minimum}"


ANSWERS: dict[str, AnswerSpec] = {
    "should_deactivate": AnswerSpec("bool", hint="wrap it in bool(...)"),
    "deactivate_wait_samples": AnswerSpec("int", minimum=0, hint="wrap it in int(...)"),
    "deactivate_grace_s": AnswerSpec("float", minimum=0, hint="return a finite number of seconds, e.g. float(...)"),
    "should_activate_after_step": AnswerSpec("bool", hint="wrap it in bool(...)"),
    "should_abandon_activation": AnswerSpec("bool", hint="wrap it in bool(...)"),
    "should_rebalance": AnswerSpec("bool", hint="wrap it in bool(...)"),
    "admit_extra_samples": AnswerSpec("int", minimum=0, hint="wrap it in int(...)"),
    "update_after_step": AnswerSpec("None", hint="return None"),
}
"""Policy method name -> what it must return; keys in the order the runtime calls them."""


@dataclass(frozen=True)
class CheckedAnswer:
    """A policy answer after :func:`check_answer`."""

    value: Any
    """The answer normalised to its Python type (numpy scalars converted); the raw value when the type is wrong."""
    type_ok: bool
    """True when the answer has the method's type (ranges aside)."""
    reason: str
    """Why the answer is invalid, type or range ('' when valid)."""

    @property
    def ok(self) -> bool:
        """True when the answer is valid in type and range."""
        return not self.reason


def check_answer(method: str, value: Any) -> CheckedAnswer:
    """Check ``value`` as an answer of policy method ``method``; return it normalised or the reason.

    Raises ``KeyError`` for a name that is not a policy method (a caller bug, not a policy's).
    """
    spec = ANSWERS[method]
    if spec.kind == "bool":
        if isinstance(value, bool) or _numpy_kind(value) == "b":
            return CheckedAnswer(bool(value), True, "")
    elif spec.kind == "int":
        if (isinstance(value, int) and not isinstance(value, bool)) or _numpy_kind(value) in ("i", "u"):
            number = int(value)
            if spec.minimum is not None and number < spec.minimum:
                return CheckedAnswer(number, True, f"expected {spec.describe()}, got {number}")
            return CheckedAnswer(number, True, "")
    elif spec.kind == "float":
        if is_real_number(value):
            seconds = float(value)
            if not math.isfinite(seconds):
                return CheckedAnswer(seconds, True, f"expected a finite {spec.describe()}, got {seconds}")
            if spec.minimum is not None and seconds < spec.minimum:
                return CheckedAnswer(seconds, True, f"expected {spec.describe()}, got {seconds}")
            return CheckedAnswer(seconds, True, "")
    elif value is None:
        return CheckedAnswer(None, True, "")
    return CheckedAnswer(value, False, f"expected {spec.describe()}, got {type_name(value)}")


def safe_answer(method: str, ctx: ScheduleContext) -> Any:
    """The safe fallback of ``method`` (the table's last column) for a policy that failed on ``ctx``."""
    if method == "should_deactivate":
        return True
    if method in ("deactivate_wait_samples", "admit_extra_samples"):
        return 0
    if method == "deactivate_grace_s":
        return 0.0
    if method == "should_activate_after_step":
        return ctx.only_hybrid
    if method in ("should_rebalance", "should_abandon_activation"):
        return False
    return None


def clamp_answer(method: str, value: Any, ctx: ScheduleContext) -> tuple[Any, str]:
    """Apply the safety clamp of ``method`` to a checked (or fallback) answer; return ``(value, reason)``.

    ``deactivate_wait_samples`` stays in ``[step_required, step_required + buffer]`` in an
    only-hybrid cluster (the trainer's GPUs are the only producers: they must make at least one
    cycle's samples before going back) and in ``[0, step_required + buffer]`` otherwise (the queue
    never holds more, so a longer wait would never end); ``should_activate_after_step`` is True in
    an only-hybrid cluster, for the same reason; ``deactivate_grace_s`` is at most the latest
    cycle's length (``last_cycle_time_s``, 0 before one was measured): a grace is a cut into the
    trainer's time, and a longer one would hold its GPUs beyond the window they were lent for;
    ``admit_extra_samples`` is at most ``step_required_samples``: one cycle's batch beyond the
    budget, whose samples are at most one cycle staler than the threshold allows (the runtime's
    queue still drops any sample past its staleness limit).
    ``reason`` is '' when the value is unchanged.
    Applied by :class:`dynres.core.guard.PolicyGuard`, in the dynres runtime and inside verl.
    """
    if method == "deactivate_wait_samples":
        lo = ctx.step_required_samples if ctx.only_hybrid else 0
        hi = ctx.step_required_samples + ctx.buffer_samples
        if value < lo:
            return lo, f"only-hybrid cluster: wait for at least step_required={lo}"
        if value > hi:
            return hi, f"never wait for more than step_required + buffer = {hi}"
    elif method == "deactivate_grace_s" and value > ctx.last_cycle_time_s:
        return ctx.last_cycle_time_s, f"never longer than the latest cycle, last_cycle_time_s={ctx.last_cycle_time_s}"
    elif method == "admit_extra_samples" and value > ctx.step_required_samples:
        return ctx.step_required_samples, f"at most one cycle's batch, step_required={ctx.step_required_samples}"
    elif method == "should_activate_after_step" and ctx.only_hybrid and not value:
        return True, "only-hybrid cluster: nothing else could generate"
    return value, ""


def type_name(value: Any) -> str:
    """The type of ``value`` as an error message shows it: ``int``, ``numpy.float64``."""
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def is_real_number(value: Any) -> bool:
    """True for an ``int``, a ``float`` or a 0-d numpy integer or float scalar; never for a ``bool``."""
    return (isinstance(value, int | float) and not isinstance(value, bool)) or _numpy_kind(value) in ("i", "u", "f")


def _numpy_kind(value: Any) -> str:
    # A numpy scalar's dtype kind ('b' bool, 'i'/'u' integers), found without importing numpy;
    # arrays (ndim > 0) do not count, even with one element.
    if type(value).__module__ != "numpy" or getattr(value, "ndim", 1) != 0:
        return ""
    return str(getattr(getattr(value, "dtype", None), "kind", ""))
