"""How an actor builds the object it hosts (a replica, a train engine) inside its own process."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynres.core.errors import BackendError, ConfigError
from dynres.core.loading import import_object


def resolve_target(target: str | Callable[..., Any]) -> Callable[..., Any]:
    """Return the callable named by ``"module:attr"`` (or ``target`` itself when callable)."""
    if callable(target):
        return target
    if not isinstance(target, str):
        raise ConfigError(f"factory target {target!r} is neither a callable nor a 'module:attr' import path")
    obj = import_object(
        target,
        what="factory target",
        error=ConfigError,
        hint="install the distribution that provides it on every Ray node",
    )
    if not callable(obj):
        raise ConfigError(f"factory target {target!r} is not callable")
    return obj


@dataclass(frozen=True)
class Factory:
    """A picklable recipe ``target(**kwargs)``; the result (or its awaited value) is the hosted object.

    ``target`` is an import path so that a remote node imports the code it already has instead of
    unpickling a class from the driver; a plain callable also works (pickled by Ray).
    """

    target: str | Callable[..., Any]
    """``"module:attr"`` or a callable returning the object (sync or async)."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of ``target``; :meth:`build`'s identity arguments win over them."""

    async def build(self, **identity: Any) -> Any:
        """Call ``target(**identity, **kwargs)``, awaiting an awaitable result; errors name the target.

        ``identity`` is what the hosting actor knows (e.g. ``replica_id``, ``kind``) and wins over
        ``kwargs`` so that a replica cannot be built under another id.
        """
        fn = resolve_target(self.target)
        try:
            obj = fn(**{**dict(self.kwargs), **identity})
            if inspect.isawaitable(obj):
                obj = await obj
        except Exception as exc:
            name = self.target if isinstance(self.target, str) else getattr(self.target, "__qualname__", self.target)
            raise BackendError(f"factory {name!r} failed to build its object: {type(exc).__name__}: {exc}") from exc
        return obj
