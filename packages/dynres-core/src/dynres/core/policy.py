"""The `Policy` base class that every scheduling policy subclasses."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from dynres.core.context import ScheduleContext
from dynres.core.errors import PolicyParamsError, PolicyValidationError, did_you_mean
from dynres.core.requests import REQUEST_METHODS, RequestContext

POLICY_METHODS: tuple[str, ...] = (
    "should_deactivate",
    "deactivate_wait_samples",
    "should_activate_after_step",
    "should_rebalance",
    "update_after_step",
)
"""The five decision/update methods that mirror verl's policy interface, in the order the controller
calls them in a cycle."""

TAIL_METHODS: tuple[str, ...] = ("deactivate_grace_s", "should_abandon_activation", "admit_extra_samples")
"""Cycle decisions of the dynres runtime beyond verl's five (verl's trainer never asks them)."""

CYCLE_METHODS: tuple[str, ...] = (
    "should_deactivate",
    "deactivate_wait_samples",
    "deactivate_grace_s",
    "should_activate_after_step",
    "should_abandon_activation",
    "should_rebalance",
    "admit_extra_samples",
    "update_after_step",
)
"""Every cycle method (POLICY_METHODS and TAIL_METHODS), in the order the dynres runtime calls them."""

REQUIRED_METHODS: tuple[str, ...] = (
    "should_deactivate",
    "deactivate_wait_samples",
    "should_activate_after_step",
)
"""Methods a subclass must write; the base class supplies the others."""

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


class Policy:
    """Base class of a scheduling policy: subclass it, set ``name``, write the decision methods.

    A policy is built as ``MyPolicy(params)`` (``params`` may be a ``Params`` instance, a mapping
    or ``None`` for defaults) and keeps them as ``self.params``. Every cycle decision takes one
    :class:`ScheduleContext`, every request decision (``predict_length``, ``route``) one
    :class:`~dynres.core.requests.RequestContext`; none may do I/O or read a clock.
    """

    name: ClassVar[str] = ""
    """Registry name of the policy (lower_snake_case); equals its entry-point name."""

    class Params(BaseModel):
        """Base of a policy's tunables; subclasses add fields. Unknown keys are rejected."""

        model_config = ConfigDict(extra="forbid", frozen=True)

    params: Params

    def __init__(self, params: BaseModel | Mapping[str, Any] | None = None) -> None:
        """Validate ``params`` against this class's ``Params`` model and keep them (another model is revalidated)."""
        self.params = self.validate_params(params)

    # ---- Construction helpers -------------------------------------------------------------

    @classmethod
    def validate_params(cls, params: BaseModel | Mapping[str, Any] | None) -> Params:
        """Return ``params`` as an instance of ``cls.Params``; raise PolicyParamsError naming the field."""
        model = cls.Params
        if isinstance(params, model):
            return params
        if params is None:
            data: Mapping[str, Any] = {}
        elif isinstance(params, BaseModel):
            data = params.model_dump()
        elif isinstance(params, Mapping):
            data = params
        else:
            raise PolicyParamsError(
                f"policy {cls.name or cls.__qualname__!r}: params must be a mapping or "
                f"{cls.__qualname__}.Params, not {type(params).__name__}"
            )
        try:
            return model.model_validate(dict(data))
        except ValidationError as exc:
            raise PolicyParamsError(_params_message(cls, exc)) from None

    # ---- Decisions (the controller calls these, in this order) ----------------------------

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        """Before training: return True to hand the hybrid replicas back to the trainer."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement should_deactivate")

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        """If deactivating: samples (>= 0) to wait for in the queue before deactivating."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement deactivate_wait_samples")

    def deactivate_grace_s(self, ctx: ScheduleContext) -> float:
        """If deactivating, after the wait: seconds to let the requests still running on the hybrid
        replicas finish once they leave routing, before the rest are aborted (default 0.0: abort at once)."""
        return 0.0

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """After the weight sync: return True to let hybrid replicas generate next cycle."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement should_activate_after_step")

    def should_abandon_activation(self, ctx: ScheduleContext) -> bool:
        """During an activation, once the queue holds the next collection's samples: return True to
        give it up (hybrids back to sleep, trainer onloaded) instead of finishing it (default False)."""
        return False

    def should_rebalance(self, ctx: ScheduleContext) -> bool:
        """After an activation: return True to move work onto the new replicas (default False)."""
        return False

    def admit_extra_samples(self, ctx: ScheduleContext) -> int:
        """After the weight sync: samples (>= 0) to admit under the new weights once the staleness
        budget is spent, trained up to a cycle staler than the threshold allows (default 0: none)."""
        return 0

    def update_after_step(self, ctx: ScheduleContext) -> None:
        """After the weight sync: adapt internal state (default: nothing to adapt)."""
        return None

    # ---- Request decisions (the load balancer calls these; see dynres.core.requests) -------

    def predict_length(self, request: RequestContext) -> float | None:
        """Tokens the response of ``request`` will have in all (default None: no prediction)."""
        return None

    def route(self, request: RequestContext) -> str | None:
        """The id of the replica ``request`` goes to (default None: least in flight)."""
        return None

    # ---- State (checkpoint / resume) ------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Return the adapted state as JSON-serialisable data (default: nothing to keep)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore state returned by :meth:`state_dict` (default: accepts only an empty mapping)."""
        if state:
            raise PolicyValidationError(
                f"policy {self.name!r} keeps no state but load_state_dict got keys "
                f"{sorted(state)}; override state_dict/load_state_dict to keep state"
            )

    def __repr__(self) -> str:
        """Show the policy's name and params."""
        return f"{type(self).__qualname__}(name={self.name!r}, params={self.params!r})"


def validate_policy_class(obj: object, *, where: str = "") -> type[Policy]:
    """Check that ``obj`` is a usable Policy subclass; raise PolicyValidationError naming the defect.

    ``where`` names the origin (entry point, import path) to include in the message.
    """
    origin = f" (from {where})" if where else ""
    if not (isinstance(obj, type) and issubclass(obj, Policy)):
        raise PolicyValidationError(
            f"{obj!r}{origin} is not a subclass of dynres.core.Policy; make the class inherit from dynres.core.Policy"
        )
    cls: type[Policy] = obj
    label = f"policy class {cls.__module__}:{cls.__qualname__}{origin}"
    if not isinstance(cls.name, str) or not _NAME_RE.match(cls.name):
        raise PolicyValidationError(f"{label} has name={cls.name!r}; set a class attribute name = 'lower_snake_case'")
    if not (isinstance(cls.Params, type) and issubclass(cls.Params, Policy.Params)):
        raise PolicyValidationError(f"{label}: Params must subclass Policy.Params (so unknown keys are rejected)")
    if cls.Params.model_config.get("extra") != "forbid":
        raise PolicyValidationError(
            f"{label}: Params.model_config must keep extra='forbid' so typos in params are errors"
        )
    missing = [m for m in REQUIRED_METHODS if getattr(cls, m) is getattr(Policy, m)]
    if missing:
        raise PolicyValidationError(f"{label} does not implement {', '.join(missing)}")
    for method in CYCLE_METHODS:
        _check_signature(cls, method, label)
    for method in REQUEST_METHODS:
        _check_signature(cls, method, label, arg="request: RequestContext")
    unknown = sorted(attr for attr in dir(cls) if attr.startswith("dynres_") and callable(getattr(cls, attr)))
    if unknown:
        from dynres.core.hookspecs import DECISION_HOOKS, OBSERVER_HOOKS, REQUEST_HOOKS

        known = DECISION_HOOKS + REQUEST_HOOKS + OBSERVER_HOOKS
        bad = unknown[0]
        raise PolicyValidationError(
            f"{label} defines {bad!r}, which is not a dynres hook"
            f"{did_you_mean(bad, known)}; a policy writes plain methods "
            f"({', '.join(CYCLE_METHODS + REQUEST_METHODS)}); hooks belong in a plugin"
        )
    return cls


def _check_signature(cls: type[Policy], method: str, label: str, arg: str = "ctx: ScheduleContext") -> None:
    func = getattr(cls, method)
    if not callable(func):
        raise PolicyValidationError(f"{label}: {method} must be a method, not {type(func).__name__}")
    if isinstance(inspect.getattr_static(cls, method), (staticmethod, classmethod)):
        raise PolicyValidationError(
            f"{label}: {method} must be a plain method def {method}(self, {arg.split(':')[0]}), "
            "not a staticmethod or classmethod"
        )
    sig = inspect.signature(func)
    params = list(sig.parameters.values())[1:]  # drop self
    required = [
        p
        for p in params
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    takes_one = len(required) == 1 and required[0].kind != inspect.Parameter.KEYWORD_ONLY
    if not takes_one:
        shown = ", ".join(["self", *(p.name for p in params)])
        raise PolicyValidationError(
            f"{label}: {method}({shown}) has the wrong signature; the policy API is "
            f"def {method}(self, {arg}) (everything else is in {arg.split(':')[0]})"
        )


def _params_message(cls: type[Policy], exc: ValidationError) -> str:
    label = cls.name or cls.__qualname__
    parts = []
    fields = list(cls.Params.model_fields)
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(params)"
        if err["type"] == "extra_forbidden":
            parts.append(
                f"unknown param {loc!r}{did_you_mean(loc, fields)}; valid params: {', '.join(fields) or '(none)'}"
            )
        else:
            parts.append(f"param {loc!r}: {err['msg']} (got {err.get('input')!r})")
    return f"policy {label!r}: " + "; ".join(parts)
