"""The fit: one walk over the scenario's sections for every metrics format.

:func:`fit_scenario` reads the run through its format's adapter (:mod:`.formats`) and runs the
sections of :data:`SECTIONS` in the order the format names. Each section is written once and
asks the adapter for what differs: metric names, whether the format has a fact at all, and the
words of its notes. Every value goes into an :class:`~.provenance.AnnotatedScenario` with the
note of where it came from, so the result is a scenario the reader can audit key by key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynres.core.config import DynresConfig, drop_verl_only_keys, read_yaml, validate_model
from dynres.core.errors import ConfigError, MetricsError
from dynres.runtime.renamed_keys import RENAMED_REPORT_KEYS, RENAMED_RUN_KEYS, upgrade_keys
from dynres.runtime.sim.fit.costs import fit_switch_costs, op_mean
from dynres.runtime.sim.fit.formats import FORMATS, DerivedConfig, Lengths, MetricsFormat, config_value
from dynres.runtime.sim.fit.provenance import AnnotatedScenario, scenario_yaml
from dynres.runtime.sim.fit.replicas import fit_hybrid_speed, fit_peak, fit_shared_host
from dynres.runtime.sim.fit.stats import (
    MIN_CYCLES,
    linear_trend,
    mean_spread,
    median_for_capped_mean,
    spread_note,
)
from dynres.runtime.sim.metrics_io import RunMetrics
from dynres.runtime.sim.scenario import Scenario, load_scenario
from dynres.runtime.sim.workload import reference_batch_tokens

DRIFT_MIN_SIGMAS = 2.0
"""A length drift is kept only when the fitted slope is this many standard errors from 0 (count)."""

SECTION_ORDER = ("description", "steps", "seed", "async_training", "actor_rollout_ref", "cluster", "workload", "costs")
"""Top-level sections of the written scenario, in the order of a hand-written one."""


@dataclass
class FitResult:
    """A fitted scenario: its raw mapping, the provenance of every key, and the measured run."""

    scenario: dict[str, Any]
    """The scenario mapping (sections as in a scenario YAML)."""
    notes: dict[str, str]
    """Dotted key -> where its value came from and how well it is determined."""
    missing: list[str]
    """One line per needed metric the run lacked: the metric, the key and the default used."""
    source: Path
    """The metrics file fitted."""
    format: str
    """``dynres`` or ``verl``."""
    cycles: int
    """Sync cycles fitted (count)."""
    measured_end_to_end_s: float
    """The run's measured end-to-end time (seconds; verl: sum of the cycles' step times)."""
    first_cycle_start_s: float
    """Measured run-clock time the first cycle started (seconds; 0 for verl, which does not log it)."""
    measured_policy: str
    """The policy the run used (its config's dynamic_schedule_policy or report.json's policy)."""
    header: list[str] = field(default_factory=list)
    """Lines for the top of the YAML: source, measured times, caveats."""

    def load(self, overrides: Mapping[str, Any] | None = None) -> Scenario:
        """The validated Scenario (``overrides``: dotted keys, what ``--set`` passes)."""
        return load_scenario(self.scenario, overrides=overrides)

    def to_yaml(self) -> str:
        """The scenario as commented YAML: a header, then each key with its provenance."""
        return scenario_yaml(self.scenario, self.notes, self.header, self.missing)


def config_from_file(path: str | Path) -> tuple[dict[str, Any], str]:
    """A run config mapping from a dynres or verl YAML (verl-only keys dropped) and its label."""
    data = read_yaml(path)
    if not isinstance(data, Mapping):
        raise ConfigError(f"--config {path}: expected a mapping of keys at the top level; give a dynres or verl config")
    return dict(data), str(path)


def _dynres_config(raw: Mapping[str, Any] | None, source: str) -> DynresConfig | None:
    """The dynres sections of a run config, validated; None when it has none."""
    if raw is None:
        return None
    sections = {k: raw[k] for k in ("async_training", "actor_rollout_ref", "trainer", "rollout") if k in raw}
    if not sections:
        return None
    sections, _ = drop_verl_only_keys(sections, DynresConfig)
    return validate_model(DynresConfig, sections, source)


@dataclass
class _Fit:
    """One fit in progress: the run, its format's adapter, and what the sections pass on."""

    run: RunMetrics
    """The run fitted."""
    fmt: MetricsFormat
    """Its format's adapter."""
    cfg: DynresConfig | None
    """The run config's dynres sections; None: derived from the records."""
    csrc: str
    """The run config's label for notes ('' without one)."""
    lengths: Lengths
    """The run's response lengths, read before any section (every fit needs them)."""
    costs_from: Mapping[str, Any] | None
    """Another dynres run's report.json (``--costs-from``), or None."""
    costs_source: str
    """Its label for notes."""
    scenario: AnnotatedScenario = field(default_factory=AnnotatedScenario)
    """The scenario fitted so far, each value with its note."""
    peak: float = 0.0
    """The fitted decode.peak_tokens_per_s (tokens/s)."""
    hybrid_generated: bool = False
    """The run's hybrid replicas generated in some cycle."""
    solved_hybrid: float | None = None
    """hybrid_speed_factor as solved from --costs-from before clamping (None = not solved)."""
    _settled: Scenario | None = None

    def settled(self) -> Scenario:
        """The scenario as loaded once batch, cluster, lengths and prompt are set: what the speed
        and trainer sections read (loaded once; a bad value fails here, named)."""
        if self._settled is None:
            self._settled = load_scenario(self.scenario.raw)
        return self._settled


def fit_scenario(
    run: RunMetrics,
    *,
    config: Mapping[str, Any] | None = None,
    config_source: str = "",
    costs_from: Mapping[str, Any] | None = None,
    costs_source: str = "",
) -> FitResult:
    """Fit a scenario to ``run``; ``config`` (a dynres or verl config mapping) replaces the run's own.

    ``costs_from`` is another dynres run's report.json (same engines): the switch operations
    ``run`` never performed in a cycle (sleep, wake_up, abort, offload, onload) take their mean
    durations from its cycles, ahead of ``run``'s own switch calibration (see
    :func:`~.costs.fit_switch_costs`); its cycles with hybrid replicas generating fit
    ``hybrid_speed_factor``; ``costs_source`` names it in the comments.

    Raises MetricsError when the run has fewer than MIN_CYCLES cycles or lacks the metrics
    every fit needs (a cycle time, and response lengths).
    """
    if config is not None:
        # A run file's renamed keys (``cluster:``) are read under their new names, with a warning.
        source = config_source or "--config"
        run.config, run.config_source = dict(upgrade_keys(config, RENAMED_RUN_KEYS, source)), source
    if costs_from is not None:
        where = costs_source or "--costs-from"
        costs_from = upgrade_keys(costs_from, RENAMED_REPORT_KEYS, where, written_by_dynres=True)
    if len(run.cycles) < MIN_CYCLES:
        raise MetricsError(
            f"metrics {run.path}: {len(run.cycles)} sync cycle(s); a fit needs at least {MIN_CYCLES}, "
            "let the run go on longer"
        )
    fmt = FORMATS[run.format]
    cfg = _dynres_config(run.config, run.config_source)
    f = _Fit(
        run=run,
        fmt=fmt,
        cfg=cfg,
        csrc=f"run config ({Path(run.config_source).name})" if cfg is not None else "",
        lengths=fmt.lengths(run),  # a run without them fails before any section is fitted
        costs_from=costs_from,
        costs_source=costs_source or "another run's report.json",
    )
    for name in fmt.section_order:
        SECTIONS[name](f)
    return _result(f)


# ---- The run config ------------------------------------------------------------------------------

_CONFIG_ASYNC_KEYS = (
    "use_dynamic_resource_scheduling",
    "dynamic_schedule_policy",
    "staleness_threshold",
    "trigger_parameter_sync_step",
    "require_batches",
    "partial_rollout",
    "concurrent_samples_per_replica",
)
"""async_training keys a fit always writes from a run config, set or not (the rest only when set)."""


def _fit_run_config(f: _Fit) -> None:
    """The async_training, actor_rollout_ref and cluster sections: the run config, else what the
    records tell; the policy that ran names the run's policy either way."""
    derived = f.fmt.derived_config(f.run)
    if f.cfg is not None:
        _config_from_file(f.scenario, f.cfg, f.csrc)
        if derived.policy:
            policy, note = derived.policy
            f.scenario.set("async_training.dynamic_schedule_policy", policy, f"{note} (the policy that ran)")
    else:
        _config_derived(f.scenario, derived)


def _config_from_file(a: AnnotatedScenario, cfg: DynresConfig, csrc: str) -> None:
    """The run config's async_training keys (defaults of the always-written ones included), batch and cluster split."""
    for key in _CONFIG_ASYNC_KEYS:
        a.set(f"async_training.{key}", getattr(cfg.async_training, key), csrc)
    for key, value in cfg.async_training.model_dump(exclude_unset=True).items():
        if f"async_training.{key}" not in a.notes:
            a.set(f"async_training.{key}", value, csrc)
    a.set("actor_rollout_ref.actor.ppo_mini_batch_size", cfg.actor_rollout_ref.actor.ppo_mini_batch_size, csrc)
    a.set("actor_rollout_ref.rollout.n", cfg.actor_rollout_ref.rollout.n, csrc)
    a.set("cluster.trainer_gpus", cfg.trainer.n_gpus, csrc)
    a.set("cluster.rollout_gpus", cfg.rollout.n_gpus, csrc)
    a.set("cluster.gpus_per_replica", cfg.actor_rollout_ref.rollout.tensor_model_parallel_size, csrc)


def _config_derived(a: AnnotatedScenario, d: DerivedConfig) -> None:
    """What the records tell of the config; each key they do not tell keeps its default, named."""
    policy = d.policy
    if policy is None and d.dynamic is not None and not d.dynamic[0]:
        policy = ("static_fully_async", "[D] dynamic scheduling was off")
    derived: tuple[tuple[str, tuple[Any, str] | None, str], ...] = (
        ("async_training.trigger_parameter_sync_step", d.trigger, "the run config's trigger_parameter_sync_step"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", d.required, "the run config's ppo_mini_batch_size"),
        ("actor_rollout_ref.rollout.n", d.n, "the run config's rollout.n"),
        ("async_training.staleness_threshold", d.staleness, "the run config's staleness_threshold"),
        ("async_training.dynamic_schedule_policy", policy, "the run config's dynamic_schedule_policy"),
        (
            "async_training.use_dynamic_resource_scheduling",
            d.dynamic,
            "the run config's use_dynamic_resource_scheduling",
        ),
    )
    for key, got, metric in derived:
        if got is None:
            a.default(key, metric + " (give --config)")
        else:
            a.set(key, got[0], got[1])
    if d.required is not None:
        a.set("async_training.require_batches", 1, "with ppo_mini_batch_size = samples per fit step")
    a.default("async_training.partial_rollout", "the run config's partial_rollout (give --config)")
    a.default("async_training.concurrent_samples_per_replica", "the run config's concurrent_samples_per_replica")
    if d.cluster is None:
        for key in ("cluster.trainer_gpus", "cluster.rollout_gpus", "cluster.gpus_per_replica"):
            a.default(key, "the cluster split (give --config with trainer/rollout GPU counts)")
    else:
        t, r, g, note = d.cluster
        a.set("cluster.trainer_gpus", t, note)
        a.set("cluster.rollout_gpus", r, note)
        a.set("cluster.gpus_per_replica", g, note)


def _fit_cycles(f: _Fit) -> None:
    """``steps`` (the run's sync cycles) and the workload seed."""
    f.scenario.set("steps", len(f.run.cycles), f.fmt.cycles_note(f.run))
    f.scenario.set("seed", 0, "workload RNG seed (compare with --seeds for the spread over draws)")


# ---- The workload ----------------------------------------------------------------------------------


def _fit_lengths(f: _Fit) -> None:
    """median_tokens, growth_per_step, sigma and group_correlation of the response lengths."""
    a, fmt, lengths = f.scenario, f.fmt, f.lengths
    if lengths.log_means:
        _fit_drift(a, lengths.log_means, fmt.log_drift_what)
        stds = lengths.log_stds
        sigma = math.sqrt(sum(s * s for s in stds) / len(stds))
        a.set(
            "workload.response.sigma",
            round(min(sigma, 4.0), 6),
            f"[D] pooled within-cycle sd of log length, {spread_note(stds)}",
        )
        shares = lengths.group_shares
        rho = mean_spread(shares)[0] if shares and sigma > 1e-9 else None
        if rho is None:
            a.default("workload.response.group_correlation", "length variance (all responses as long)")
        else:
            a.set(
                "workload.response.group_correlation",
                round(rho, 4),
                f"[D] between-group share of log variance, {spread_note(shares)}",
            )
    elif fmt.median_from_capped_mean:
        sigma = float(a.default("workload.response.sigma", fmt.sigma_missing))
        a.default("workload.response.group_correlation", fmt.group_missing)
        cap = int(a.get("workload.response.max_tokens"))
        logs = [math.log(median_for_capped_mean(m, sigma, cap)) for m in lengths.means]
        _fit_drift(a, logs, fmt.mean_drift_what)
    else:
        _fit_drift(a, [math.log(m) for m in lengths.means], fmt.mean_drift_what)
        a.default("workload.response.sigma", fmt.sigma_missing)
        a.default("workload.response.group_correlation", fmt.group_missing)


def _fit_drift(a: AnnotatedScenario, log_means: Sequence[float], what: str) -> None:
    """median_tokens (step 0) and growth_per_step from each cycle's mean log-length; a drift is kept
    only DRIFT_MIN_SIGMAS standard errors from 0, so cycle-to-cycle noise is not fitted as a trend."""
    a0, slope, se = linear_trend(log_means)
    if math.isfinite(se) and abs(slope) > DRIFT_MIN_SIGMAS * se:
        growth = min(0.5, max(-0.5, math.expm1(slope)))
        a.set(
            "workload.response.growth_per_step",
            round(growth, 6),
            f"[D] slope of log {what} over {len(log_means)} cycles, +-{se:.2g}/cycle (1 s.e.)",
        )
        a.set(
            "workload.response.median_tokens", round(math.exp(a0), 3), f"[D] intercept of that fit at cycle 0 ({what})"
        )
    else:
        why = "fewer than 3 cycles" if not math.isfinite(se) else f"slope {slope:.2g} +- {se:.2g}/cycle not significant"
        a.set("workload.response.growth_per_step", 0.0, f"[D] no drift: {why}")
        mean, spread = mean_spread(log_means)
        a.set(
            "workload.response.median_tokens",
            round(math.exp(mean), 3),
            f"[D] exp(mean log {what}), n={len(log_means)} cycles, "
            f"cycle-to-cycle sd {math.exp(spread * abs(mean)) - 1:.1%}",
        )


def _fit_cap(f: _Fit) -> None:
    """workload.response.max_tokens: the run config's cap, else the longest response seen (a lower bound)."""
    key, fmt = "workload.response.max_tokens", f.fmt
    configured = config_value(f.run.config, *fmt.cap_config)
    maxes = f.run.series(fmt.cap_series)
    if configured:
        f.scenario.set(key, int(configured), fmt.cap_config_note.format(csrc=f.csrc or "run config"))
    elif maxes:
        f.scenario.set(key, int(max(maxes)), fmt.cap_series_note.format(n=len(maxes)))
    else:
        f.scenario.default(key, fmt.cap_missing)


def _fit_prompt(f: _Fit) -> None:
    """workload.prompt_tokens: the mean prompt length, else the run config's fixed one."""
    key, fmt = "workload.prompt_tokens", f.fmt
    prompts = f.run.series(fmt.prompt_series)
    configured = config_value(f.run.config, *fmt.prompt_config) if fmt.prompt_config else None
    if prompts:
        mean = max(1, round(mean_spread(prompts)[0]))
        f.scenario.set(key, mean, f"[M] {fmt.prompt_series}, {spread_note(prompts)}")
    elif fmt.prompt_config and configured:
        f.scenario.set(key, int(configured), f"run config {'.'.join(fmt.prompt_config)}")
    else:
        f.scenario.default(key, fmt.prompt_series)


def _fit_speed_defaults(f: _Fit) -> None:
    """prefill_cost and lone_request_fraction keep their defaults: a run at one concurrency cannot
    separate them from the peak speed."""
    a, fmt, one_line = f.scenario, f.fmt, f.fmt.speed_defaults_one_line
    prefill = a.default("workload.decode.prefill_cost", fmt.prefill_missing, listed=not one_line)
    lone = a.default("workload.decode.lone_request_fraction", fmt.lone_missing, listed=not one_line)
    if one_line:
        a.missing.append(
            f"prefill and single-request speed -> workload.decode.prefill_cost = {prefill:g}, "
            f"workload.decode.lone_request_fraction = {lone:g} (a run at one concurrency cannot separate them)"
        )


def _fit_peak_speed(f: _Fit) -> None:
    """decode.peak_tokens_per_s from the cycles' generation work over replica time, at the
    concurrency the rollouter keeps each replica at."""
    sc = f.settled()
    gen = f.fmt.generation(f.run, sc, float(f.scenario.get("workload.decode.prefill_cost")))
    f.hybrid_generated = gen.hybrid_generated
    if not gen.work:
        f.peak = float(f.scenario.default("workload.decode.peak_tokens_per_s", f.fmt.generation_missing))
        return
    concurrency = sc.async_training.concurrent_samples_per_replica * sc.responses_per_sample
    f.peak = fit_peak(f.scenario, gen.work, gen.replica_time, f.fmt.generation_how, concurrency)


def _fit_hybrid(f: _Fit) -> None:
    """decode.hybrid_speed_factor: solved from --costs-from's cycles where the format allows, else the default."""
    if f.fmt.hybrid_missing is not None:
        f.scenario.default("workload.decode.hybrid_speed_factor", f.fmt.hybrid_missing)
        return
    prefill = float(f.scenario.get("workload.decode.prefill_cost"))
    f.solved_hybrid = fit_hybrid_speed(
        f.scenario, f.settled(), f.peak, prefill, f.hybrid_generated, f.costs_from, f.costs_source
    )


def _fit_host(f: _Fit) -> None:
    """cluster.shared_host from the run config's engines (see :func:`~.replicas.fit_shared_host`)."""
    fit_shared_host(f.scenario, f.run.config, f.solved_hybrid, f.fmt.host_without_facts)


# ---- The trainer -----------------------------------------------------------------------------------


def _fit_trainer(f: _Fit) -> None:
    """workload.train.step_s from the fit steps' times, scaled to the step-0 batch (token_fraction 1)."""
    times, tokens = f.fmt.step_times(f.run, f.settled())
    if not times:
        raise f.fmt.no_steps_error(f.run)
    a = f.scenario
    sc = load_scenario(a.raw)
    t0 = reference_batch_tokens(sc)
    norm = [t * t0 / tok for t, tok in zip(times, tokens, strict=True) if tok > 0]
    mean, _ = mean_spread(norm)
    a.set(
        "workload.train.step_s",
        round(mean, 6),
        f"[D] mean {f.fmt.steps_what} scaled to the step-0 batch of {t0:.0f} tokens ({spread_note(norm, 'fit steps')})",
    )
    a.set("workload.train.reference_gpus", sc.cluster.trainer_gpus, "the trainer GPUs step_s was measured on")
    a.set("workload.train.token_fraction", 1.0, "[E] step time proportional to batch tokens")


def _fit_phases(f: _Fit) -> None:
    """workload.train.phase_fractions: each phase's share of the summed phase times, where logged."""
    key = "workload.train.phase_fractions"
    if f.fmt.phases_missing is not None:
        f.scenario.default(key, f.fmt.phases_missing, listed=False)
        return
    totals = f.fmt.phase_totals(f.run)
    total = sum(totals.values())
    if total > 0:
        fr = {p: round(v / total, 4) for p, v in totals.items() if v > 0}
        fix = round(1.0 - sum(fr.values()), 4)
        top = max(fr, key=lambda k: fr[k])
        fr[top] = round(fr[top] + fix, 4)  # the rounding rest goes to the largest share: they sum to 1
        f.scenario.set(key, fr, f.fmt.phases_note)


# ---- Costs -----------------------------------------------------------------------------------------


def _fit_export(f: _Fit) -> None:
    """costs.export_weights_s: report.json's export_weights mean; 0 where the sync time includes it."""
    key = "costs.export_weights_s"
    if f.fmt.sync_includes_export:
        f.scenario.set(key, 0.0, f"included in weight_sync_s ({f.fmt.name} times the whole sync)")
        return
    export = op_mean(f.fmt.report(f.run), "export_weights")
    if export:
        f.scenario.set(key, round(export[0], 6), f"[M] report.json export_weights mean, n={export[1]} calls")
    else:
        f.scenario.default(key, "export_weights timing (report.json)")


def _fit_sync(f: _Fit) -> None:
    """costs.weight_sync_s: each cycle's weight sync (minus the export where measured apart), else
    report.json's update_weights mean."""
    a, fmt, report = f.scenario, f.fmt, f.fmt.report(f.run)
    found = f.run.first(*fmt.sync_keys)
    if found:
        key, syncs = found
        if not fmt.sync_includes_export:
            export = op_mean(report, "export_weights")
            ex = export[0] if export else 0.0
            syncs = [max(0.0, s - ex) for s in syncs]
        a.set(
            "costs.weight_sync_s",
            round(mean_spread(syncs)[0], 6),
            fmt.sync_note.format(key=key, spread=spread_note(syncs)),
        )
        return
    upd = op_mean(report, "update_weights")
    if upd:
        a.set("costs.weight_sync_s", round(upd[0], 6), f"[M] report.json update_weights mean, n={upd[1]} calls")
    else:
        a.default("costs.weight_sync_s", fmt.sync_missing)


def _fit_switches(f: _Fit) -> None:
    """The switch costs (see :func:`~.costs.fit_switch_costs`)."""
    fit_switch_costs(f.scenario, f.fmt.report(f.run), f.fmt.switch_missing, f.costs_from, f.costs_source)


SECTIONS: dict[str, Callable[[_Fit], None]] = {
    "config": _fit_run_config,
    "cycles": _fit_cycles,
    "lengths": _fit_lengths,
    "cap": _fit_cap,
    "prompt": _fit_prompt,
    "speed_defaults": _fit_speed_defaults,
    "peak": _fit_peak_speed,
    "hybrid": _fit_hybrid,
    "host": _fit_host,
    "trainer": _fit_trainer,
    "phases": _fit_phases,
    "export": _fit_export,
    "sync": _fit_sync,
    "switches": _fit_switches,
}
"""Every section of a fit by name; a format's :attr:`~.formats.MetricsFormat.section_order` runs each once."""


def _result(f: _Fit) -> FitResult:
    """The FitResult of a finished fit: the scenario validated, sections in order, the header."""
    run, a = f.run, f.scenario
    measured, first = f.fmt.measured(run)
    policy = str(a.get("async_training.dynamic_schedule_policy"))
    sc = load_scenario(a.raw)  # the fit must be a valid scenario; a bad value fails here, named
    header = [
        f"Scenario fitted by `dynres scenario fit` from {run.path} ({run.format} format, {len(run.cycles)} cycles).",
        f"Measured end-to-end: {measured:.3f} s"
        + (f" (first cycle started at {first:.3f} s: warm-up the simulator does not model)" if first else "")
        + f"; policy {policy}.",
        f"Replicas: {sc.num_standalone_replicas} standalone + {sc.num_hybrid_replicas} hybrid; "
        f"{sc.step_required_samples} samples x n={sc.responses_per_sample} per cycle.",
        "Tags: [M] measured directly, [D] derived from measurements, [E] an assumption; DEFAULT = not in the metrics.",
    ]
    if run.config_source:
        header.append(f"Run config: {run.config_source}.")
    a.raw.setdefault("description", f"fitted from {run.path.name} ({run.format}, {len(run.cycles)} cycles, {policy})")
    return FitResult(
        scenario={k: a.raw[k] for k in SECTION_ORDER if k in a.raw},
        notes=a.notes,
        missing=a.missing,
        source=run.path,
        format=run.format,
        cycles=len(run.cycles),
        measured_end_to_end_s=measured,
        first_cycle_start_s=first,
        measured_policy=policy,
        header=header,
    )
