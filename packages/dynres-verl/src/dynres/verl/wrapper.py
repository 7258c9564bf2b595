"""verl's policies inside dynres: ``verl:<name>`` is verl's registered policy class behind the dynres API.

:func:`dynres_wrapper_class` returns a :class:`~dynres.core.Policy` subclass (named
``verl_<name>``) whose instances build verl's policy with verl's own ``build_policy`` on the first
decision (only then is it known whether the cluster is only-hybrid, which verl takes as a
constructor argument) and forward every decision to it with the context translated by
:func:`~dynres.verl.contexts.to_verl_context`:

* ``should_rebalance`` calls verl's ``request_rebalance`` with a :class:`RecordingRollouter` in
  ``_rollouter``; the answer is True when verl's policy asked the rollouter for a rebalance. The
  dynres controller then rebalances itself (verl's policy never does I/O here).
* verl accumulates the switch times of one sync cycle in its context and resets them after
  ``update_after_step``; the dynres runtime reports the latest activation and deactivation. The
  wrapper watches ``is_hybrid_active`` change between calls and hands verl the duration of each
  switch once, at the next ``update_after_step``. The runtime builds the context of
  ``update_after_step`` before an activation, so an activation reaches verl one cycle later
  than in verl's own trainer (the pairing is deactivate(k) + activate(k-1) instead of + activate(k)).
* Whatever verl's policy prints goes to the ``dynres.verl`` logger at DEBUG level, so
  ``--json -`` output stays clean.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import math
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field

from dynres.core import Policy, ScheduleContext
from dynres.core.errors import PolicyNotFoundError, PolicyValidationError
from dynres.verl._verl import registered_verl_class, schedule_module
from dynres.verl.contexts import to_verl_context

logger = logging.getLogger("dynres.verl")

PREFIX = "verl:"
"""Prefix naming one of verl's registered policies wherever dynres takes a policy name."""

_PRINT_LOCK = threading.Lock()


class VerlParams(Policy.Params):
    """Params of a wrapped verl policy: what verl's trainer passes to its constructor."""

    deactivate_ratio: float = Field(
        0.3, ge=0.0, le=1.0, description="Starting deactivate_ratio handed to verl's policy (fraction of a cycle)."
    )


class _RebalanceAsked(Exception):
    """Internal: raised inside verl's policy once the recording rollouter noted its request."""


class _RecordedMethod:
    def __init__(self, owner: RecordingRollouter, method: str) -> None:
        self.owner, self.method = owner, method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self.owner.calls.append(self.method)
        # Stop verl's policy before it hands this "reference" to ray.get, which would start a
        # Ray session just to fail; verl's default catches the error and logs its own message.
        raise _RebalanceAsked(self.method)


class RecordingRollouter:
    """Stands in for verl's rollouter actor handle: records each method a verl policy calls on it."""

    def __init__(self) -> None:
        """Start with no calls recorded."""
        self.calls: list[str] = []
        """Rollouter methods called, in order (e.g. ``rebalance_requests``)."""

    def __getattr__(self, method: str) -> _RecordedMethod:
        if method.startswith("__"):
            raise AttributeError(method)
        return _RecordedMethod(self, method)


@dataclass
class _Switches:
    """Switch times seen since verl's policy last got them (verl's per-cycle convention)."""

    now: float = -math.inf
    """Clock of the latest context observed (seconds)."""
    active: bool | None = None
    """is_hybrid_active of that context (None before the first)."""
    activate_s: float = 0.0
    """Activation seconds not yet handed to verl's update_after_step."""
    deactivate_s: float = 0.0
    """Deactivation seconds not yet handed to verl's update_after_step."""


class VerlPolicy(Policy):
    """Base of the ``verl:<name>`` wrappers: verl's policy, built on first use, behind the dynres API."""

    verl_name: ClassVar[str] = ""
    """The name under which verl registers the wrapped policy."""

    Params = VerlParams
    params: VerlParams

    def __init__(self, params: VerlParams | Mapping[str, Any] | None = None) -> None:
        """Keep the params; verl's policy is built at the first decision (it needs only_hybrid)."""
        super().__init__(params)
        self.verl_policy: Any = None
        """verl's policy instance (None until the first decision)."""
        self.rollouter = RecordingRollouter()
        """What verl's policy asked of its rollouter."""
        self._pending_state: dict[str, Any] | None = None
        self._switch = _Switches()

    # ---- Decisions ------------------------------------------------------------------------

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        """verl's ``should_deactivate``."""
        pol = self._policy(ctx)
        return self._quiet(pol.should_deactivate, ctx.global_steps, ctx.is_hybrid_active, self._ctx(ctx))

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        """verl's ``deactivate_wait_samples`` (negative answers are passed on; the runtime rejects them)."""
        pol = self._policy(ctx)
        return self._quiet(pol.deactivate_wait_samples, self._ctx(ctx))

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """verl's ``should_activate_after_step``."""
        pol = self._policy(ctx)
        return self._quiet(pol.should_activate_after_step, ctx.global_steps, ctx.is_hybrid_active, self._ctx(ctx))

    def should_rebalance(self, ctx: ScheduleContext) -> bool:
        """True when verl's ``request_rebalance`` asks the rollouter for a rebalance."""
        pol = self._policy(ctx)
        before = len(self.rollouter.calls)
        try:
            self._quiet(pol.request_rebalance, ctx.global_steps, self._ctx(ctx))
        except _RebalanceAsked:
            pass  # a verl policy that does not catch errors around its rollouter call
        return "rebalance_requests" in self.rollouter.calls[before:]

    def update_after_step(self, ctx: ScheduleContext) -> None:
        """verl's ``update_after_step`` with the switch times of the cycle, which are then reset."""
        pol = self._policy(ctx)
        vctx = self._ctx(ctx)
        self._quiet(pol.update_after_step, ctx.global_steps, vctx)
        self._switch.activate_s = self._switch.deactivate_s = 0.0

    # ---- State ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """verl's policy attributes that are plain JSON data, plus the switch times not yet handed over."""
        if self.verl_policy is None:
            return dict(self._pending_state or {})
        attrs = {k: _plain(v) for k, v in vars(self.verl_policy).items() if k != "_rollouter" and _is_plain(v)}
        switch = {"activate_s": self._switch.activate_s, "deactivate_s": self._switch.deactivate_s}
        return {"verl": attrs, "switch": switch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (applied to verl's policy when it is built)."""
        if not state:
            return
        if set(state) != {"verl", "switch"} or not isinstance(state["verl"], Mapping):
            raise PolicyValidationError(
                f"policy {self.name!r}: state keys {sorted(state)} do not match ['switch', 'verl']; "
                "pass what state_dict() returned"
            )
        self._pending_state = {"verl": dict(state["verl"]), "switch": dict(state["switch"])}
        if self.verl_policy is not None:
            self._apply_pending()

    def __reduce__(self) -> tuple[Any, ...]:
        # The class is built at run time, so pickle rebuilds it from verl's name.
        return (_new_instance, (self.verl_name,), self.__dict__)

    # ---- Internals --------------------------------------------------------------------------

    def _policy(self, ctx: ScheduleContext) -> Any:
        self._observe(ctx)
        if self.verl_policy is None:
            build = schedule_module().build_policy
            pol = self._quiet(
                build, self.verl_name, deactivate_ratio=self.params.deactivate_ratio, only_hybrid=ctx.only_hybrid
            )
            pol._rollouter = self.rollouter  # what verl's DynamicResourceController does
            self.verl_policy = pol
            self._apply_pending()
        return self.verl_policy

    def _apply_pending(self) -> None:
        if not self._pending_state:
            return
        for key, value in self._pending_state["verl"].items():
            setattr(self.verl_policy, key, value)
        switch = self._pending_state["switch"]
        self._switch.activate_s = float(switch.get("activate_s", 0.0))
        self._switch.deactivate_s = float(switch.get("deactivate_s", 0.0))
        self._pending_state = None

    def _observe(self, ctx: ScheduleContext) -> None:
        # A switch is seen as a change of is_hybrid_active between two contexts in clock order.
        s = self._switch
        if ctx.now < s.now:
            return  # an earlier context, handed in after a later one (update after a rebalance)
        if s.active is not None and s.active != ctx.is_hybrid_active:
            if ctx.is_hybrid_active:
                s.activate_s += ctx.last_activate_duration_s
            else:
                s.deactivate_s += ctx.last_deactivate_duration_s
        s.active, s.now = ctx.is_hybrid_active, ctx.now

    def _ctx(self, ctx: ScheduleContext) -> Any:
        return to_verl_context(ctx, activate_s=self._switch.activate_s, deactivate_s=self._switch.deactivate_s)

    @staticmethod
    def _quiet(fn: Any, *args: Any, **kwargs: Any) -> Any:
        out = io.StringIO()
        with _PRINT_LOCK, contextlib.redirect_stdout(out):
            try:
                return fn(*args, **kwargs)
            finally:
                for line in out.getvalue().splitlines():
                    logger.debug("verl: %s", line)


def _is_plain(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, str)):
        return True
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, (list, tuple)):
        return all(_is_plain(x) and not isinstance(x, (list, tuple)) for x in v)
    return False


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


@functools.cache
def dynres_wrapper_class(name: str) -> type[VerlPolicy]:
    """The dynres Policy class wrapping verl's policy ``name``; raise one-line errors when there is none."""
    if name.startswith("dynres:"):
        raise PolicyNotFoundError(
            f"policy 'verl:{name}' is a dynres policy seen through verl; name it directly as {name[7:]!r}"
        )
    registered_verl_class(name)  # raises PolicyNotFoundError listing verl's names
    dynres_name = "verl_" + re.sub(r"[^a-z0-9_]", "_", name.lower())
    return type(
        f"VerlPolicy[{name}]",
        (VerlPolicy,),
        {
            "name": dynres_name,
            "verl_name": name,
            "__doc__": f"verl's dynamic-schedule policy {name!r} behind the dynres policy API.",
        },
    )


def _new_instance(verl_name: str) -> VerlPolicy:
    cls = dynres_wrapper_class(verl_name)
    return cls.__new__(cls)
