"""Load a script of the repository's benchmarks/ folder as a module, for tests of its rules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def load_bench(script: str) -> ModuleType:
    """Import ``benchmarks/<script>`` under a private name; skip when the checkout has no benchmarks/."""
    path = BENCHMARKS / script
    if not path.is_file():
        pytest.skip("benchmarks/ is not in this checkout (an installed package's tests)")
    spec = importlib.util.spec_from_file_location(f"{path.stem}_under_test", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = saved  # a script may put benchmarks/ on sys.path for its own imports
    return mod
