"""Fixtures of the dynres-core tests: throwaway installed distributions and small builders."""

from __future__ import annotations

import itertools
import re
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from dynres.core import clear_policy_cache


@dataclass
class FakeDist:
    """A distribution written into a temporary site directory."""

    name: str
    site: Path
    modules: dict[str, str]
    """Short module name used by the test -> the unique module name actually written."""

    def module(self, short: str) -> str:
        """The real (unique) import name of the module the test called ``short``."""
        return self.modules[short]


def _rewrite_value(value: str, modules: Mapping[str, str]) -> str:
    mod, sep, attr = value.partition(":")
    return f"{modules.get(mod, mod)}{sep}{attr}"


@pytest.fixture
def make_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., FakeDist]]:
    """Build throwaway distributions (dist-info + modules) that importlib.metadata will find.

    Module names get a unique suffix because sys.modules outlives a test; entry-point values
    name modules by their short names and are rewritten to the unique ones. Each call may use
    its own site directory (``site=``) so one distribution can appear twice on sys.path.
    ``clear=False`` skips the policy-cache reset, as if installed behind the process's back.
    """
    written: list[str] = []
    sites: dict[str, Path] = {}
    counter = itertools.count()
    tag = uuid.uuid4().hex[:8]

    def build(
        name: str,
        *,
        modules: Mapping[str, str] = {},
        policies: Mapping[str, str] = {},
        plugins: Mapping[str, str] = {},
        version: str = "1.0",
        site: str = "site",
        clear: bool = True,
    ) -> FakeDist:
        root = sites.get(site)
        if root is None:
            root = tmp_path / site
            root.mkdir()
            sites[site] = root
            monkeypatch.syspath_prepend(str(root))
        real = {short: f"{short}_{tag}_{next(counter)}" for short in modules}
        for short, source in modules.items():
            (root / f"{real[short]}.py").write_text(textwrap.dedent(source), encoding="utf-8")
            written.append(real[short])
        info = root / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
        lines = []
        for group, eps in (("dynres.policies", policies), ("dynres.plugins", plugins)):
            if eps:
                lines.append(f"[{group}]")
                lines += [f"{ep} = {_rewrite_value(v, real)}" for ep, v in eps.items()]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        if clear:
            clear_policy_cache()
        return FakeDist(name, root, real)

    clear_policy_cache()
    yield build
    for mod in written:
        sys.modules.pop(mod, None)
    monkeypatch.undo()  # take the site dirs off sys.path before rescanning
    clear_policy_cache()
