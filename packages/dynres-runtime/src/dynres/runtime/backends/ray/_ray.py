"""Lazy access to Ray: import it only when the Ray backend is used, with a clear error otherwise."""

from __future__ import annotations

import functools
from types import ModuleType

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
def remote_class(cls: type) -> object:
    """``ray.remote(cls)``, done once per class (the classes stay importable without Ray)."""
    return require_ray().remote(cls)


def is_actor_lost(exc: BaseException) -> bool:
    """True when ``exc`` says the actor died or is unreachable (crash, lost node, killed)."""
    ray = require_ray()
    lost = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
    return isinstance(exc, lost)
