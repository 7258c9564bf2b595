"""Helpers every real engine shares: lazy imports of the optional dependencies, mean operation times."""

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


class RunningMean:
    """Running mean of one operation's duration (seconds), for an engine's ``costs()`` estimates."""

    __slots__ = ("count", "total")

    def __init__(self) -> None:
        """Start with no durations recorded."""
        self.total = 0.0
        self.count = 0

    def add(self, seconds: float) -> None:
        """Record one duration (seconds)."""
        self.total += seconds
        self.count += 1

    @property
    def mean(self) -> float | None:
        """Mean duration (seconds), or None before the first record (the cost is still unknown)."""
        return self.total / self.count if self.count else None
