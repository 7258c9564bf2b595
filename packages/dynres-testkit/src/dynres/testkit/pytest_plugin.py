"""pytest plugin of the dynres testkit (registered through the ``pytest11`` entry point).

* ``pytest --dynres-policy NAME_OR_PATH`` (repeatable) runs the conformance suite against an
  installed policy (registered name or ``module:Class``). Without test paths on the command line
  only the checks run, so no test file is needed; with paths, the checks run next to those tests.
  Test ids read ``check_name[policy]``. ``--dynres-no-e2e`` leaves out the simulator checks;
  ``--dynres-examples N`` sets how many generated runs each property check tries.
* Fixtures for policy authors: ``schedule_context``, ``context_strategy``, ``fake_replica``,
  ``fake_train_engine``, ``plugin_manager``.

pytest loads this module for every project in an environment where dynres-testkit is installed,
so it imports nothing from dynres (nor hypothesis or pydantic) until a fixture or the option is
used.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import pluggy

    from dynres.core.context import ScheduleContext

_SUITE_ID = "dynres-conformance"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--dynres-policy``, ``--dynres-no-e2e`` and ``--dynres-examples``."""
    group = parser.getgroup("dynres", "dynres policy conformance suite")
    group.addoption(
        "--dynres-policy",
        action="append",
        default=[],
        metavar="NAME_OR_PATH",
        help="run the dynres conformance checks against this policy (a registered name or "
        "'module:Class'); repeat for several policies",
    )
    group.addoption(
        "--dynres-no-e2e",
        action="store_true",
        default=False,
        help="leave out the end-to-end checks that run the dynres simulator",
    )
    group.addoption(
        "--dynres-examples",
        type=_examples,
        default=None,
        metavar="N",
        help="generated runs each property check of --dynres-policy tries, after the testkit's edge "
        "runs (default: dynres.testkit.checks.EXAMPLES); raise it to search further for a rare failure",
    )


def _examples(text: str) -> int:
    # argparse prints an ArgumentTypeError's message as the option's error.
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, not {text!r}")
    return value


def _policies(config: pytest.Config) -> list[str]:
    return list(config.getoption("dynres_policy", default=None) or [])


def _checks_only(config: pytest.Config) -> bool:
    # `pytest --dynres-policy x` with no paths must not wander through the current directory
    # (it may be /tmp or a project with unrelated tests): only the checks run then.
    return bool(_policies(config)) and config.args_source != pytest.Config.ArgsSource.ARGS


def pytest_ignore_collect(collection_path: Any, config: pytest.Config) -> bool | None:
    """In checks-only mode, collect nothing from the filesystem."""
    return True if _checks_only(config) else None


def wrap_to_terminal(text: str, width: int) -> str:
    """``text`` with each line folded to ``width`` columns (continuations indented two spaces), so a
    check's message reads whole in an 80-column terminal; long words (reprs, paths) are cut too."""
    import textwrap

    width = max(width, 40)
    return "\n".join(
        textwrap.fill(line, width, subsequent_indent="  ", break_on_hyphens=False) if len(line) > width else line
        for line in text.splitlines()
    )


class PolicyCheckItem(pytest.Item):
    """One conformance check run against one policy."""

    def __init__(
        self, *, spec: str, check: Callable[..., None], max_examples: int | None = None, **kwargs: Any
    ) -> None:
        """Keep the policy spec, the check function and its example budget (None: the check's default)."""
        super().__init__(**kwargs)
        self.spec = spec
        self.check = check
        self.max_examples = max_examples

    def runtest(self) -> None:
        """Run the check."""
        from dynres.testkit.checks import budget_kwargs

        self.check(self.spec, **budget_kwargs(self.check, self.max_examples))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        """Show a check failure as its message alone; anything else with pytest's traceback."""
        from dynres.testkit.checks import PolicyCheckFailure

        if isinstance(excinfo.value, PolicyCheckFailure):
            return wrap_to_terminal(str(excinfo.value), self.config.get_terminal_writer().fullwidth)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        """Point reports at the check function's source."""
        code = getattr(self.check, "__code__", None)
        where = code.co_filename if code else self.path
        return where, (code.co_firstlineno - 1 if code else None), self.name


class _ConformanceSuite(pytest.Collector):
    """Synthetic collector holding the checks of every ``--dynres-policy`` option."""

    def collect(self) -> Iterator[PolicyCheckItem]:
        """One item per (policy, check)."""
        from dynres.core.errors import DynresError
        from dynres.testkit.checks import policy_label, yield_policy_checks

        end_to_end = not self.config.getoption("dynres_no_e2e", default=False)
        examples = self.config.getoption("dynres_examples", default=None)
        for spec in _policies(self.config):
            try:
                checks = list(yield_policy_checks(spec, end_to_end=end_to_end))
            except DynresError as exc:
                raise pytest.UsageError(f"--dynres-policy {spec!r}: {exc}") from None
            label = policy_label(spec)
            for check in checks:
                item_id = f"{check.__name__}[{label}]"
                yield PolicyCheckItem.from_parent(
                    self, name=item_id, nodeid=item_id, spec=spec, check=check, max_examples=examples
                )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add the conformance items before -k/-m selection sees the list."""
    if not _policies(config):
        return
    suite = _ConformanceSuite.from_parent(session, name=_SUITE_ID, nodeid=_SUITE_ID)
    checks = list(suite.collect())
    # Report them like any collected node so "collected N items" counts them.
    result: list[pytest.Item | pytest.Collector] = list(checks)
    session.ihook.pytest_collectreport(report=pytest.CollectReport(_SUITE_ID, "passed", None, result))
    items.extend(checks)


# ---- Fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def schedule_context() -> ScheduleContext:
    """A valid mid-run ScheduleContext (see dynres.testkit.strategies.sample_context)."""
    from dynres.testkit.strategies import sample_context

    return sample_context()


@pytest.fixture
def context_strategy() -> Any:
    """The hypothesis strategy of valid ScheduleContexts (dynres.testkit.strategies.schedule_contexts())."""
    from dynres.testkit.strategies import schedule_contexts

    return schedule_contexts()


@pytest.fixture
def fake_replica() -> Any:
    """A fake standalone replica from dynres.testkit.fakes, for tests of code that drives replicas."""
    from dynres.testkit import fakes

    return fakes.FakeReplica("fake-0")


@pytest.fixture
def fake_train_engine() -> Any:
    """A fake train engine from dynres.testkit.fakes."""
    from dynres.testkit import fakes

    return fakes.FakeTrainEngine()


@pytest.fixture
def plugin_manager() -> pluggy.PluginManager:
    """A fresh dynres plugin manager without entry-point plugins (get_plugin_manager(load_plugins=False))."""
    from dynres.core.plugins import get_plugin_manager

    return get_plugin_manager(load_plugins=False)
