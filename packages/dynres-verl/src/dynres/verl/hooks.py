"""The ``dynres.plugins`` entry point: dynres's policy resolver asks it about ``verl:<name>``."""

from __future__ import annotations

from dynres.core import Policy, hookimpl


@hookimpl
def dynres_resolve_policy(name: str) -> type[Policy] | None:
    """Return the wrapper of verl's policy for ``verl:<name>``; None for every other name."""
    if not name.startswith("verl:"):
        return None
    from dynres.verl.wrapper import dynres_wrapper_class

    return dynres_wrapper_class(name[len("verl:") :])
