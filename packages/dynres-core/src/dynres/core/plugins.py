"""Plugin manager factory and the adapter that turns a `Policy` into decision-hook implementations."""

from __future__ import annotations

import inspect
import os
from importlib.metadata import entry_points
from typing import Any

import pluggy

from dynres.core import hookspecs
from dynres.core.context import ScheduleContext
from dynres.core.errors import PluginError, did_you_mean
from dynres.core.hookspecs import PROJECT_NAME, REQUEST_HOOKS, hookimpl
from dynres.core.policy import Policy, validate_policy_class
from dynres.core.requests import REQUEST_METHODS, RequestContext

PLUGINS_GROUP = "dynres.plugins"
"""Entry-point group of cross-cutting plugins (exporters, decision wrappers, observers)."""

DISABLE_AUTOLOAD_ENV = "DYNRES_DISABLE_PLUGIN_AUTOLOAD"
"""Set this environment variable to 1/true/yes to skip loading ``dynres.plugins`` entry points."""


def autoload_disabled() -> bool:
    """Return True when the environment switch turns off ``dynres.plugins`` autoloading."""
    return os.environ.get(DISABLE_AUTOLOAD_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def get_plugin_manager(*, load_plugins: bool | None = None) -> pluggy.PluginManager:
    """Return a new plugin manager with the dynres hook specs and, unless disabled, the installed plugins.

    ``load_plugins=None`` loads the ``dynres.plugins`` entry points unless the environment
    variable ``DYNRES_DISABLE_PLUGIN_AUTOLOAD`` is set. Every call builds a fresh manager, so
    tests and several runs in one process never share registered plugins.
    """
    pm = pluggy.PluginManager(PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    if load_plugins is None:
        load_plugins = not autoload_disabled()
    if load_plugins:
        _load_entry_point_plugins(pm)
    return pm


def _load_entry_point_plugins(pm: pluggy.PluginManager) -> None:
    seen: set[tuple[str, str]] = set()
    for ep in entry_points(group=PLUGINS_GROUP):
        dist = ep.dist.name if ep.dist is not None else "<unknown distribution>"
        if (dist, ep.value) in seen:
            continue
        seen.add((dist, ep.value))
        try:
            plugin = ep.load()
        except Exception as exc:  # any import-time failure of third-party code
            raise PluginError(
                f"plugin {ep.name!r} ({ep.value}) from distribution {dist!r} failed to import: "
                f"{type(exc).__name__}: {exc}; fix or uninstall {dist!r}, or set "
                f"{DISABLE_AUTOLOAD_ENV}=1"
            ) from exc
        register_plugin(pm, plugin, name=ep.name, origin=f"distribution {dist!r}")


def register_plugin(pm: pluggy.PluginManager, plugin: object, *, name: str | None = None, origin: str = "") -> None:
    """Register ``plugin`` and validate it; raise PluginError naming it on an unknown hook or bad signature."""
    where = f" from {origin}" if origin else ""
    label = name or getattr(plugin, "__name__", repr(plugin))
    # pluggy ignores undecorated functions, so a hook written without @hookimpl would silently
    # never run; the dynres_ prefix is reserved for hooks, so treat it as a mistake.
    undecorated = sorted(
        attr
        for attr in dir(plugin)
        if attr.startswith("dynres_")
        and callable(getattr(plugin, attr, None))
        and pm.parse_hookimpl_opts(plugin, attr) is None
    )
    if undecorated:
        raise PluginError(
            f"plugin {label!r}{where} defines {undecorated[0]!r} without @dynres.core.hookimpl, "
            "so it would never be called; decorate it, or rename it if it is not a hook"
        )
    try:
        pm.register(plugin, name=name)
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        if pm.is_registered(plugin):
            pm.unregister(plugin)
        # pluggy's message spans lines; dynres errors are printed as one line by the CLI.
        detail = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise PluginError(
            f"plugin {label!r}{where} is invalid: {detail}{_validation_hint(pm, plugin)}; hooks "
            "are listed in dynres.core.hookspecs"
        ) from None
    except ValueError as exc:  # pluggy: name already registered
        raise PluginError(f"plugin {label!r}{where} could not be registered: {exc}") from None


def _validation_hint(pm: pluggy.PluginManager, plugin: object) -> str:
    known = (
        hookspecs.DECISION_HOOKS
        + hookspecs.REQUEST_HOOKS
        + hookspecs.OBSERVER_HOOKS
        + hookspecs.RESOLUTION_HOOKS
        + hookspecs.TRACKING_HOOKS
    )
    for attr in dir(plugin):
        opts = pm.parse_hookimpl_opts(plugin, attr)
        if opts is None:
            continue
        hook_name = opts.get("specname") or attr
        if hook_name not in known:
            return did_you_mean(hook_name, known)
        spec_args = getattr(pm.hook, hook_name).spec.argnames
        try:
            impl_args = inspect.signature(getattr(plugin, attr)).parameters
        except (TypeError, ValueError):
            continue
        if any(a not in spec_args for a in impl_args):
            return f" ({hook_name} accepts any of: {', '.join(spec_args)})"
    return ""


POLICY_PLUGIN_PREFIX = "dynres-policy:"
"""Name prefix under which BoundPolicy registers a policy on a plugin manager."""


class _PolicyHookImpls:
    """Registers a policy's plain methods as the last-resort implementations of the decision hooks."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    @hookimpl(trylast=True)
    def dynres_should_deactivate(self, ctx: ScheduleContext) -> Any:
        return self.policy.should_deactivate(ctx)

    @hookimpl(trylast=True)
    def dynres_deactivate_wait_samples(self, ctx: ScheduleContext) -> Any:
        return self.policy.deactivate_wait_samples(ctx)

    @hookimpl(trylast=True)
    def dynres_deactivate_grace_s(self, ctx: ScheduleContext) -> Any:
        return self.policy.deactivate_grace_s(ctx)

    @hookimpl(trylast=True)
    def dynres_should_activate_after_step(self, ctx: ScheduleContext) -> Any:
        return self.policy.should_activate_after_step(ctx)

    @hookimpl(trylast=True)
    def dynres_should_abandon_activation(self, ctx: ScheduleContext) -> Any:
        return self.policy.should_abandon_activation(ctx)

    @hookimpl(trylast=True)
    def dynres_should_rebalance(self, ctx: ScheduleContext) -> Any:
        return self.policy.should_rebalance(ctx)

    @hookimpl(trylast=True)
    def dynres_admit_extra_samples(self, ctx: ScheduleContext) -> Any:
        return self.policy.admit_extra_samples(ctx)

    @hookimpl(trylast=True)
    def dynres_update_after_step(self, ctx: ScheduleContext) -> Any:
        return self.policy.update_after_step(ctx)

    @hookimpl(trylast=True)
    def dynres_predict_length(self, request: RequestContext) -> Any:
        return self.policy.predict_length(request)

    @hookimpl(trylast=True)
    def dynres_route_request(self, request: RequestContext) -> Any:
        return self.policy.route(request)


class BoundPolicy:
    """A policy plugged into a plugin manager: decisions go through the ``dynres_*`` hooks.

    The runtime calls these methods; plugins registered on the same manager may override or
    wrap each decision. Values are returned as the hooks produce them; the runtime checks them
    against :data:`dynres.core.answers.ANSWERS` and falls back to safe values
    (:mod:`dynres.core.guard`).
    """

    def __init__(self, policy: Policy, pm: pluggy.PluginManager | None = None) -> None:
        """Register ``policy`` on ``pm`` (a fresh manager with installed plugins if None)."""
        validate_policy_class(type(policy))
        self.policy = policy
        self.pm = pm if pm is not None else get_plugin_manager()
        # Two policies on one manager would both answer the decision hooks, the later one
        # shadowing the earlier without a word; one manager carries exactly one policy.
        bound = [n for n, _ in self.pm.list_name_plugin() if n and n.startswith(POLICY_PLUGIN_PREFIX)]
        if bound:
            raise PluginError(
                f"cannot bind policy {policy.name!r}: this plugin manager already carries "
                f"{bound[0]!r}; build a fresh manager with get_plugin_manager() for each policy"
            )
        self.pm.register(_PolicyHookImpls(policy), name=POLICY_PLUGIN_PREFIX + policy.name)

    @property
    def name(self) -> str:
        """The bound policy's registry name."""
        return self.policy.name

    def should_deactivate(self, ctx: ScheduleContext) -> Any:
        """Run the ``dynres_should_deactivate`` hook chain."""
        return self.pm.hook.dynres_should_deactivate(ctx=ctx)

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> Any:
        """Run the ``dynres_deactivate_wait_samples`` hook chain."""
        return self.pm.hook.dynres_deactivate_wait_samples(ctx=ctx)

    def deactivate_grace_s(self, ctx: ScheduleContext) -> Any:
        """Run the ``dynres_deactivate_grace_s`` hook chain."""
        return self.pm.hook.dynres_deactivate_grace_s(ctx=ctx)

    def should_activate_after_step(self, ctx: ScheduleContext) -> Any:
        """Run the ``dynres_should_activate_after_step`` hook chain."""
        return self.pm.hook.dynres_should_activate_after_step(ctx=ctx)

    def should_abandon_activation(self, ctx: ScheduleContext) -> Any:
        """Run the ``dynres_should_abandon_activation`` hook chain."""
        return self.pm.hook.dynres_should_abandon_activation(ctx=ctx)

    def should_rebalance(self, ctx: ScheduleContext) -> Any:
        """Run the ``dynres_should_rebalance`` hook chain."""
        return self.pm.hook.dynres_should_rebalance(ctx=ctx)

    def admit_extra_samples(self, ctx: ScheduleContext) -> Any:
        """Run the ``dynres_admit_extra_samples`` hook chain."""
        return self.pm.hook.dynres_admit_extra_samples(ctx=ctx)

    def update_after_step(self, ctx: ScheduleContext) -> Any:
        """Run every ``dynres_update_after_step`` implementation; None, or the first non-None value."""
        results = self.pm.hook.dynres_update_after_step(ctx=ctx)
        # Only a misbehaving implementation returns something; surface it so the caller can report it.
        return next((r for r in results if r is not None), None)

    @property
    def decides_requests(self) -> bool:
        """True when the policy writes ``predict_length`` or ``route``, or a plugin implements their hooks.

        False means routing is the built-in rule and the load balancer never asks (no per-request cost).
        """
        return any(self.decides(m) for m in REQUEST_METHODS)

    def decides(self, method: str) -> bool:
        """True when the policy writes ``method`` (a Policy method name) or a plugin implements its
        ``dynres_`` hook: the runtime asks an optional decision only then, so a policy that writes
        neither runs as before the decision existed."""
        if getattr(type(self.policy), method) is not getattr(Policy, method):
            return True
        hook = dict(zip(REQUEST_METHODS, REQUEST_HOOKS, strict=True)).get(method, f"dynres_{method}")
        impls = getattr(self.pm.hook, hook).get_hookimpls()
        return any(not isinstance(i.plugin, _PolicyHookImpls) for i in impls)

    def predict_length(self, request: RequestContext) -> Any:
        """Run the ``dynres_predict_length`` hook chain."""
        return self.pm.hook.dynres_predict_length(request=request)

    def route(self, request: RequestContext) -> Any:
        """Run the ``dynres_route_request`` hook chain."""
        return self.pm.hook.dynres_route_request(request=request)

    def decision(self, method: str, ctx: ScheduleContext) -> Any:
        """Run the hook chain of policy method ``method`` (one of CYCLE_METHODS)."""
        return getattr(self, method)(ctx)
