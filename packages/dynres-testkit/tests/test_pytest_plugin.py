"""The pytest plugin: --dynres-policy, the fixtures, and its import cost."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest_plugins = ["pytester"]

BROKEN = "dynres.testkit.broken_policies"


@pytest.mark.slow
def test_policy_option_runs_the_suite_without_test_files(pytester: pytest.Pytester) -> None:
    # A failing test file in the directory proves that checks-only mode collects nothing else.
    pytester.makepyfile(test_unrelated="def test_x():\n    assert False\n")
    result = pytester.runpytest("--dynres-policy", "default", "--dynres-no-e2e", "-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=17)
    result.stdout.fnmatch_lines(["*collected 17 items*", "check_policy_api[[]default[]] PASSED*"])
    assert "test_unrelated" not in result.stdout.str()


def test_policy_option_with_paths_runs_both(pytester: pytest.Pytester) -> None:
    path = pytester.makepyfile(test_mine="def test_mine():\n    pass\n")
    result = pytester.runpytest(
        "--dynres-policy", "static_fully_async", "--dynres-no-e2e", str(path), "-k", "mine or api"
    )
    result.assert_outcomes(passed=2)


def test_failures_show_the_check_message(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        "--dynres-policy",
        f"{BROKEN}:QueueFloorPolicy",
        "--dynres-policy",
        "fixed_ratio",
        "--dynres-no-e2e",
        "-k",
        "only_hybrid",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*should_activate_after_step returned False in an only-hybrid cluster*",
            f"FAILED check_only_hybrid_never_deadlocks[[]{BROKEN}:QueueFloorPolicy[]]*",
        ]
    )
    assert "Traceback" not in result.stdout.str()


def test_unknown_policy_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--dynres-policy", "defualt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dynres-policy 'defualt': unknown policy*did you mean 'default'*"])


def test_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        textwrap.dedent(
            """
            import asyncio
            from hypothesis import given, settings
            from dynres.core import ScheduleContext, get_plugin_manager
            from dynres.core.hookspecs import DECISION_HOOKS

            def test_context(schedule_context):
                assert isinstance(schedule_context, ScheduleContext)
                assert schedule_context.is_hybrid_active

            def test_strategy(context_strategy):
                @settings(max_examples=5, database=None)
                @given(context_strategy)
                def inner(ctx):
                    assert isinstance(ctx, ScheduleContext)
                inner()

            def test_fakes(fake_replica, fake_train_engine):
                asyncio.run(fake_replica.health())
                assert fake_train_engine.costs() is not None

            def test_plugin_manager(plugin_manager):
                assert plugin_manager.project_name == "dynres"
                assert all(hasattr(plugin_manager.hook, h) for h in DECISION_HOOKS)
                assert plugin_manager.get_plugins() == set()
            """
        )
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)


def test_plugin_import_is_cheap() -> None:
    code = (
        "import sys; import dynres.testkit.pytest_plugin; "
        "heavy = [m for m in ('dynres.core', 'dynres.runtime', 'dynres.testkit.checks', 'hypothesis', "
        "'pydantic') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_end_to_end_checks_show_as_skips_for_a_refused_class(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--dynres-policy", f"{BROKEN}:MisnamedPolicy", "-rs")
    result.assert_outcomes(failed=1, passed=16, skipped=3)
    result.stdout.fnmatch_lines(["*fails check_policy_api; fix that first*"])


COUNTING_POLICY = """
from pathlib import Path
from dynres.testkit.broken_policies import _Sound

class Counting(_Sound):
    name = "counting"

    def __init__(self, params=None):
        super().__init__(params)
        with Path(__file__).with_name("built.txt").open("a") as log:
            log.write("x")
"""


@pytest.mark.parametrize("examples", [2, 30])
def test_examples_option_sets_the_budget_of_each_property_check(pytester: pytest.Pytester, examples: int) -> None:
    # check_decision_types builds one policy per run: the edge runs, then the generated ones.
    from dynres.testkit.strategies import edge_runs

    pytester.makepyfile(counting_policy=COUNTING_POLICY)
    pytester.syspathinsert()
    result = pytester.runpytest(
        "--dynres-policy", "counting_policy:Counting", "--dynres-examples", str(examples), "-k", "decision_types"
    )
    result.assert_outcomes(passed=1)
    runs = len((pytester.path / "built.txt").read_text())
    assert runs - len(edge_runs()) == examples


def test_examples_option_rejects_a_count_below_one(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--dynres-policy", "default", "--dynres-examples", "0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dynres-examples: expected a whole number of at least 1, not '0'*"])
