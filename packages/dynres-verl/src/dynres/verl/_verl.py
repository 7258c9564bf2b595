"""Where dynres-verl finds verl's dynamic-schedule module (imported lazily, with a one-line error)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from dynres.core.errors import PolicyImportError, PolicyNotFoundError, did_you_mean

SCHEDULE_MODULE = "verl.experimental.fully_async_policy.dynamic_schedule"
"""verl's package holding the policy registry, the context dataclass and the controller."""

TESTED_VERL = ">=0.9.1,<0.10"
"""The verl versions this bridge is tested against (the distribution's requirement)."""


def schedule_module() -> ModuleType:
    """Import verl's dynamic-schedule package; raise PolicyImportError naming the fix when it fails."""
    try:
        return importlib.import_module(SCHEDULE_MODULE)
    except Exception as exc:  # verl missing, or verl's own imports (torch, ray) failing
        raise PolicyImportError(
            f"verl's dynamic-schedule module {SCHEDULE_MODULE!r} failed to import "
            f"({type(exc).__name__}: {exc}); install a supported verl with "
            f"`pip install 'verl{TESTED_VERL}'` (dynres-verl requires it)"
        ) from exc


def registry() -> dict[str, type[Any]]:
    """verl's live policy registry (name -> class); the dict verl's build_policy reads."""
    return schedule_module().base._policy_registry


def registered_verl_class(name: str) -> type[Any]:
    """Return the class verl registered as ``name``; raise PolicyNotFoundError listing verl's names.

    verl 0.9.1 ships ``fixed_ratio_policy.py`` but never imports it, so its policy is missing
    from the registry; a name not registered yet is looked up once more after importing
    ``<name>_policy`` from verl's package, which registers it.
    """
    reg = registry()
    if name not in reg:
        try:
            importlib.import_module(f"{SCHEDULE_MODULE}.{name}_policy")
        except ImportError:
            pass
    if name not in reg:
        raise PolicyNotFoundError(
            f"verl has no dynamic-schedule policy {name!r}{did_you_mean(name, reg)}; verl's "
            f"registered policies: {', '.join(sorted(reg)) or '(none)'}; name one of them as 'verl:<name>'"
        )
    return reg[name]
