"""One adapter per metrics format: the metric names the fit reads, the facts the format has, its notes.

The fit (:mod:`.fitter`) walks the scenario's sections once for every format; each section asks
the run's :class:`MetricsFormat` which metric to read, whether the format has the fact at all,
and how to word the note. Where the formats truly differ, the adapter says so in one place:

* response lengths: a dynres record has per-cycle statistics of the log length (mean, sd, the
  between-group share), so ``sigma`` and the group correlation are measured; verl logs only the
  mean, so the median is solved from the capped mean under the default ``sigma``
  (:attr:`MetricsFormat.median_from_capped_mean`);
* generation work and replica time (:meth:`MetricsFormat.generation`): dynres counts a cycle's
  generated samples over its busy time outside the weight sync; verl's rollouter logs its own
  active time;
* fit-step times (:meth:`MetricsFormat.step_times`): dynres records each train_step call; verl
  the cycle's compute, split evenly over the trigger;
* engine operation timings: only a dynres run writes a report.json (:meth:`MetricsFormat.report`);
  verl's weight-sync time includes the export (:attr:`MetricsFormat.sync_includes_export`);
* the run config: a dynres run writes config.json; the records tell part of it otherwise
  (:meth:`MetricsFormat.derived_config`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynres.core.errors import MetricsError
from dynres.runtime.loop.report import BATCH_PREFIX
from dynres.runtime.sim.fit.stats import MIN_CYCLES, mean_spread, spread_note
from dynres.runtime.sim.metrics_io import DYNRES, VERL, RunMetrics
from dynres.runtime.sim.scenario import Scenario

VERL_PHASES: tuple[str, ...] = ("reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")
"""verl trainer phases whose ``timing_s/<phase>`` make up a fit step's compute (seconds each)."""


@dataclass(frozen=True)
class DerivedConfig:
    """What a run's records tell of its config when no config file does: (value, note) each, None = not told."""

    trigger: tuple[int, str] | None = None
    """async_training.trigger_parameter_sync_step (fit steps per sync cycle)."""
    required: tuple[int, str] | None = None
    """Samples per fit step (ppo_mini_batch_size with require_batches 1)."""
    n: tuple[int, str] | None = None
    """Responses per sample (actor_rollout_ref.rollout.n)."""
    staleness: tuple[float, str] | None = None
    """async_training.staleness_threshold (fraction)."""
    policy: tuple[str, str] | None = None
    """The policy that ran; it also names the run's policy when a config file is given."""
    dynamic: tuple[bool, str] | None = None
    """async_training.use_dynamic_resource_scheduling."""
    cluster: tuple[int, int, int, str] | None = None
    """Trainer GPUs, rollout GPUs, GPUs per replica, and the note."""


@dataclass(frozen=True)
class Lengths:
    """A run's per-cycle response lengths as its format logs them: log-length statistics, else means."""

    log_means: list[float]
    """Mean log response length per cycle (log tokens); empty when the format has none."""
    log_stds: list[float]
    """Within-cycle sd of the log length per cycle."""
    group_shares: list[float]
    """Between-prompt-group share of the log-length variance per cycle (fraction)."""
    means: list[float]
    """Mean response length per cycle (tokens); read only without :attr:`log_means`."""


@dataclass(frozen=True)
class Generation:
    """Per usable cycle: the response work generated and the replica time that generated it."""

    work: list[float]
    """Decode tokens (response tokens + prefill_cost x prompt tokens per response)."""
    replica_time: list[float]
    """Replica-seconds that generated it."""
    hybrid_generated: bool
    """True when hybrid replicas generated in some cycle."""


class MetricsFormat:
    """What the fit reads from one metrics format. Subclasses fill in the names and the methods."""

    name: str
    """The format's name (metrics_io.DYNRES or VERL)."""
    section_order: tuple[str, ...]
    """The fit's sections (:data:`.fitter.SECTIONS`) in the order this format walks them, which is
    the order of the keys in the written file. Both orders respect the dependencies (verl's cap
    before its lengths: the median is solved from the capped mean; dynres's peak before the
    hybrid factor: the solve divides by it); the rest is the order each format's file has always
    had, kept so that refitting the same run writes the same file, byte for byte."""
    log_length_keys: tuple[str, str, str] | None = None
    """Per-cycle mean, sd and between-group share of the log response length; None: not logged."""
    mean_length_keys: tuple[str, ...]
    """Mean response length per cycle, the first found."""
    median_from_capped_mean: bool = False
    """Solve each cycle's median from its mean under the capped lognormal (with the default sigma,
    so sigma and the cap are set first); False: the drift is fitted to the log of the means."""
    log_drift_what: str = ""
    """The length measure named in the drift's note when :attr:`log_length_keys` are read."""
    mean_drift_what: str
    """The length measure named in the drift's note when the means are read."""
    sigma_missing: str
    """The missing metric that leaves ``sigma`` at its default."""
    group_missing: str
    """The missing metric that leaves ``group_correlation`` at its default."""
    cap_config: tuple[str, str]
    """Section and key of the response cap in the run config."""
    cap_config_note: str
    """Note of a cap read from the config (``{csrc}``: the config's label)."""
    cap_series: str
    """Per-cycle longest response, a lower bound on the cap."""
    cap_series_note: str
    """Note of a cap taken from :attr:`cap_series` (``{n}``: the cycles)."""
    cap_missing: str
    """The missing metric that leaves the cap at its default."""
    prompt_series: str
    """Per-cycle mean prompt length (tokens)."""
    prompt_config: tuple[str, str] | None = None
    """Section and key of a fixed prompt length in the run config; None: not there."""
    prefill_missing: str
    """The missing fact that leaves ``prefill_cost`` at its default."""
    lone_missing: str
    """The missing fact that leaves ``lone_request_fraction`` at its default."""
    speed_defaults_one_line: bool = False
    """List the two speed defaults as one missing line (both need a run at a second concurrency)."""
    generation_how: str
    """How :meth:`generation` counts work and time, for the peak's note."""
    generation_missing: str
    """The missing metrics when :meth:`generation` finds no usable cycle."""
    hybrid_missing: str | None = None
    """Why hybrid_speed_factor keeps its default; None: solved from ``--costs-from``'s cycles, a
    dynres report.json of a run on the same engines."""
    host_without_facts: tuple[bool, str] | None = None
    """cluster.shared_host and its reason when the run config tells nothing of the engines;
    None: the default, listed as missing."""
    steps_what: str
    """What :meth:`step_times` measures, for step_s's note."""
    phases_missing: str | None = None
    """Why the trainer's phase_fractions keep their default (not listed: they only split the
    utilization metric, never a duration); None: :meth:`phase_totals` has per-phase times."""
    phases_note: str = ""
    """Note of phase_fractions fitted from :meth:`phase_totals`."""
    sync_keys: tuple[str, ...]
    """Per-cycle weight-sync time (seconds), the first found."""
    sync_includes_export: bool = False
    """The weight-sync time includes the export of the weights (export_weights_s is then 0);
    False: the export is measured apart and subtracted."""
    sync_note: str
    """Note of weight_sync_s from :attr:`sync_keys` (``{key}``, ``{spread}``)."""
    sync_missing: str
    """The missing metrics that leave weight_sync_s at its default."""
    switch_missing: str
    """Why a switch cost is missing (``{op}``: the operation)."""

    def lengths(self, run: RunMetrics) -> Lengths:
        """The run's response lengths; MetricsError when it has neither kind in MIN_CYCLES cycles."""
        if self.log_length_keys:
            mean_key, std_key, share_key = self.log_length_keys
            log_means = run.series(mean_key)
            if len(log_means) >= MIN_CYCLES:
                return Lengths(log_means, run.series(std_key), run.series(share_key), [])
        found = run.first(*self.mean_length_keys)
        if found is None or len(found[1]) < MIN_CYCLES:
            raise self.no_lengths_error(run)
        return Lengths([], [], [], found[1])

    def no_lengths_error(self, run: RunMetrics) -> MetricsError:
        """The error of a run without response lengths, naming the fix."""
        raise NotImplementedError

    def cycles_note(self, run: RunMetrics) -> str:
        """Note of ``steps``: which records are the run's sync cycles."""
        raise NotImplementedError

    def derived_config(self, run: RunMetrics) -> DerivedConfig:
        """What the records tell of the run config."""
        raise NotImplementedError

    def generation(self, run: RunMetrics, sc: Scenario, prefill: float) -> Generation:
        """Per usable cycle, the response work (``prefill`` tokens per prompt token) and replica time."""
        raise NotImplementedError

    def step_times(self, run: RunMetrics, sc: Scenario) -> tuple[list[float], list[float]]:
        """Each measured fit step's time (seconds) and its batch's tokens."""
        raise NotImplementedError

    def no_steps_error(self, run: RunMetrics) -> MetricsError:
        """The error of a run without fit-step times, naming the fix."""
        raise NotImplementedError

    def phase_totals(self, run: RunMetrics) -> dict[str, float]:
        """Per trainer phase, its time summed over the cycles (seconds)."""
        return {}

    def report(self, run: RunMetrics) -> Mapping[str, Any] | None:
        """The run's engine operation timings (report.json); None: the format has none at all."""
        return None

    def measured(self, run: RunMetrics) -> tuple[float, float]:
        """The measured end-to-end time and the run-clock start of the first cycle (seconds)."""
        raise NotImplementedError


def config_value(config: Mapping[str, Any] | None, section: str, key: str) -> Any:
    """``config[section][key]`` of a run config mapping, None when either is absent."""
    sec = (config or {}).get(section)
    return sec.get(key) if isinstance(sec, Mapping) else None


# ---- dynres --------------------------------------------------------------------------------------


def record_of(cycle: Mapping[str, Any]) -> dict[str, Any]:
    """A report.json cycle as the flat metrics.jsonl record (``metrics`` and ``batch/*`` keys on top)."""
    rec = dict(cycle)
    rec.update(cycle.get("metrics") or {})
    rec.update({BATCH_PREFIX + k: v for k, v in (cycle.get("batch") or {}).items()})
    return rec


def cycle_work(
    cycles: Sequence[Mapping[str, Any]], n: int, prefill: float, prompt: float
) -> tuple[list[float], list[float], list[float]]:
    """Per usable dynres cycle record: response work (decode tokens), busy replica time per replica
    (seconds) and the share of the cycle the hybrid replicas generated (fraction; 0 when asleep).

    Busy time is the cycle outside its weight sync times the rollout utilization; the hybrid share
    is the time the cycle waited with hybrids generating over its duration.
    """
    work, busy, share = [], [], []
    for c in cycles:
        mean_len = c.get(BATCH_PREFIX + "response_tokens_mean") or c.get("cycle_mean/response_length/mean")
        util = c.get("dynamic_resource/rollout_resource_utilization")
        gen = c.get("samples_generated")
        if not (mean_len and isinstance(util, int | float) and math.isfinite(util) and gen):
            continue
        dur = float(c["duration_s"])
        work.append(gen * n * (float(mean_len) + prefill * prompt))
        busy.append(max(0.0, dur - float(c.get("weight_sync_s") or 0.0)) * float(util))
        h = min(1.0, float(c.get("wait_for_enough_samples_s") or 0.0) / max(dur, 1e-9))
        share.append(h if c.get("hybrid_active_at_start") else 0.0)
    return work, busy, share


def _collections_per_cycle(run: RunMetrics) -> tuple[int, list[int]]:
    """The most common number of batch collections per cycle (the trigger; 0 = not recorded) and each cycle's."""
    triggers = [len(c.get("step_wait_times") or []) for c in run.cycles]
    return (max(set(triggers), key=triggers.count) if any(triggers) else 0), triggers


class DynresFormat(MetricsFormat):
    """``dynres run``'s metrics.jsonl, with its config.json and report.json."""

    name = DYNRES
    section_order = (
        "config", "cycles", "lengths", "cap", "prompt", "speed_defaults", "peak", "hybrid", "host",
        "trainer", "phases", "export", "sync", "switches",
    )  # fmt: skip
    log_length_keys = (
        BATCH_PREFIX + "response_log_tokens_mean",
        BATCH_PREFIX + "response_log_tokens_std",
        BATCH_PREFIX + "response_log_group_share",
    )
    mean_length_keys = ("cycle_mean/response_length/mean", "response_length/mean")
    log_drift_what = "response tokens (batch/response_log_tokens_mean)"
    mean_drift_what = "mean response length (response_length/mean)"
    sigma_missing = "batch/response_log_tokens_std"
    group_missing = "batch/response_log_group_share"
    cap_config = ("task", "max_tokens")
    cap_config_note = "{csrc} task.max_tokens"
    cap_series = BATCH_PREFIX + "response_tokens_max"
    cap_series_note = "[D] longest response seen (n={n} cycles); a lower bound on the cap"
    cap_missing = "the response cap (task.max_tokens)"
    prompt_series = BATCH_PREFIX + "prompt_tokens_mean"
    prompt_config = ("task", "prompt_length")
    prefill_missing = "prefill timing (not separable from decode in per-cycle metrics)"
    lone_missing = "throughput at several concurrencies (the run keeps one)"
    speed_defaults_one_line = True
    generation_how = "response work of samples_generated over (duration - weight_sync_s) x rollout util x replicas"
    generation_missing = "generation work and time"
    steps_what = "train_step call"
    phases_missing = "per-phase trainer times (the record has their sum only)"
    sync_keys = ("weight_sync_s",)
    sync_note = "[M] cycle weight_sync_s minus export: pause + load + resume of a replica, {spread}"
    sync_missing = "weight_sync_s (record) or update_weights (report.json)"
    switch_missing = "no {op} call in report.json"

    def no_lengths_error(self, run: RunMetrics) -> MetricsError:
        """No length statistics: the records predate them."""
        return MetricsError(
            f"metrics {run.path}: no response lengths (batch/response_log_tokens_mean or "
            "response_length/mean) in the records; re-run with this dynres version, which records them"
        )

    def cycles_note(self, run: RunMetrics) -> str:
        """Every record is a cycle."""
        return f"[M] sync cycles in {run.path.name}"

    def derived_config(self, run: RunMetrics) -> DerivedConfig:
        """Trigger, batch and n from the records; policy, dynamic scheduling and GPUs from report.json."""
        report = run.report or {}
        trigger, triggers = _collections_per_cycle(run)
        consumed = run.series("samples_consumed")
        samples = run.series(BATCH_PREFIX + "samples")
        responses = run.series(BATCH_PREFIX + "responses")
        n_resp = round(sum(responses) / sum(samples)) if samples and sum(samples) > 0 else None
        policy = report.get("policy")
        cluster = None
        if report.get("hybrid_gpus") is not None and report.get("standalone_gpus") is not None:
            hybrid, standalone = int(report["hybrid_gpus"]) or 1, int(report["standalone_gpus"])
            cluster = (hybrid, standalone, 1, "report.json hybrid/standalone GPUs")
        return DerivedConfig(
            trigger=(trigger, f"[D] collections per cycle (len step_wait_times), {spread_note(triggers)}")
            if trigger
            else None,
            required=(round(mean_spread(consumed)[0] / trigger), "[D] samples_consumed / trigger")
            if trigger and consumed
            else None,
            n=(n_resp, "[D] batch/responses / batch/samples") if n_resp else None,
            policy=(policy, "report.json policy") if policy else None,
            dynamic=(bool(report.get("hybrid_gpus")), "report.json hybrid_gpus > 0") if report else None,
            cluster=cluster,
        )

    def generation(self, run: RunMetrics, sc: Scenario, prefill: float) -> Generation:
        """:func:`cycle_work` of the records, over every replica that generated (hybrids for their share)."""
        prompt = float(sc.workload.prompt_tokens)
        work, busy, share = cycle_work(run.cycles, sc.responses_per_sample, prefill, prompt)
        standalone, hybrid = sc.num_standalone_replicas, sc.num_hybrid_replicas
        rtime = [t * (standalone + hybrid * h) for t, h in zip(busy, share, strict=True)]
        return Generation(work, rtime, any(share))

    def step_times(self, run: RunMetrics, sc: Scenario) -> tuple[list[float], list[float]]:
        """Each train_step call (else the cycle's compute split over its collections), with the
        batch tokens of its cycle."""
        trigger = _collections_per_cycle(run)[0]
        n, prompt, required = sc.responses_per_sample, float(sc.workload.prompt_tokens), sc.required_samples
        times: list[float] = []
        tokens: list[float] = []
        for c in run.cycles:
            mean_len = c.get(BATCH_PREFIX + "response_tokens_mean") or c.get("cycle_mean/response_length/mean")
            pt = c.get(BATCH_PREFIX + "prompt_tokens_mean") or prompt
            steps = c.get("train_step_times") or []
            if not steps and c.get("dynamic_resource/train_compute_time_s") and trigger:
                steps = [float(c["dynamic_resource/train_compute_time_s"]) / trigger] * trigger
            for t in steps:
                times.append(float(t))
                tokens.append(required * n * (float(pt) + float(mean_len or 0)))
        return times, tokens

    def no_steps_error(self, run: RunMetrics) -> MetricsError:
        """No fit-step times: the records predate them."""
        return MetricsError(
            f"metrics {run.path}: no fit-step times (train_step_times or "
            "dynamic_resource/train_compute_time_s) in the records; re-run with this dynres version"
        )

    def report(self, run: RunMetrics) -> Mapping[str, Any] | None:
        """report.json next to the metrics; ``{}`` when it was not found (the run may lack it)."""
        return run.report or {}

    def measured(self, run: RunMetrics) -> tuple[float, float]:
        """report.json's end_to_end_s (else the last cycle's end) and the first cycle's start."""
        end = (run.report or {}).get("end_to_end_s") or run.cycles[-1]["end_s"]
        return float(end), float(run.cycles[0]["start_s"])


# ---- verl ----------------------------------------------------------------------------------------


def _cycle_times(run: RunMetrics) -> tuple[str, list[float]]:
    """verl's per-cycle step time and its key."""
    found = run.first("timing_s/step", "perf/time_per_step")
    assert found is not None  # read_metrics keeps only cycles with one of them
    return found


class VerlFormat(MetricsFormat):
    """verl's file-logger JSONL of a fully-async run (verl 0.9 key names); its config via ``--config``."""

    name = VERL
    section_order = (
        "config", "cycles", "cap", "lengths", "prompt", "speed_defaults", "hybrid", "host", "peak",
        "trainer", "phases", "sync", "export", "switches",
    )  # fmt: skip
    mean_length_keys = ("response_length/mean",)
    median_from_capped_mean = True
    mean_drift_what = "median solved from response_length/mean (capped lognormal, sigma as set)"
    sigma_missing = "per-response lengths (verl logs mean/max/min only)"
    group_missing = "per-response lengths by prompt group"
    cap_config = ("data", "max_response_length")
    cap_config_note = "run config data.max_response_length"
    cap_series = "response_length/max"
    cap_series_note = "[D] largest response_length/max (n={n} cycles); a lower bound on the cap"
    cap_missing = "data.max_response_length or response_length/max"
    prompt_series = "prompt_length/mean"
    prefill_missing = "prefill timing"
    lone_missing = "throughput at several concurrencies"
    generation_how = "step_generated_samples x n x length over rollouter active_time x standalone replicas"
    generation_missing = "fully_async/rollouter/active_time and step_generated_samples"
    hybrid_missing = "hybrid-replica throughput"
    host_without_facts = (False, "verl runs its engines on GPUs")
    steps_what = "compute per fit step (train_compute_time_s / trigger)"
    phases_note = "[M] share of the timing_s/<phase> sums"
    sync_keys = ("timing_s/param_sync", "timing_s/timing_s/param_sync")
    sync_includes_export = True
    sync_note = "[M] {key}, {spread}"
    sync_missing = "timing_s/param_sync"
    switch_missing = "verl prints switch times but does not log them"

    def no_lengths_error(self, run: RunMetrics) -> MetricsError:
        """No response_length/mean: the trainer's data metrics were not logged."""
        return MetricsError(
            f"metrics {run.path}: no response_length/mean in {MIN_CYCLES}+ cycles; verl logs it with the "
            "trainer's data metrics, keep them in the logged metrics"
        )

    def cycles_note(self, run: RunMetrics) -> str:
        """The steps with a training time are the cycles."""
        return f"[M] sync cycles with {_cycle_times(run)[0]} in {run.path.name}"

    def derived_config(self, run: RunMetrics) -> DerivedConfig:
        """Batch, trigger and staleness from the fully_async/static and rollouter metrics; dynamic
        scheduling from whether the trainer waited for samples."""
        req = run.first("fully_async/static/required_samples")
        gen = run.series("fully_async/rollouter/step_generated_samples")
        required = round(req[1][-1]) if req else None
        trigger = round(mean_spread(gen)[0] / required) if gen and required else None
        stale = run.first("fully_async/static/staleness_threshold")
        dynamic = run.has("timing_s/wait_for_enough_samples")
        return DerivedConfig(
            trigger=(max(1, trigger), "[D] step_generated_samples / required_samples") if trigger else None,
            required=(required, "[M] fully_async/static/required_samples") if required else None,
            staleness=(stale[1][-1], "[M] fully_async/static/staleness_threshold") if stale else None,
            dynamic=(dynamic, "[D] timing_s/wait_for_enough_samples logged only with dynamic scheduling"),
        )

    def generation(self, run: RunMetrics, sc: Scenario, prefill: float) -> Generation:
        """The rollouter's generated samples over its active time on the standalone replicas."""
        n, prompt = sc.responses_per_sample, float(sc.workload.prompt_tokens)
        work, rtime = [], []
        for c in run.cycles:
            active = c.get("fully_async/rollouter/active_time")
            g = c.get("fully_async/rollouter/step_generated_samples")
            mlen = c.get("response_length/mean")
            if active and g and mlen:
                work.append(float(g) * n * (float(mlen) + prefill * prompt))
                rtime.append(float(active) * sc.num_standalone_replicas)
        return Generation(work, rtime, False)

    def step_times(self, run: RunMetrics, sc: Scenario) -> tuple[list[float], list[float]]:
        """Each cycle's trainer compute (train_compute_time_s, else the timing_s/<phase> sum) over
        its fit steps, with the cycle's batch tokens."""
        trig = sc.async_training.trigger_parameter_sync_step
        n, prompt = sc.responses_per_sample, float(sc.workload.prompt_tokens)
        times: list[float] = []
        tokens: list[float] = []
        for c in run.cycles:
            comp = c.get("dynamic_resource/train_compute_time_s")
            if not comp:
                comp = sum(float(c.get(f"timing_s/{p}") or 0.0) for p in VERL_PHASES)
            mlen = c.get("response_length/mean")
            if comp and mlen:
                times.append(float(comp) / trig)
                tokens.append(sc.required_samples * n * (prompt + float(mlen)))
        return times, tokens

    def no_steps_error(self, run: RunMetrics) -> MetricsError:
        """No trainer compute: verl's timing metrics were not logged."""
        return MetricsError(
            f"metrics {run.path}: no trainer compute time (dynamic_resource/train_compute_time_s or "
            "timing_s/update_actor); keep verl's timing metrics in the logged metrics"
        )

    def phase_totals(self, run: RunMetrics) -> dict[str, float]:
        """Each phase's timing_s/<phase> summed over the cycles."""
        totals = dict.fromkeys(VERL_PHASES, 0.0)
        for c in run.cycles:
            for p in VERL_PHASES:
                totals[p] += float(c.get(f"timing_s/{p}") or 0.0)
        return totals

    def measured(self, run: RunMetrics) -> tuple[float, float]:
        """The sum of the cycles' step times; verl does not log when the first cycle started."""
        return sum(_cycle_times(run)[1]), 0.0


FORMATS: dict[str, MetricsFormat] = {DYNRES: DynresFormat(), VERL: VerlFormat()}
"""The adapter of each format name metrics_io.read_metrics reports."""
