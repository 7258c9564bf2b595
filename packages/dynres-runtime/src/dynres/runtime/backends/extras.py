"""Lazy imports of the optional engine dependencies (the runtime's extras)."""

from __future__ import annotations

import importlib
from types import ModuleType

from dynres.core.errors import MissingExtraError


def require_module(name: str, extra: str) -> ModuleType:
    """Import ``name`` or raise MissingExtraError telling to install ``dynres-runtime[extra]``."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise MissingExtraError(name, extra) from exc
