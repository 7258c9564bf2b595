"""The runs of one ``dynres simulate``, resolved and validated before any of them is simulated.

Runs are numbered as the results table numbers them: 1 is the main run, then one per compared
policy (the main scenario with another policy), then one per compared scenario (with its own
policy). Overrides apply in this order, a later one winning: the ``--config`` file's keys, the
``--set`` items (every run), the ``--set-run N`` items (run N); ``--seed`` then replaces every
run's seed and ``--policy`` names the main run's policy. Every scenario is loaded, every policy
built and every tracking backend of ``trainer.logger`` checked here, so a typo in the last run
fails before the first run starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dynres.core import Policy
from dynres.core.config import (
    DynresConfig,
    drop_verl_only_keys,
    ignored_verl_keys_line,
    parse_set_items,
    read_yaml,
    shorthand_overrides,
    validate_model,
)
from dynres.core.errors import ConfigError, ScenarioError
from dynres.core.tracking import TrackingBackend
from dynres.runtime.sim.runner import HOSTS, build_policy, run_label
from dynres.runtime.sim.scenario import Scenario, config_overrides, load_scenario
from dynres.runtime.tracking import resolve_backends

POLICY_KEY = "async_training.dynamic_schedule_policy"
"""The scenario key ``--policy`` stands for."""


@dataclass(frozen=True)
class PlannedRun:
    """One simulation of a plan: its validated scenario and the policy it runs."""

    number: int
    """Its number in the table (1-based; 1 = the main run)."""
    source: str
    """The preset name or scenario file it was loaded from."""
    policy_spec: str | None
    """The policy named for it (``--policy`` / ``--compare-policy``); None: the scenario's own."""
    scenario: Scenario
    """The scenario after every override and the seed."""
    policy: Policy | str
    """The built policy (it keeps state while it runs, so a plan is simulated once); with host
    ``verl``, its name in verl's registry (verl builds it)."""
    host: str = "dynres"
    """Who drives the run: ``dynres`` or ``verl`` (see :mod:`dynres.runtime.sim.verl_host`)."""
    tracking: tuple[TrackingBackend, ...] = ()
    """The backends the scenario's ``trainer.logger`` names, checked (their packages are installed)."""

    @property
    def label(self) -> str:
        """``scenario[policy]``, as tables, JSON and plots name the run."""
        if isinstance(self.policy, str):
            from dynres.runtime.sim.verl_host import host_label

            return run_label(self.scenario.name, host_label(self.policy))
        return run_label(self.scenario.name, self.policy.name)

    def fresh_policy(self) -> Policy | str:
        """The run's policy built anew (a policy keeps state while it runs; a verl name is built by verl)."""
        return self.policy if isinstance(self.policy, str) else build_policy(self.scenario, self.policy_spec)


@dataclass(frozen=True)
class SimPlan:
    """Every run of one ``dynres simulate``, in table order."""

    runs: tuple[PlannedRun, ...]
    """The runs (at least one: the main run)."""
    seeds: int = 1
    """Seeds per run (count): above 1, each run is repeated with the seeds that follow its own."""

    @property
    def writes_tracking_files(self) -> bool:
        """True when a run's ``trainer.logger`` names a backend that writes files (it needs a folder)."""
        return any(b.writes_files for run in self.runs for b in run.tracking)


def plan_simulations(
    source: str,
    *,
    is_preset: bool = False,
    policy: str | None = None,
    compare_policies: Sequence[str] = (),
    compare: Sequence[str] = (),
    sets: Sequence[str] = (),
    run_sets: Sequence[tuple[str, str]] = (),
    config_file: str | None = None,
    strict: bool = False,
    seed: int | None = None,
    seeds: int = 1,
    on_ignored: Callable[[str], Any] | None = None,
    host: str = "dynres",
) -> SimPlan:
    """Resolve and validate every run; raise a DynresError naming the bad input and the fix.

    :param source: the main run's preset name or scenario file (``is_preset``: it must be a preset).
    :param sets: ``KEY=VALUE`` items for every run; ``run_sets``: ``(N, KEY=VALUE)`` for run N.
    :param config_file: a dynres or verl config whose modelled keys apply to every run, before
        ``sets``; ``strict`` rejects the verl keys dynres does not model, else they are dropped
        and named in one line passed to ``on_ignored``.
    :param seed: replaces every run's seed; ``seeds``: seeds per run (count).
    :param host: ``dynres``, or ``verl`` (policies named as verl's registry names them, every run
        driven by verl's trainer order and controller).
    """
    if host not in HOSTS:
        raise ConfigError(f"--host {host}: unknown host; choose one of {', '.join(HOSTS)}")
    overrides = parse_set_items(sets)
    base = _config_file_overrides(config_file, strict, on_ignored) if config_file else {}
    shorthand_overrides(overrides, (("--seed", "seed", seed), ("--policy", POLICY_KEY, policy)))
    if is_preset:
        from dynres.runtime.sim import presets

        if not presets.is_preset(source):
            presets.preset_raw(source)  # raises the unknown-preset error with a did-you-mean
    specs: list[tuple[str, str | None]] = [
        (source, policy),
        *((source, p) for p in compare_policies),
        *((c, None) for c in compare),
    ]
    per_run = _run_overrides(run_sets, len(specs))
    scenarios = [
        load_scenario(src, overrides={**base, **overrides, **per_run.get(i, {})}) for i, (src, _) in enumerate(specs)
    ]
    if seed is not None:
        scenarios = [s.model_copy(update={"seed": seed}) for s in scenarios]
    tracking = [
        resolve_backends(sc.trainer.logger, where=f"run #{i} trainer.logger") for i, sc in enumerate(scenarios, 1)
    ]
    if host == "verl":
        runs = tuple(
            PlannedRun(i, src, spec, sc, _verl_policy(sc, spec), host, tr)
            for i, (sc, (src, spec), tr) in enumerate(zip(scenarios, specs, tracking, strict=True), start=1)
        )
        return SimPlan(runs, seeds)
    if policy:
        _check_policy_has_hybrids(scenarios[0], policy)
    runs = tuple(
        PlannedRun(i, src, spec, sc, build_policy(sc, spec), tracking=tr)
        for i, (sc, (src, spec), tr) in enumerate(zip(scenarios, specs, tracking, strict=True), start=1)
    )
    return SimPlan(runs, seeds)


def _verl_policy(scenario: Scenario, spec: str | None) -> str:
    """The run's policy name in verl's registry, checked; a scenario without hybrids is refused."""
    from dynres.runtime.sim.verl_host import check_verl_policy

    if not scenario.async_training.use_dynamic_resource_scheduling:
        raise ScenarioError(
            f"--host verl: scenario {scenario.name!r} has async_training.use_dynamic_resource_scheduling: "
            "false, and verl builds no dynamic-schedule policy then; add --set "
            "async_training.use_dynamic_resource_scheduling=true"
        )
    name = spec or scenario.async_training.dynamic_schedule_policy
    check_verl_policy(name)
    return name


def _config_file_overrides(path: str, strict: bool, on_ignored: Callable[[str], Any] | None) -> dict[str, Any]:
    """The scenario keys config file ``path`` sets; verl-only keys dropped (and named) unless strict."""
    data = read_yaml(path)
    if not strict:
        data, removed = drop_verl_only_keys(data, DynresConfig)
        if removed and on_ignored is not None:
            on_ignored(ignored_verl_keys_line(removed, path))
    return config_overrides(validate_model(DynresConfig, data, path))


def _run_overrides(items: Sequence[tuple[str, str]], count: int) -> dict[int, dict[str, Any]]:
    """``--set-run N KEY=VALUE`` items as {run index (0-based): overrides}; bad run numbers fail here."""
    by_run: dict[int, list[str]] = {}
    for run, item in items:
        if not run.isdigit() or not 1 <= int(run) <= count:
            raise ConfigError(
                f"--set-run {run} {item}: no run #{run}; runs are numbered 1..{count} in the order "
                "main run, --compare-policy runs, --compare runs (the table's # column)"
            )
        by_run.setdefault(int(run) - 1, []).append(item)
    return {i: parse_set_items(tuple(v)) for i, v in by_run.items()}


def _check_policy_has_hybrids(scenario: Scenario, policy: str) -> None:
    """Refuse a dynamic policy on a scenario without hybrid replicas: it would run as the static one."""
    if scenario.async_training.use_dynamic_resource_scheduling:
        return
    chosen = build_policy(scenario, policy).name
    if chosen != "static_fully_async":
        raise ScenarioError(
            f"--policy {policy}: scenario {scenario.name!r} has "
            "async_training.use_dynamic_resource_scheduling: false, so it has no hybrid "
            f"replicas and {chosen!r} would run exactly like static_fully_async; add --set "
            "async_training.use_dynamic_resource_scheduling=true"
        )
