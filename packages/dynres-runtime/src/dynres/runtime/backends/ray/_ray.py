"""Lazy access to Ray: import it only when the Ray backend is used, with a clear error otherwise."""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from dynres.core.errors import MissingExtraError


@functools.cache
def require_ray() -> ModuleType:
    """Return the ``ray`` module; raise MissingExtraError naming ``dynres-runtime[ray]`` when absent."""
    try:
        import ray
    except ImportError as exc:
        raise MissingExtraError("ray", "ray") from exc
    return ray


@functools.cache
def remote_class(cls: type) -> Any:
    """``ray.remote(cls)``, done once per class (the classes stay importable without Ray)."""
    return require_ray().remote(cls)


def is_actor_lost(exc: BaseException) -> bool:
    """True when ``exc`` says the actor died or is unreachable (crash, lost node, killed)."""
    ray = require_ray()
    lost = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
    return isinstance(exc, lost)


def remote_cause(exc: BaseException) -> BaseException:
    """The exception the remote method itself raised, unwrapped from Ray's task errors; else ``exc``.

    Ray re-raises a remote exception as a class deriving from both ``RayTaskError`` and the
    original class, whose text is the whole remote traceback: messages built from it (and the
    CLI's one line) would carry that traceback. The original is Ray's ``cause``; a call through
    several actors nests one wrapper per hop.
    """
    task_error = require_ray().exceptions.RayTaskError
    inner = exc
    while isinstance(inner, task_error) and isinstance(getattr(inner, "cause", None), BaseException):
        inner = inner.cause
    return exc if isinstance(inner, task_error) else inner


LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray setting that, when "0", makes a node advertise 127.0.0.1 instead of the machine's IP."""


def use_loopback() -> None:
    """Make Ray nodes started from this process (and their children) bind to 127.0.0.1.

    For a local Ray (one machine, or a test ``Cluster`` on it) nothing has to be reachable from
    elsewhere, so the loopback address keeps every byte on the machine. Ray reads this setting
    as a module constant when it picks a node's IP, so the constant is updated as well when Ray
    is already imported. Never used when joining an existing cluster by address.
    """
    import os
    import sys

    os.environ[LOOPBACK_ENV] = "0"
    constants: Any = sys.modules.get("ray._private.ray_constants")  # Ray's own module: untyped here
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False
