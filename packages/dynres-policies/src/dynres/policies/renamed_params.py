"""Deprecated param names that still load: moved to their current names, with a FutureWarning."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from types import FrameType
from typing import Any

__all__ = ["move_renamed_params"]

_PARAMS_PLUMBING = ("pydantic", "dynres.core", "dynres.policies")
"""Modules between the code that passes a policy's params and the Params validator."""


def move_renamed_params(data: Any, renamed: Mapping[str, str], policy: str) -> Any:
    """``data`` (a Params validator's raw input) with each old name of ``renamed`` (old -> new)
    moved to its new name and a FutureWarning naming ``policy``; a mapping giving both is refused."""
    # extra="forbid" rejects the old names, so they are moved before validation.
    if not isinstance(data, Mapping) or not renamed.keys() & data.keys():
        return data
    data = dict(data)
    for old, new in renamed.items():
        if old not in data:
            continue
        if new in data:
            raise ValueError(f"{old!r} is the deprecated name of {new!r}; give only {new!r}")
        warnings.warn(
            f"{policy} param {old!r} is deprecated; rename it to {new!r}",
            FutureWarning,
            stacklevel=_caller_stacklevel(),
        )
        data[new] = data.pop(old)
    return data


def _caller_stacklevel() -> int:
    # The stacklevel (as the function that calls this one passes it to warnings.warn) of the first
    # frame outside pydantic and dynres's policy construction: the warning then points at the code
    # that passed the old name, not at pydantic's internals.
    level = 2
    caller: FrameType | None = sys._getframe(2)  # 0: this function, 1: the one that warns
    while caller is not None and caller.f_globals.get("__name__", "").startswith(_PARAMS_PLUMBING):
        level, caller = level + 1, caller.f_back
    return level
