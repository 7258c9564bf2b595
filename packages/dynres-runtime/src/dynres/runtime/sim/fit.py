"""A scenario fitted from a run's own per-cycle metrics (``dynres scenario fit``).

:func:`fit_scenario` turns a :class:`~dynres.runtime.sim.metrics_io.RunMetrics` (``dynres run``'s
``metrics.jsonl`` or verl's file-logger JSONL) into a scenario for the simulator, and records for
every key where its number came from and how well the run determines it (cycles used, spread),
or which metric was missing and which default stands in. :meth:`FitResult.to_yaml` writes that as
a commented scenario file ``dynres simulate`` loads.

What is fitted (symbols of :mod:`dynres.runtime.sim.workload`):

* response lengths: ``log m_k = log m + k log(1 + g)`` by least squares over the cycles' mean
  log-length (dynres ``batch/response_log_tokens_mean``), ``sigma`` the pooled within-cycle
  log-length deviation, ``rho`` the between-group share of it. verl logs only the mean, so
  ``sigma`` keeps its default and ``m`` is solved from the capped mean;
* replica peak throughput: response work (``L + prefill_cost * P`` per response) generated in a
  cycle over the replica time that generated it (busy share of the cycle outside its weight
  sync, times the replicas), then ``peak = tput(c) * (c + c_half) / c`` at the concurrency cap
  ``c = concurrent_samples_per_replica * n`` the rollouter keeps each replica at;
* the fit step: ``step_s = t * T_0 / T`` for each measured step of ``T`` tokens (token_fraction 1);
* costs: the engine operations' mean durations (``report.json``: the cycles' switches, else the
  start-up probe's idle switch, ``startup_probe``) and each cycle's weight sync;
* the run config (batch, staleness, partial rollout, policy, cluster split) from the run's
  config (dynres ``config.json`` or ``--config``), else derived from the records where they tell;
* ``cluster.shared_host`` from the config's engines and device (vLLM / torch on CPU slots of one
  machine share its cores), or from a hybrid factor solved ``<= 0`` from ``--costs-from``.

Time before the first cycle (engine warm-up, first compilation) is not part of a scenario; the
fit reports it as :attr:`FitResult.first_cycle_start_s` and ``dynres scenario compare`` adds the
part the simulator does not model to every prediction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynres.core.config import DynresConfig, drop_verl_only_keys, read_yaml, validate_model
from dynres.core.errors import ConfigError, MetricsError
from dynres.runtime.loop.report import BATCH_PREFIX
from dynres.runtime.sim.metrics_io import DYNRES, VERL, RunMetrics
from dynres.runtime.sim.scenario import Scenario, load_scenario
from dynres.runtime.sim.workload import capped_lognormal_mean, reference_batch_tokens

MIN_CYCLES = 2
"""Fewest sync cycles a fit accepts (count): one cycle says nothing about spread or drift."""

VERL_PHASES: tuple[str, ...] = ("reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")
"""verl trainer phases whose ``timing_s/<phase>`` make up a fit step's compute (seconds each)."""

DRIFT_MIN_SIGMAS = 2.0
"""A length drift is kept only when the fitted slope is this many standard errors from 0 (count)."""


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
        lines = [f"# {h}" for h in self.header]
        if self.missing:
            lines.append("# Missing from the metrics (defaults used):")
            lines += [f"#   - {m}" for m in self.missing]
        lines.append("")
        _emit(self.scenario, "", 0, self.notes, lines)
        return "\n".join(lines) + "\n"


def _scalar(v: Any) -> str:
    import yaml

    if isinstance(v, float):
        return f"{v:.6g}" if math.isfinite(v) else ".nan"
    if isinstance(v, Mapping):
        return yaml.safe_dump(dict(v), default_flow_style=True, width=1000).strip()
    return yaml.safe_dump(v, default_flow_style=True, width=1000).strip().removesuffix("\n...").strip()


def _emit(node: Mapping[str, Any], prefix: str, indent: int, notes: Mapping[str, str], out: list[str]) -> None:
    pad = "  " * indent
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        note = notes.get(dotted)
        leaf = not isinstance(value, Mapping) or (
            dotted in notes and not any(k.startswith(dotted + ".") for k in notes)
        )
        if leaf:
            text = f"{pad}{key}: {_scalar(value)}"
            out.append(f"{text:<44}  # {note}" if note else text)
        else:
            out.append(f"{pad}{key}:" + (f"  # {note}" if note else ""))
            _emit(value, dotted + ".", indent + 1, notes, out)


class _Builder:
    """Accumulates the scenario mapping with a note per key and the list of missing metrics."""

    def __init__(self) -> None:
        self.costs_from: Mapping[str, Any] | None = None
        self.costs_source = ""
        self.raw: dict[str, Any] = {}
        self.notes: dict[str, str] = {}
        self.missing: list[str] = []

    def set(self, dotted: str, value: Any, note: str) -> None:
        node = self.raw
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
        self.notes[dotted] = note

    def default(self, dotted: str, metric: str, *, listed: bool = True) -> Any:
        """Use the scenario's default for ``dotted`` because ``metric`` is missing; return it.

        ``listed``: also name it in :attr:`missing` (False when the caller reports it otherwise).
        """
        value: Any = Scenario()
        for part in dotted.split("."):
            value = value[part] if isinstance(value, Mapping) else getattr(value, part)
        if hasattr(value, "model_dump"):
            value = value.model_dump()
        self.set(dotted, value, f"DEFAULT: missing {metric}")
        if listed:
            self.missing.append(f"{metric} -> {dotted} = {_scalar(value)}")
        return value


def _stats(values: Sequence[float]) -> tuple[float, float]:
    """Mean and relative spread (std / mean; 0 for one value) of ``values``."""
    n = len(values)
    mean = sum(values) / n
    if n < 2 or mean == 0:
        return mean, 0.0
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, std / abs(mean)


def _q(values: Sequence[float], what: str = "cycles") -> str:
    spread = _stats(values)[1]
    return f"n={len(values)} {what}, spread {spread * 100:.0f}%"


def _slope(ys: Sequence[float]) -> tuple[float, float, float]:
    """Least squares y = a + b k over k = 0..n-1: (a, b, standard error of b)."""
    n = len(ys)
    ks = range(n)
    km = (n - 1) / 2
    ym = sum(ys) / n
    sxx = sum((k - km) ** 2 for k in ks)
    if sxx == 0:
        return ym, 0.0, math.inf
    b = sum((k - km) * (y - ym) for k, y in zip(ks, ys, strict=True)) / sxx
    a = ym - b * km
    if n < 3:
        return a, b, math.inf
    resid = sum((y - a - b * k) ** 2 for k, y in zip(ks, ys, strict=True))
    return a, b, math.sqrt(resid / (n - 2) / sxx)


def _median_for_mean(mean: float, sigma: float, cap: float) -> float:
    """The lognormal median whose capped mean is ``mean`` (tokens; bisection on the log scale)."""
    if mean >= cap:
        return float(cap)
    lo, hi = math.log(1e-3), math.log(cap) + 10 * max(sigma, 0.1)
    for _ in range(100):
        mid = (lo + hi) / 2
        if capped_lognormal_mean(math.exp(mid), sigma, cap) < mean:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def config_from_file(path: str | Path) -> tuple[dict[str, Any], str]:
    """A run config mapping from a dynres or verl YAML (verl-only keys dropped) and its label."""
    data = read_yaml(path)
    if not isinstance(data, Mapping):
        raise ConfigError(f"--config {path}: expected a mapping of keys at the top level; give a dynres or verl config")
    return dict(data), str(path)


def _dynres_config(raw: Mapping[str, Any] | None, source: str) -> DynresConfig | None:
    if raw is None:
        return None
    sections = {k: raw[k] for k in ("async_training", "actor_rollout_ref", "trainer", "rollout") if k in raw}
    if not sections:
        return None
    sections, _ = drop_verl_only_keys(sections, DynresConfig)
    return validate_model(DynresConfig, sections, source)


def _op_mean(report: Mapping[str, Any] | None, op: str) -> tuple[float, int] | None:
    """Mean duration and count of engine operation ``op`` in a report.json (None = never called)."""
    if not report:
        return None
    st = (report.get("operations") or {}).get("engine", {}).get(op)
    if not st or not st.get("count"):
        return None
    return float(st["total_s"]) / int(st["count"]), int(st["count"])


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
    durations from its cycles, ahead of ``run``'s own start-up probe (see :func:`_switch_costs`);
    its cycles with hybrid replicas generating fit ``hybrid_speed_factor``; ``costs_source``
    names it in the comments.

    Raises MetricsError when the run has fewer than MIN_CYCLES cycles or lacks the metrics
    every fit needs (a cycle time, and response lengths).
    """
    if config is not None:
        run.config, run.config_source = dict(config), config_source or "--config"
    if len(run.cycles) < MIN_CYCLES:
        raise MetricsError(
            f"metrics {run.path}: {len(run.cycles)} sync cycle(s); a fit needs at least {MIN_CYCLES}, "
            "let the run go on longer"
        )
    b = _Builder()
    b.costs_from, b.costs_source = costs_from, costs_source or "another run's report.json"
    cfg = _dynres_config(run.config, run.config_source)
    csrc = f"run config ({Path(run.config_source).name})" if cfg is not None else ""
    if run.format == DYNRES:
        return _fit_dynres(run, cfg, csrc, b)
    return _fit_verl(run, cfg, csrc, b)


# ---- The run config ------------------------------------------------------------------------------


def _fit_config(
    b: _Builder,
    cfg: DynresConfig | None,
    csrc: str,
    *,
    trigger: tuple[int, str] | None,
    required: tuple[int, str] | None,
    n: tuple[int, str] | None,
    staleness: tuple[float, str] | None,
    policy: tuple[str, str] | None,
    dynamic: tuple[bool, str] | None,
    cluster: tuple[int, int, int, str] | None,
) -> None:
    """The async_training, actor_rollout_ref and cluster sections: config first, then derived values."""
    if cfg is not None:
        at = cfg.async_training.model_dump(exclude_unset=True)
        for key in (
            "use_dynamic_resource_scheduling",
            "dynamic_schedule_policy",
            "staleness_threshold",
            "trigger_parameter_sync_step",
            "require_batches",
            "partial_rollout",
            "concurrent_samples_per_replica",
        ):
            b.set(f"async_training.{key}", getattr(cfg.async_training, key), csrc)
        for key, value in at.items():
            if f"async_training.{key}" not in b.notes:
                b.set(f"async_training.{key}", value, csrc)
        b.set("actor_rollout_ref.actor.ppo_mini_batch_size", cfg.actor_rollout_ref.actor.ppo_mini_batch_size, csrc)
        b.set("actor_rollout_ref.rollout.n", cfg.actor_rollout_ref.rollout.n, csrc)
        tp = cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
        b.set("cluster.trainer_gpus", cfg.trainer.n_gpus, csrc)
        b.set("cluster.rollout_gpus", cfg.rollout.n_gpus, csrc)
        b.set("cluster.gpus_per_replica", tp, csrc)
        return
    if policy is None and dynamic is not None and not dynamic[0]:
        policy = ("static_fully_async", "[D] dynamic scheduling was off")
    derived: tuple[tuple[str, tuple[Any, str] | None, str], ...] = (
        ("async_training.trigger_parameter_sync_step", trigger, "the run config's trigger_parameter_sync_step"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", required, "the run config's ppo_mini_batch_size"),
        ("actor_rollout_ref.rollout.n", n, "the run config's rollout.n"),
        ("async_training.staleness_threshold", staleness, "the run config's staleness_threshold"),
        ("async_training.dynamic_schedule_policy", policy, "the run config's dynamic_schedule_policy"),
        ("async_training.use_dynamic_resource_scheduling", dynamic, "the run config's use_dynamic_resource_scheduling"),
    )
    for key, got, metric in derived:
        if got is None:
            b.default(key, metric + " (give --config)")
        else:
            b.set(key, got[0], got[1])
    if "actor_rollout_ref.actor.ppo_mini_batch_size" in b.notes and required is not None:
        b.set("async_training.require_batches", 1, "with ppo_mini_batch_size = samples per fit step")
    b.default("async_training.partial_rollout", "the run config's partial_rollout (give --config)")
    b.default("async_training.concurrent_samples_per_replica", "the run config's concurrent_samples_per_replica")
    if cluster is None:
        for key in ("cluster.trainer_gpus", "cluster.rollout_gpus", "cluster.gpus_per_replica"):
            b.default(key, "the cluster split (give --config with trainer/rollout GPU counts)")
    else:
        t, r, g, note = cluster
        b.set("cluster.trainer_gpus", t, note)
        b.set("cluster.rollout_gpus", r, note)
        b.set("cluster.gpus_per_replica", g, note)


def _get(b: _Builder, dotted: str) -> Any:
    node: Any = b.raw
    for part in dotted.split("."):
        node = node[part]
    return node


# ---- Shared fits ---------------------------------------------------------------------------------


def _fit_drift(b: _Builder, log_means: Sequence[float], what: str) -> None:
    """median_tokens (step 0) and growth_per_step from each cycle's mean log-length."""
    a, slope, se = _slope(log_means)
    if math.isfinite(se) and abs(slope) > DRIFT_MIN_SIGMAS * se:
        growth = min(0.5, max(-0.5, math.expm1(slope)))
        b.set(
            "workload.response.growth_per_step",
            round(growth, 6),
            f"[D] slope of log {what} over {len(log_means)} cycles, +-{se:.2g}/cycle (1 s.e.)",
        )
        b.set(
            "workload.response.median_tokens", round(math.exp(a), 3), f"[D] intercept of that fit at cycle 0 ({what})"
        )
    else:
        why = "fewer than 3 cycles" if not math.isfinite(se) else f"slope {slope:.2g} +- {se:.2g}/cycle not significant"
        b.set("workload.response.growth_per_step", 0.0, f"[D] no drift: {why}")
        mean, spread = _stats(log_means)
        b.set(
            "workload.response.median_tokens",
            round(math.exp(mean), 3),
            f"[D] exp(mean log {what}), n={len(log_means)} cycles, "
            f"cycle-to-cycle sd {math.exp(spread * abs(mean)) - 1:.1%}",
        )


def _fit_peak(b: _Builder, work: Sequence[float], replica_time: Sequence[float], how: str, scenario_c: float) -> float:
    """decode.peak_tokens_per_s from work (decode tokens) over replica time (replica-seconds) per cycle."""
    pairs = [(w, t) for w, t in zip(work, replica_time, strict=True) if t > 0 and w > 0]
    if not pairs:
        return float(b.default("workload.decode.peak_tokens_per_s", "generation work and time"))
    tput = sum(w for w, _ in pairs) / sum(t for _, t in pairs)
    ch = Scenario().workload.decode.c_half  # lone_request_fraction keeps its default (not identifiable)
    peak = tput * (scenario_c + ch) / scenario_c
    per_cycle = [w / t for w, t in pairs]
    b.set(
        "workload.decode.peak_tokens_per_s",
        round(peak, 3),
        f"[D] {tput:.4g} tok/s per replica at c={scenario_c:g} requests ({how}; {_q(per_cycle)}) x (c + c_half)/c",
    )
    return peak


def _record_of(cycle: Mapping[str, Any]) -> dict[str, Any]:
    """A report.json cycle as the flat metrics.jsonl record (``metrics`` and ``batch/*`` keys on top)."""
    rec = dict(cycle)
    rec.update(cycle.get("metrics") or {})
    rec.update({BATCH_PREFIX + k: v for k, v in (cycle.get("batch") or {}).items()})
    return rec


def _cycle_work(
    cycles: Sequence[Mapping[str, Any]], n: int, prefill: float, prompt: float
) -> tuple[list[float], list[float], list[float]]:
    """Per usable cycle: response work (decode tokens), busy replica time per replica (seconds) and
    the share of the cycle the hybrid replicas generated (fraction; 0 when they were asleep).

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


HYBRID_FACTOR_MIN = 0.05
"""Smallest hybrid_speed_factor the fit writes (fraction): the scenario needs > 0, and a solved
factor at or below 0 means the hybrid replica added nothing measurable."""


def _fit_hybrid_speed(
    b: _Builder, sc: Scenario, peak: float, prefill: float, prompt: float, own_hybrid_generated: bool
) -> float | None:
    """workload.decode.hybrid_speed_factor from --costs-from's cycles with hybrid replicas generating;
    returns the solved factor before clamping (None = not solved).

    With this run's per-replica speed ``tput`` at the rollouter's concurrency, each such cycle's
    work is ``tput x busy x (S + f x H x share)``; ``f`` is solved over those cycles together (least
    squares on the totals). The run's own cycles are not used for it: their throughput is pooled
    into ``peak`` (one unknown per run; per-replica token counts are not recorded).
    """
    key = "workload.decode.hybrid_speed_factor"
    other = b.costs_from or {}
    cyc = [_record_of(c) for c in other.get("cycles") or [] if isinstance(c, Mapping)]
    S, H = sc.num_standalone_replicas, sc.num_hybrid_replicas
    c_req = sc.async_training.concurrent_samples_per_replica * sc.responses_per_sample
    tput = peak * c_req / (c_req + sc.workload.decode.c_half)
    work, busy, share = _cycle_work(cyc, sc.responses_per_sample, prefill, prompt)
    with_h = [(w, t, h) for w, t, h in zip(work, busy, share, strict=True) if h > 0 and t > 0]
    if H and with_h and tput > 0:
        extra = sum(w / tput - t * S for w, t, _ in with_h)
        denom = sum(t * H * h for _, t, h in with_h)
        f = extra / denom
        per = [(w / tput - t * S) / (t * H * h) for w, t, h in with_h]
        clamp = ""
        if not HYBRID_FACTOR_MIN <= f <= 1.0:
            clamp = f"; solved {f:.3g}, clamped to [{HYBRID_FACTOR_MIN}, 1]"
        b.set(
            key,
            round(min(1.0, max(HYBRID_FACTOR_MIN, f)), 4),
            f"[D] {b.costs_source} (--costs-from) cycles with hybrids generating: work / ({tput:.4g} tok/s "
            f"per replica of this run) = busy x ({S} + f x {H} x share), n={len(per)} cycles, "
            f"per-cycle f {min(per):.2g}..{max(per):.2g}{clamp}",
        )
        return f
    if own_hybrid_generated:
        b.default(key, "a separate hybrid-replica throughput (the fit pools all replicas; give --costs-from)")
    else:
        b.default(
            key,
            "hybrid-replica throughput (hybrid replicas never generated; give --costs-from a run where they did)",
        )
    return None


def _gpu_slot(slot: Any) -> bool:
    return isinstance(slot, Mapping) and float(slot.get("GPU") or 0) > 0


def _host_facts(rcfg: Mapping[str, Any]) -> tuple[bool | None, str]:
    """Whether a dynres run config puts every engine on one machine's CPU cores, and the facts read.

    True: vLLM / torch engines, no GPU in any Ray slot nor a CUDA trainer device, all on one
    machine (``engines.runtime: local`` or a local Ray, ``cluster.address`` null). False: fake
    engines (modelled speeds share nothing) or GPUs. None: the config does not tell.
    """
    engines = rcfg.get("engines")
    if not isinstance(engines, Mapping):
        return None, ""
    rollout, trainer = engines.get("rollout"), engines.get("trainer")
    if rollout != "vllm":
        return False, f"engines.rollout={rollout}: modelled speeds, no compute shared"
    raw_cl, raw_topts = rcfg.get("cluster"), engines.get("trainer_options")
    cl: Mapping[str, Any] = raw_cl if isinstance(raw_cl, Mapping) else {}
    topts: Mapping[str, Any] = raw_topts if isinstance(raw_topts, Mapping) else {}
    slots = {k: cl.get(k) for k in ("slot", "trainer_slot", "standalone_slot") if cl.get(k)}
    gpu = [f"cluster.{k}={_scalar(v)}" for k, v in slots.items() if _gpu_slot(v)]
    device = str(topts.get("device") or "cpu")
    if trainer == "torch" and device != "cpu":
        gpu.append(f"engines.trainer_options.device={device}")
    if gpu:
        return False, f"engines on accelerators ({', '.join(gpu)})"
    local = engines.get("runtime") == "local" or cl.get("address") is None
    where = "engines.runtime=local" if engines.get("runtime") == "local" else "a local Ray (cluster.address null)"
    slot_text = ", ".join(f"cluster.{k}={_scalar(v)}" for k, v in slots.items()) or "no slot"
    facts = f"engines.rollout=vllm, engines.trainer={trainer} on CPU ({slot_text}, no GPU)"
    if not local:
        return None, f"{facts} on the Ray cluster at {cl.get('address')}: one host or several is not known"
    return True, f"{facts}, {where}"


def _fit_shared_host(b: _Builder, rcfg: Mapping[str, Any] | None, solved_hybrid: float | None, verl: bool) -> None:
    """cluster.shared_host from the run config's engines and device, and from a solved hybrid factor <= 0.

    On a shared host the hybrid replica is the same engine on the same cores as a standalone one,
    so hybrid_speed_factor (its share of the host) is 1; the --costs-from solve, which assumes the
    hybrid adds its own capacity, does not apply there and is only quoted.
    """
    key = "cluster.shared_host"
    facts: tuple[bool | None, str] = (None, "")
    if rcfg:
        facts = _host_facts(rcfg)
    if verl and facts[0] is None:
        facts = (False, "verl runs its engines on GPUs")
    negative = solved_hybrid is not None and solved_hybrid <= 0
    evidence = (
        f"--costs-from's solved hybrid_speed_factor {solved_hybrid:.3g} <= 0: the woken hybrid replica added no "
        "throughput"
        if negative
        else ""
    )
    shared, conflict = facts[0], ""
    if shared is None and negative:
        shared = True
    elif shared is False and negative:
        conflict = f"; but {evidence} (contention the simulator does not model)"
    if shared is None:
        b.default(key, "the engines' device (config.json engines and cluster slots)")
        return
    if facts[0] is True:
        note = f"[E] from config.json facts: {facts[1]}; all engines share its cores" + (
            f"; [D] {evidence}" if negative else ""
        )
    elif facts[0] is None:
        note = f"[D] {evidence}" + (f" ({facts[1]})" if facts[1] else "")
    else:
        note = f"[E] from run config facts: {facts[1]}: each replica computes on its own{conflict}"
    b.set(key, shared, note)
    if shared:
        solved = f"; --costs-from solved {solved_hybrid:.3g} for an added replica, not applicable" if negative else ""
        b.set(
            "workload.decode.hybrid_speed_factor",
            1.0,
            f"[E] shared host: the hybrid replica is the same engine on the same cores, an equal share{solved}",
        )
        b.missing[:] = [m for m in b.missing if "workload.decode.hybrid_speed_factor" not in m]


def _fit_steps_s(
    b: _Builder, times: Sequence[float], tokens: Sequence[float], sc_partial: dict[str, Any], what: str
) -> None:
    """workload.train.step_s from fit-step times and their batch tokens (token_fraction 1)."""
    sc = load_scenario(sc_partial)
    t0 = reference_batch_tokens(sc)
    norm = [t * t0 / tok for t, tok in zip(times, tokens, strict=True) if tok > 0]
    mean, _ = _stats(norm)
    b.set(
        "workload.train.step_s",
        round(mean, 6),
        f"[D] mean {what} scaled to the step-0 batch of {t0:.0f} tokens ({_q(norm, 'fit steps')})",
    )
    b.set("workload.train.reference_gpus", sc.cluster.trainer_gpus, "the trainer GPUs step_s was measured on")
    b.set("workload.train.token_fraction", 1.0, "[E] step time proportional to batch tokens")


# ---- dynres ----------------------------------------------------------------------------------------


def _fit_dynres(run: RunMetrics, cfg: DynresConfig | None, csrc: str, b: _Builder) -> FitResult:
    cycles = run.cycles
    report = run.report or {}
    rcfg = run.config or {}
    task = rcfg.get("task") if isinstance(rcfg.get("task"), Mapping) else {}
    triggers = [len(c.get("step_wait_times") or []) for c in cycles]
    trigger = max(set(triggers), key=triggers.count) if any(triggers) else 0
    consumed = run.series("samples_consumed")
    samples = run.series(BATCH_PREFIX + "samples")
    responses = run.series(BATCH_PREFIX + "responses")
    n_resp = round(sum(responses) / sum(samples)) if samples and sum(samples) > 0 else None
    policy = report.get("policy")
    cluster = None
    if report.get("hybrid_gpus") is not None and report.get("standalone_gpus") is not None:
        cluster = (
            int(report["hybrid_gpus"]) or 1,
            int(report["standalone_gpus"]),
            1,
            "report.json hybrid/standalone GPUs",
        )
    _fit_config(
        b,
        cfg,
        csrc,
        trigger=(trigger, f"[D] collections per cycle (len step_wait_times), {_q(triggers)}") if trigger else None,
        required=(round(_stats(consumed)[0] / trigger), "[D] samples_consumed / trigger")
        if trigger and consumed
        else None,
        n=(n_resp, "[D] batch/responses / batch/samples") if n_resp else None,
        staleness=None,
        policy=(policy, "report.json policy") if policy else None,
        dynamic=(bool(report.get("hybrid_gpus")), "report.json hybrid_gpus > 0") if report else None,
        cluster=cluster,
    )
    if policy and cfg is not None:
        b.set("async_training.dynamic_schedule_policy", policy, "report.json policy (the policy that ran)")
    b.set("steps", len(cycles), f"[M] sync cycles in {run.path.name}")
    b.set("seed", 0, "workload RNG seed (compare with --seeds for the spread over draws)")

    # Response lengths and prompts.
    log_means = run.series(BATCH_PREFIX + "response_log_tokens_mean")
    if len(log_means) >= MIN_CYCLES:
        _fit_drift(b, log_means, "response tokens (batch/response_log_tokens_mean)")
        stds = run.series(BATCH_PREFIX + "response_log_tokens_std")
        sigma = math.sqrt(sum(s * s for s in stds) / len(stds))
        b.set(
            "workload.response.sigma",
            round(min(sigma, 4.0), 6),
            f"[D] pooled within-cycle sd of log length, {_q(stds)}",
        )
        shares = run.series(BATCH_PREFIX + "response_log_group_share")
        rho = _stats(shares)[0] if shares and sigma > 1e-9 else None
        if rho is None:
            b.default("workload.response.group_correlation", "length variance (all responses as long)")
        else:
            b.set(
                "workload.response.group_correlation",
                round(rho, 4),
                f"[D] between-group share of log variance, {_q(shares)}",
            )
    else:
        means = run.series("cycle_mean/response_length/mean") or run.series("response_length/mean")
        if len(means) < MIN_CYCLES:
            raise MetricsError(
                f"metrics {run.path}: no response lengths (batch/response_log_tokens_mean or "
                "response_length/mean) in the records; re-run with this dynres version, which records them"
            )
        _fit_drift(b, [math.log(m) for m in means], "mean response length (response_length/mean)")
        b.default("workload.response.sigma", "batch/response_log_tokens_std")
        b.default("workload.response.group_correlation", "batch/response_log_group_share")
    maxes = run.series(BATCH_PREFIX + "response_tokens_max")
    if isinstance(task, Mapping) and task.get("max_tokens"):
        b.set("workload.response.max_tokens", int(task["max_tokens"]), f"{csrc or 'run config'} task.max_tokens")
    elif maxes:
        b.set(
            "workload.response.max_tokens",
            int(max(maxes)),
            f"[D] longest response seen (n={len(maxes)} cycles); a lower bound on the cap",
        )
    else:
        b.default("workload.response.max_tokens", "the response cap (task.max_tokens)")
    prompts = run.series(BATCH_PREFIX + "prompt_tokens_mean")
    if prompts:
        b.set(
            "workload.prompt_tokens", max(1, round(_stats(prompts)[0])), f"[M] batch/prompt_tokens_mean, {_q(prompts)}"
        )
    elif isinstance(task, Mapping) and task.get("prompt_length"):
        b.set("workload.prompt_tokens", int(task["prompt_length"]), "run config task.prompt_length")
    else:
        b.default("workload.prompt_tokens", "batch/prompt_tokens_mean")

    # Replica speed.
    n = int(_get(b, "actor_rollout_ref.rollout.n"))
    prompt = float(_get(b, "workload.prompt_tokens"))
    # Reported as one missing line: both need a run at more than one concurrency.
    prefill = b.default(
        "workload.decode.prefill_cost", "prefill timing (not separable from decode in per-cycle metrics)", listed=False
    )
    lone = b.default(
        "workload.decode.lone_request_fraction", "throughput at several concurrencies (the run keeps one)", listed=False
    )
    b.missing.append(
        f"prefill and single-request speed -> workload.decode.prefill_cost = {prefill:g}, "
        f"workload.decode.lone_request_fraction = {lone:g} (a run at one concurrency cannot separate them)"
    )
    sc_now = load_scenario(b.raw)
    standalone = sc_now.num_standalone_replicas
    hybrid = sc_now.num_hybrid_replicas
    csr = sc_now.async_training.concurrent_samples_per_replica
    work, busy, hybrid_share = _cycle_work(cycles, n, float(prefill), prompt)
    rtime = [t * (standalone + hybrid * h) for t, h in zip(busy, hybrid_share, strict=True)]
    peak = _fit_peak(
        b,
        work,
        rtime,
        "response work of samples_generated over (duration - weight_sync_s) x rollout util x replicas",
        csr * n,
    )
    solved_hybrid = _fit_hybrid_speed(b, sc_now, peak, float(prefill), prompt, any(hybrid_share))
    _fit_shared_host(b, rcfg, solved_hybrid, verl=False)

    # Trainer.
    times: list[float] = []
    tokens: list[float] = []
    required = sc_now.required_samples
    for c in cycles:
        mean_len = c.get(BATCH_PREFIX + "response_tokens_mean") or c.get("cycle_mean/response_length/mean")
        pt = c.get(BATCH_PREFIX + "prompt_tokens_mean") or prompt
        steps = c.get("train_step_times") or []
        if not steps and c.get("dynamic_resource/train_compute_time_s") and trigger:
            steps = [float(c["dynamic_resource/train_compute_time_s"]) / trigger] * trigger
        for t in steps:
            times.append(float(t))
            tokens.append(required * n * (float(pt) + float(mean_len or 0)))
    if not times:
        raise MetricsError(
            f"metrics {run.path}: no fit-step times (train_step_times or "
            "dynamic_resource/train_compute_time_s) in the records; re-run with this dynres version"
        )
    _fit_steps_s(b, times, tokens, b.raw, "train_step call")
    # Phases only split the utilization metric, never a duration: commented, not listed as missing.
    b.default("workload.train.phase_fractions", "per-phase trainer times (the record has their sum only)", listed=False)

    # Costs.
    syncs = run.series("weight_sync_s")
    export = _op_mean(report, "export_weights")
    if export:
        b.set(
            "costs.export_weights_s", round(export[0], 6), f"[M] report.json export_weights mean, n={export[1]} calls"
        )
    else:
        b.default("costs.export_weights_s", "export_weights timing (report.json)")
    if syncs:
        ex = export[0] if export else 0.0
        per = [max(0.0, s - ex) for s in syncs]
        b.set(
            "costs.weight_sync_s",
            round(_stats(per)[0], 6),
            f"[M] cycle weight_sync_s minus export: pause + load + resume of a replica, {_q(per)}",
        )
    else:
        upd = _op_mean(report, "update_weights")
        if upd:
            b.set("costs.weight_sync_s", round(upd[0], 6), f"[M] report.json update_weights mean, n={upd[1]} calls")
        else:
            b.default("costs.weight_sync_s", "weight_sync_s (record) or update_weights (report.json)")
    _switch_costs(b, report, "no {op} call in report.json")
    measured = float(report.get("end_to_end_s") or cycles[-1]["end_s"])
    first = float(cycles[0]["start_s"])
    return _result(run, b, measured, first, str(_get(b, "async_training.dynamic_schedule_policy")))


SWITCH_OPS: tuple[tuple[str, str], ...] = (
    ("costs.sleep_s", "sleep"),
    ("costs.wake_up_s", "wake_up"),
    ("costs.abort_s", "abort"),
    ("costs.trainer_offload_s", "offload"),
    ("costs.trainer_onload_s", "onload"),
)
"""Scenario cost key and engine operation of each switch step (seconds each)."""

WAKE_UP_CALLS = 2
"""wake_up calls per replica per activation (count): the controller wakes the weights, loads them,
then wakes the KV cache; the scenario's ``wake_up_s`` is both together."""


def _probe_values(report: Mapping[str, Any] | None, op: str) -> list[float]:
    """One value per probed switch of a replica (or of the trainer) for ``op`` from a report's
    ``startup_probe`` (seconds): wake_up sums a replica's weights and kv_cache calls of a round."""
    probe = (report or {}).get("startup_probe")
    if not isinstance(probe, Mapping):
        return []
    steps = [s for s in probe.get("steps") or [] if isinstance(s, Mapping) and s.get("ok") and s.get("op") == op]
    if op != "wake_up":
        return [float(s["duration_s"]) for s in steps]
    per: dict[tuple[Any, Any], float] = {}
    for s in steps:
        key = (s.get("round"), s.get("target"))
        per[key] = per.get(key, 0.0) + float(s["duration_s"])
    return list(per.values())


def _probe_note(values: Sequence[float], op: str, where: str) -> str:
    what = "replica wake-ups (weights + kv_cache calls)" if op == "wake_up" else f"{op} calls"
    if len(values) < 2:
        spread = "spread unknown (one value; raise run.startup_probe for more)"
    else:
        spread = f"spread {_stats(values)[1] * 100:.0f}%, max {max(values):.3g} s"
    return f"[M] {where} start-up probe (idle switch before cycle 1), mean of n={len(values)} {what}, {spread}"


def _ops_cost(report: Mapping[str, Any] | None, op: str) -> tuple[float, str] | None:
    """Mean cost of ``op`` per switch from a report's cycle operations, and how it was counted."""
    got = _op_mean(report, op)
    if not got:
        return None
    mean, count = got
    st = report["operations"]["engine"][op] if report else {}
    tail = f"n={count} calls, max {float(st.get('max_s') or 0.0):.3g} s"
    if op == "wake_up":
        return mean * WAKE_UP_CALLS, f"{WAKE_UP_CALLS} x mean wake_up call (weights, then kv_cache), {tail}"
    return mean, f"{op} mean, {tail}"


def _switch_costs(b: _Builder, report: Mapping[str, Any] | None, why_missing: str) -> None:
    """Switch costs, first found of: the run's own switches, --costs-from's switches, the run's
    start-up probe, --costs-from's start-up probe; else the defaults, named as missing.

    Switches made during cycles come first: they are what the simulator replays (under load,
    with their aborts); the probe measures an idle switch, and has no abort.
    """
    for key, op in SWITCH_OPS:
        own, other = _ops_cost(report, op), _ops_cost(b.costs_from, op)
        own_probe, other_probe = _probe_values(report, op), _probe_values(b.costs_from, op)
        if own:
            b.set(key, round(own[0], 6), f"[M] report.json {own[1]}")
        elif other:
            b.set(key, round(other[0], 6), f"[M] {b.costs_source} {other[1]} (--costs-from)")
        elif own_probe:
            b.set(key, round(_stats(own_probe)[0], 6), _probe_note(own_probe, op, "report.json"))
        elif other_probe:
            note = _probe_note(other_probe, op, b.costs_source)
            b.set(key, round(_stats(other_probe)[0], 6), note + " (--costs-from)")
        else:
            why = why_missing.format(op=op)
            if op != "abort" and report is not None and not (report or {}).get("startup_probe"):
                why += "; no start-up probe (run.startup_probe: 0, or no hybrid replicas)"
            b.default(key, f"{op} timings ({why})")


# ---- verl ------------------------------------------------------------------------------------------


def _first(run: RunMetrics, *keys: str) -> tuple[str, list[float]] | None:
    for k in keys:
        s = run.series(k)
        if s:
            return k, s
    return None


def _fit_verl(run: RunMetrics, cfg: DynresConfig | None, csrc: str, b: _Builder) -> FitResult:
    step_key = _first(run, "timing_s/step", "perf/time_per_step")
    assert step_key is not None  # read_metrics keeps only cycles with one of them
    cycle_times = step_key[1]
    lengths = _first(run, "response_length/mean")
    if lengths is None or len(lengths[1]) < MIN_CYCLES:
        raise MetricsError(
            f"metrics {run.path}: no response_length/mean in {MIN_CYCLES}+ cycles; verl logs it with the "
            "trainer's data metrics, keep them in the logged metrics"
        )
    req = _first(run, "fully_async/static/required_samples")
    gen = run.series("fully_async/rollouter/step_generated_samples")
    required = round(req[1][-1]) if req else None
    trigger = round(_stats(gen)[0] / required) if gen and required else None
    stale = _first(run, "fully_async/static/staleness_threshold")
    dynamic = run.has("timing_s/wait_for_enough_samples")
    _fit_config(
        b,
        cfg,
        csrc,
        trigger=(max(1, trigger), "[D] step_generated_samples / required_samples") if trigger else None,
        required=(required, "[M] fully_async/static/required_samples") if required else None,
        n=None,
        staleness=(stale[1][-1], "[M] fully_async/static/staleness_threshold") if stale else None,
        policy=None,
        dynamic=(dynamic, "[D] timing_s/wait_for_enough_samples logged only with dynamic scheduling"),
        cluster=None,
    )
    b.set("steps", len(cycle_times), f"[M] sync cycles with {step_key[0]} in {run.path.name}")
    b.set("seed", 0, "workload RNG seed (compare with --seeds for the spread over draws)")
    raw_cfg = run.config or {}
    data_sec: Mapping[str, Any] = raw_cfg["data"] if isinstance(raw_cfg.get("data"), Mapping) else {}
    rmax = run.series("response_length/max")
    if data_sec.get("max_response_length"):
        cap = int(data_sec["max_response_length"])
        b.set("workload.response.max_tokens", cap, "run config data.max_response_length")
    elif rmax:
        cap = int(max(rmax))
        b.set(
            "workload.response.max_tokens",
            cap,
            f"[D] largest response_length/max (n={len(rmax)} cycles); a lower bound on the cap",
        )
    else:
        cap = int(b.default("workload.response.max_tokens", "data.max_response_length or response_length/max"))
    sigma = float(b.default("workload.response.sigma", "per-response lengths (verl logs mean/max/min only)"))
    b.default("workload.response.group_correlation", "per-response lengths by prompt group")
    logs = [math.log(_median_for_mean(m, sigma, cap)) for m in lengths[1]]
    _fit_drift(b, logs, "median solved from response_length/mean (capped lognormal, sigma as set)")
    plen = _first(run, "prompt_length/mean")
    if plen:
        b.set("workload.prompt_tokens", max(1, round(_stats(plen[1])[0])), f"[M] prompt_length/mean, {_q(plen[1])}")
    else:
        b.default("workload.prompt_tokens", "prompt_length/mean")
    sc_now = load_scenario(b.raw)
    n = sc_now.responses_per_sample
    prompt = float(sc_now.workload.prompt_tokens)
    prefill = float(b.default("workload.decode.prefill_cost", "prefill timing"))
    b.default("workload.decode.lone_request_fraction", "throughput at several concurrencies")
    b.default("workload.decode.hybrid_speed_factor", "hybrid-replica throughput")
    _fit_shared_host(b, run.config, None, verl=True)
    work, rtime = [], []
    for c, mlen in zip(run.cycles, [c.get("response_length/mean") for c in run.cycles], strict=True):
        active = c.get("fully_async/rollouter/active_time")
        g = c.get("fully_async/rollouter/step_generated_samples")
        if active and g and mlen:
            work.append(float(g) * n * (float(mlen) + prefill * prompt))
            rtime.append(float(active) * sc_now.num_standalone_replicas)
    if work:
        _fit_peak(
            b,
            work,
            rtime,
            "step_generated_samples x n x length over rollouter active_time x standalone replicas",
            sc_now.async_training.concurrent_samples_per_replica * n,
        )
    else:
        b.default("workload.decode.peak_tokens_per_s", "fully_async/rollouter/active_time and step_generated_samples")
    # Fit steps: the cycle's compute over its fit steps.
    trig = sc_now.async_training.trigger_parameter_sync_step
    times, tokens, phase_tot = [], [], dict.fromkeys(VERL_PHASES, 0.0)
    for c in run.cycles:
        comp = c.get("dynamic_resource/train_compute_time_s")
        phases = {p: float(c.get(f"timing_s/{p}") or 0.0) for p in VERL_PHASES}
        if not comp:
            comp = sum(phases.values())
        mlen = c.get("response_length/mean")
        if comp and mlen:
            times.append(float(comp) / trig)
            tokens.append(sc_now.required_samples * n * (prompt + float(mlen)))
        for p, v in phases.items():
            phase_tot[p] += v
    if not times:
        raise MetricsError(
            f"metrics {run.path}: no trainer compute time (dynamic_resource/train_compute_time_s or "
            "timing_s/update_actor); keep verl's timing metrics in the logged metrics"
        )
    _fit_steps_s(b, times, tokens, b.raw, "compute per fit step (train_compute_time_s / trigger)")
    total = sum(phase_tot.values())
    if total > 0:
        fr = {p: round(v / total, 4) for p, v in phase_tot.items() if v > 0}
        fix = round(1.0 - sum(fr.values()), 4)
        top = max(fr, key=lambda k: fr[k])
        fr[top] = round(fr[top] + fix, 4)
        b.set("workload.train.phase_fractions", fr, "[M] share of the timing_s/<phase> sums")
    syncs = _first(run, "timing_s/param_sync", "timing_s/timing_s/param_sync")
    if syncs:
        b.set("costs.weight_sync_s", round(_stats(syncs[1])[0], 6), f"[M] {syncs[0]}, {_q(syncs[1])}")
    else:
        b.default("costs.weight_sync_s", "timing_s/param_sync")
    b.set("costs.export_weights_s", 0.0, "included in weight_sync_s (verl times the whole sync)")
    _switch_costs(b, None, "verl prints switch times but does not log them")
    measured = sum(cycle_times)
    policy = str(_get(b, "async_training.dynamic_schedule_policy"))
    return _result(run, b, measured, 0.0, policy)


def _result(run: RunMetrics, b: _Builder, measured: float, first: float, policy: str) -> FitResult:
    sc = load_scenario(b.raw)  # the fit must be a valid scenario; a bad value fails here, named
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
    b.raw.setdefault("description", f"fitted from {run.path.name} ({run.format}, {len(run.cycles)} cycles, {policy})")
    order = ["description", "steps", "seed", "async_training", "actor_rollout_ref", "cluster", "workload", "costs"]
    raw = {k: b.raw[k] for k in order if k in b.raw}
    return FitResult(
        scenario=raw,
        notes=b.notes,
        missing=b.missing,
        source=run.path,
        format=run.format,
        cycles=len(run.cycles),
        measured_end_to_end_s=measured,
        first_cycle_start_s=first,
        measured_policy=policy,
        header=header,
    )


# ---- Predictions ----------------------------------------------------------------------------------


@dataclass
class Prediction:
    """One policy simulated on a fitted scenario, over one or more seeds."""

    policy: str
    """The policy's name."""
    as_it_was: bool
    """True for the policy the measured run used."""
    predicted_s: list[float]
    """Predicted end-to-end time per seed: unmodelled warm-up + simulated run (seconds)."""
    seeds: list[int]
    """The workload seeds simulated, parallel to predicted_s."""
    switches: int
    """Hybrid activations + deactivations of the first seed's run (count)."""

    @property
    def mean_s(self) -> float:
        """Mean predicted end-to-end time over the seeds (seconds)."""
        return sum(self.predicted_s) / len(self.predicted_s)


@dataclass
class Comparison:
    """``dynres scenario compare``: predictions per policy and the as-it-was error."""

    fit: FitResult
    """The fitted scenario the predictions ran on."""
    warmup_s: float
    """Measured time before the first cycle minus the simulated one, added to every prediction
    (seconds; engine warm-up the simulator does not model)."""
    predictions: list[Prediction]
    """As-it-was first, then each named policy in order."""

    @property
    def as_it_was(self) -> Prediction:
        """The prediction of the run as it was measured."""
        return next(p for p in self.predictions if p.as_it_was)

    @property
    def error(self) -> float:
        """(predicted - measured) / measured of the as-it-was prediction (fraction)."""
        m = self.fit.measured_end_to_end_s
        return (self.as_it_was.mean_s - m) / m if m > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` payload: measured, warm-up, one entry per policy, the as-it-was error."""
        base = self.as_it_was.mean_s
        return {
            "metrics": str(self.fit.source),
            "format": self.fit.format,
            "cycles": self.fit.cycles,
            "measured_policy": self.fit.measured_policy,
            "measured_end_to_end_s": self.fit.measured_end_to_end_s,
            "warmup_s": self.warmup_s,
            "as_it_was_error": self.error,
            "predictions": [
                {
                    "policy": p.policy,
                    "as_it_was": p.as_it_was,
                    "predicted_end_to_end_s": p.mean_s,
                    "per_seed_s": p.predicted_s,
                    "seeds": p.seeds,
                    "vs_as_it_was": (p.mean_s - base) / base if base > 0 else None,
                    "switches": p.switches,
                }
                for p in self.predictions
            ],
            "missing": list(self.fit.missing),
        }


def check_policies(policies: Sequence[str]) -> None:
    """Resolve every policy name now (PolicyError naming it and the installed ones) before any work."""
    from dynres.core.config import AsyncTrainingConfig
    from dynres.core.loading import policy_from_config

    for name in policies:
        policy_from_config(AsyncTrainingConfig(), name)


def predict(
    fit: FitResult,
    policies: Sequence[str],
    *,
    seeds: int = 1,
    overrides: Mapping[str, Any] | None = None,
) -> Comparison:
    """Simulate the fitted run as it was and with each of ``policies``; ``seeds`` draws each.

    A policy other than static_fully_async on a scenario without dynamic scheduling gets
    ``use_dynamic_resource_scheduling: true`` (the trainer's GPUs host hybrid replicas), since it
    would otherwise run exactly like the static one.
    """
    from dynres.runtime.sim.runner import build_policy, simulate

    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}: must be >= 1; give the number of workload draws per policy")
    sc = fit.load(overrides)
    names = [fit.measured_policy] + [p for p in policies if p != fit.measured_policy]
    results: list[Prediction] = []
    first_sim: list[float] = []
    for i, name in enumerate(names):
        run_sc = sc
        if i and not sc.async_training.use_dynamic_resource_scheduling and name != "static_fully_async":
            run_sc = load_scenario(sc, overrides={"async_training.use_dynamic_resource_scheduling": True})
        pol_name = name
        e2e, used, switches = [], [], 0
        for k in range(seeds):
            seed = sc.seed + k
            r = simulate(run_sc.model_copy(update={"seed": seed}), policy=build_policy(run_sc, pol_name))
            e2e.append(r.end_to_end_s)
            used.append(seed)
            if k == 0:
                switches = r.switches
            if i == 0 and r.report.cycles:
                first_sim.append(r.report.cycles[0].start_s)
        results.append(Prediction(policy=name, as_it_was=i == 0, predicted_s=e2e, seeds=used, switches=switches))
    # Can be negative for verl, whose logged cycle times exclude the start-up the simulator runs.
    warmup = fit.first_cycle_start_s - (sum(first_sim) / len(first_sim) if first_sim else 0.0)
    for p in results:
        p.predicted_s = [t + warmup for t in p.predicted_s]
    return Comparison(fit=fit, warmup_s=warmup, predictions=results)


__all__ = [
    "DYNRES",
    "VERL",
    "Comparison",
    "FitResult",
    "Prediction",
    "check_policies",
    "config_from_file",
    "fit_scenario",
    "predict",
]
