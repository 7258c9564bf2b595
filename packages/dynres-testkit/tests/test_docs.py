"""The user docs link only to pages that exist, and every conformance check has a row.

The hook/context meta-tests live in dynres-core's tests, the built-in params one in dynres-policies'.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dynres.testkit.checks import all_checks

DOCS = Path(__file__).resolve().parents[3] / "docs"
MINE = [
    "index.md",
    "installing.md",
    "policy-api.md",
    "writing-a-policy.md",
    "testing-a-policy.md",
    "builtin-policies.md",
]

pytestmark = pytest.mark.skipif(not DOCS.is_dir(), reason="docs/ is only in a checkout of the repository")


def _text(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _table_keys(text: str) -> set[str]:
    """Names in the first column of markdown tables, written as `name`."""
    return set(re.findall(r"^\|\s*`([A-Za-z_][A-Za-z0-9_]*)`", text, flags=re.MULTILINE))


@pytest.mark.parametrize("name", MINE)
def test_doc_exists_and_links_resolve(name: str) -> None:
    text = _text(name)
    for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", text):
        assert (DOCS / target).is_file(), f"{name} links to {target}, which does not exist"


def test_every_check_is_documented() -> None:
    documented = _table_keys(_text("testing-a-policy.md"))
    missing = [c.__name__ for c in all_checks() if c.__name__ not in documented]
    assert not missing, f"docs/testing-a-policy.md has no table row for check(s) {missing}"
