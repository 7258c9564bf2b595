"""How the conformance suite reports a broken policy (issue 30, rough edges 9 and 12): one root cause
is one failure, and the failure message reads whole in an 80-column terminal."""

from __future__ import annotations

import pytest

from dynres.testkit.pytest_plugin import wrap_to_terminal

pytest_plugins = ["pytester"]

BROKEN = "dynres.testkit.broken_policies:RequiredParamPolicy"


def test_a_policy_that_cannot_be_built_fails_once_and_the_rest_skip(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    result = pytester.runpytest("--dynres-policy", BROKEN, "--dynres-no-e2e", "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 1 and outcomes["skipped"] >= 10, result.outlines
    result.stdout.fnmatch_lines(["*RequiredParamPolicy() raised PolicyParamsError*"])
    lines = result.outlines
    start = next(i for i, ln in enumerate(lines) if ln.startswith("_ check_constructible_with_defaults"))
    end = next(i for i, ln in enumerate(lines) if i > start and ln.startswith("===="))
    message = lines[start + 1 : end]
    assert len(message) >= 3  # folded, not one line of 270 characters
    assert all(len(ln) <= 80 for ln in message), message
    assert "give every Params field a default" in " ".join(message)


def test_wrap_to_terminal_keeps_short_lines_and_folds_long_ones() -> None:
    assert wrap_to_terminal("short\nlines", 80) == "short\nlines"
    folded = wrap_to_terminal("word " * 40, 50).splitlines()
    assert len(folded) > 1 and all(len(ln) <= 50 for ln in folded) and folded[1].startswith("  ")
