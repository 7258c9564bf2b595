"""dynres core: the policy API, hook specs, schedule context, config models and metric formulas."""

from dynres.core.config import AsyncTrainingConfig, DynresConfig, load_config
from dynres.core.context import ScheduleContext
from dynres.core.errors import DynresError
from dynres.core.hookspecs import hookimpl, hookspec
from dynres.core.loading import (
    POLICIES_GROUP,
    clear_policy_cache,
    installed_policies,
    load_policy,
    resolve_policy_class,
)
from dynres.core.plugins import PLUGINS_GROUP, BoundPolicy, get_plugin_manager, register_plugin
from dynres.core.policy import CYCLE_METHODS, POLICY_METHODS, TAIL_METHODS, Policy
from dynres.core.requests import REQUEST_METHODS, ReplicaLoad, RequestContext

__all__ = [
    "CYCLE_METHODS",
    "PLUGINS_GROUP",
    "POLICIES_GROUP",
    "POLICY_METHODS",
    "REQUEST_METHODS",
    "TAIL_METHODS",
    "AsyncTrainingConfig",
    "BoundPolicy",
    "DynresConfig",
    "DynresError",
    "Policy",
    "ReplicaLoad",
    "RequestContext",
    "ScheduleContext",
    "clear_policy_cache",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
    "installed_policies",
    "load_config",
    "load_policy",
    "register_plugin",
    "resolve_policy_class",
]

__version__ = "0.1.0"
