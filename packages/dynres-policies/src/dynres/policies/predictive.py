"""`predictive`: lend the trainer's GPUs only when a forecast of the next cycle says it pays."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from dynres.core import Policy, ScheduleContext
from dynres.core.errors import PolicyValidationError


@dataclass(frozen=True)
class Estimates:
    """What the policy has learned from finished cycles (all JSON numbers; 0 = not measured yet).

    Rates are kept relative to the training time of a cycle, so they stay valid while response
    lengths (and with them both generation and training time) grow during a run.
    """

    train_s: float = 0.0
    """Seconds of train_step calls per sync cycle (seconds)."""
    sync_s: float = 0.0
    """Seconds of one weight sync (seconds)."""
    sync_min_s: float = 0.0
    """Shortest weight sync of any cycle: a sync that drained no running samples (seconds; 0 = none yet)."""
    activate_s: float = 0.0
    """Seconds of one activation (seconds)."""
    deactivate_s: float = 0.0
    """Seconds of one deactivation (seconds)."""
    standalone_share: float = 0.0
    """Samples the standalone replicas produce per second of training, over a cycle's samples
    (1 = exactly keeps up with the trainer; fraction)."""
    wait_bias: float = 0.0
    """Correction added to the forecast wait target, learned from waits after deactivation (samples)."""
    token_gain: float = -1.0
    """Hybrid replicas' token rate while routable over the standalone replicas' token rate in the
    same cycles (ratio, the model's rho measured directly; -1 = engines count no tokens or no hybrid
    cycle yet)."""
    static_idle_share: float = -1.0
    """Realised trainer idle per second of training in cycles without hybrids (ratio; -1 = none seen)."""
    hybrid_idle_share: float = -1.0
    """The same in cycles with hybrids, activation and deactivation included (ratio; -1 = none seen)."""
    hybrid_cycles: int = 0
    """Cycles that ran with hybrid replicas (count)."""
    last_hybrid_step: int = 0
    """global_steps after the latest cycle that ran with hybrid replicas (global step; 0 = none)."""
    static_cycles: int = 0
    """Cycles that ran without hybrid replicas (count)."""
    queue_end: float = -1.0
    """Queue size at the end of the latest cycle: the next cycle's starting stock (samples; -1 = none yet)."""
    wait_cap: float = 0.0
    """Most the wait target may be, set by the first cycle with hybrids and moved by what later ones
    missed, like ``wait_bias`` (samples; 0 = none, or released by a draining sync)."""
    losses: int = 0
    """Consecutive hybrid cycles that realised no saving over the static reference (count)."""
    backoff: int = 0
    """Length of the latest back-off (cycles; 0 = never backed off)."""
    suppress_until: int = 0
    """No activation while global_steps is below this (global step; a back-off in force)."""


@dataclass(frozen=True)
class Forecast:
    """The next cycle's trainer idle with and without hybrid replicas, and the wait target."""

    static_idle_s: float
    """Forecast trainer idle without hybrid replicas (seconds)."""
    hybrid_idle_s: float
    """Forecast trainer idle with hybrid replicas, activation and deactivation included (seconds)."""
    switch_s: float
    """Measured (or assumed) activation + deactivation cost (seconds)."""
    wait_samples: int
    """Queue size to wait for before deactivating (samples)."""
    window_s: float = 0.0
    """How long the hybrid replicas must stay routable for the queue to reach ``wait_samples``,
    standalone and hybrid production together (seconds; 0 when nothing was measured)."""

    @property
    def saving_s(self) -> float:
        """Idle the hybrid replicas are expected to remove, switches paid (seconds; may be negative)."""
        return self.static_idle_s - self.hybrid_idle_s


class PredictivePolicy(Policy):
    """Forecast the next cycle's trainer idle and lend the GPUs only when the saving beats the switch.

    The model of one sync cycle (``n`` fit steps of ``t`` seconds, ``k`` samples each, ``q``
    samples queued when it starts, standalone production ``g`` samples/s, hybrid replicas adding
    ``rho x g`` while active, activation ``a`` and deactivation ``d`` seconds):

    * without hybrids fit step ``i`` (from 0) needs ``(i + 1) k`` samples ``i t`` seconds in, so
      the trainer idles ``X = max(0, max_i ((i + 1) k - q) / g - i t)``;
    * with hybrids active for ``h`` seconds the same samples arrive ``rho h`` seconds of
      production earlier, at the price of ``a + d``; the least ``h`` that removes every later wait
      is ``(X - a - d) / (1 + rho)``, so the idle is ``a + d + h`` and the saving
      ``(X - a - d) rho / (1 + rho)``.

    ``should_activate_after_step`` says yes when that saving exceeds ``switch_cost_margin`` of
    the measured switch cost, and the queue does not already hold the wait target (the next cycle
    would deactivate at once). ``X`` is at least the idle measured in cycles without hybrids (the
    constant-rate model misses the pipeline's restart after a sync). The wait target is what the
    queue must hold at deactivation so that the standalone production alone feeds every fit step,
    plus a correction learned from the waits that still happened (a weight sync that had to drain
    running samples, without partial rollout, counts as one) and cut after cycles that never
    waited (``wait_decrease``, or ``wait_decrease_unbuffered`` where staleness 0 leaves no buffer
    for a long window to fill). After a first cycle with hybrids the target is at most that cycle's
    target raised by its miss (:meth:`second_wait_cap`), a cap later cycles raise and cut as they
    do the correction, until a sync drains running samples (``wait_cap``).

    Every cycle updates the estimates (exponential averages with weight ``ema_weight``; idle
    counted at equal stock, :meth:`stock_adjusted_idle`); a cycle in which the trainer never waited
    and the queue reached its staleness cap only raises production estimates (it was held back by
    the budget, not by the replicas). ``rho`` starts at the replica-count ratio (a hybrid replica
    as fast as a standalone one) and is measured against the idle of cycles without hybrids (once
    ``static_reference_cycles`` of them ran), and, where the engines count tokens, from the hybrid
    replicas' token rate (``token_gain``; below ``min_hybrid_gain`` they count as adding nothing).
    The first cycle's production estimate is replaced by the second's, not averaged. With
    ``calibrate_static`` on, cycles that start with a full queue run without hybrids to measure it
    until that reference exists, but only while the forecast saving is within
    ``calibrate_max_saving`` switch costs (a clear saving is not worth a cycle of waiting).

    After each hybrid cycle the realised idle (everything but training and the weight sync,
    switches included) is compared with the static reference: the idle per training second of
    cycles without hybrids, once ``static_reference_cycles`` of them ran. After ``backoff_after``
    hybrid cycles in a row without a saving the policy stops activating for
    ``probe_interval_min`` cycles, and doubles the pause (up to
    ``probe_interval_max``) each time the next probe fails too. An only-hybrid cluster always
    activates (nothing else generates). When the run's length is known: nothing is activated
    after its final sync; before the final cycle only if the wait target exceeds the queue plus
    ``in_flight_credit`` of the samples in flight (those are partly generated and arrive early,
    and a window for samples that come anyway is a switch for nothing). Before the first cycle
    (nothing measured) only if the replica-count prior ``rho`` is at least
    ``activate_at_start_min_gain``. After a first
    cycle that ran with hybrids and ended with a collection queued, ``X`` is that cycle's measured
    fit-step waits, not the forecast: the first cycle trains on the samples that finished first
    (the short ones), so its training time understates later cycles' and the forecast overstates
    the idle. The hybrid idle it is compared with includes the window the wait target needs
    (``Forecast.window_s``): the target still comes from the forecast.
    """

    name = "predictive"

    class Params(Policy.Params):
        """Tunables of the predictive policy."""

        model_config = ConfigDict(allow_inf_nan=False)

        switch_cost_margin: float = Field(
            0.2,
            ge=0.0,
            le=10.0,
            description="Activate only if the forecast net saving exceeds this fraction of the switch cost (fraction).",
        )
        switch_cost_fallback_s: float = Field(
            10.0, ge=0.0, description="Activation + deactivation cost assumed before any was measured (seconds)."
        )
        wait_margin: float = Field(
            0.0,
            ge=0.0,
            le=1.0,
            description="Extra samples in the wait target, as a fraction of a cycle's samples (fraction).",
        )
        wait_increase: float = Field(
            0.5,
            ge=0.0,
            le=2.0,
            description="Raise of the wait target after a hybrid cycle whose fit steps still waited, as a "
            "fraction of the most samples one of them waited for (fraction).",
        )
        wait_decrease: float = Field(
            0.02,
            ge=0.0,
            le=1.0,
            description="Cut of the wait target after a hybrid cycle whose fit steps never waited "
            "(fraction of a cycle's samples).",
        )
        wait_decrease_unbuffered: float = Field(
            0.04,
            ge=0.0,
            le=1.0,
            description="wait_decrease where the staleness budget leaves no buffer beyond a cycle's samples "
            "(staleness 0): a window longer than needed then fills no buffer that would shorten the next one, "
            "so its cost is all lost (fraction of a cycle's samples).",
        )
        initial_wait_ratio: float = Field(
            0.5,
            ge=0.0,
            le=1.0,
            description="Wait target before anything is measured, for a cluster with as many hybrid as "
            "standalone replicas; with rho > 1 times as many the shortfall 1 - this shrinks to (1 - this) / rho "
            "(fraction of a cycle's samples).",
        )
        ema_weight: float = Field(
            0.3, gt=0.0, le=1.0, description="Weight of the newest cycle in every running estimate (fraction)."
        )
        backoff_after: int = Field(
            3, ge=1, description="Hybrid cycles in a row without a realised saving before backing off (count)."
        )
        probe_interval_min: int = Field(4, ge=1, description="Cycles without activation after a back-off (cycles).")
        probe_interval_max: int = Field(
            32, ge=1, description="Longest back-off; each failed probe doubles it up to this (cycles)."
        )
        activate_at_start: bool = Field(
            True,
            description="Activate before the first cycle, when nothing is measured (the trainer waits for "
            "its first batch anyway).",
        )
        activate_at_start_min_gain: float = Field(
            1.0,
            ge=0.0,
            description="With activate_at_start, activate before the first cycle only if the replica-count "
            "prior rho (hybrid over standalone replicas) is at least this: the first switch is unmeasured, "
            "often a cold wake-up, and removes only a rho / (1 + rho) share of the first wait (ratio).",
        )
        calibrate_static: bool = Field(
            True,
            description="Run cycles without hybrids early on, until static_reference_cycles of them ran, to "
            "measure what hybrids add, when the forecast cannot tell (see calibrate_max_saving, calibrate_by, "
            "calibrate_min_steps).",
        )
        calibrate_max_saving: float = Field(
            1.0,
            ge=0.0,
            description="Calibrate only while the forecast saving of the next cycle is at most this many "
            "switch costs: a clearer saving is not worth a cycle of waiting to confirm (switch costs).",
        )
        calibrate_by: int = Field(
            0,
            ge=0,
            description="Latest global step for the calibration cycle if no cycle ended with a full queue "
            "before (global step; 0 = only ever after a full queue, where a cycle without hybrids costs least).",
        )
        calibrate_min_steps: int = Field(
            8, ge=1, description="Known remaining cycles needed before a calibration cycle is worth it (cycles)."
        )
        in_flight_credit: float = Field(
            0.5,
            ge=0.0,
            le=1.0,
            description="Before the run's final cycle (total_steps known), count this share of the samples in "
            "flight as already queued when asking whether a window is needed: a sample in flight is on "
            "average half generated (fraction).",
        )
        static_reference_cycles: int = Field(
            2,
            ge=1,
            description="Cycles without hybrids (the run's first included) before their idle counts as the "
            "reference that measures rho and decides a back-off: the first such cycle after hybrid ones "
            "starts with the hybrids' partly generated work in flight and idles least (seed-dynamic-16-16, "
            "seed 1: 173 s, then 190-330 s), so alone it makes hybrids look useless (count).",
        )
        min_hybrid_gain: float = Field(
            0.15,
            ge=0.0,
            description="Count the hybrid replicas as adding nothing when their measured token rate is below "
            "this fraction of the standalone replicas' (token_gain): the model's saving rho / (1 + rho) of the "
            "idle leaves out what slow hybrids cost besides the switch (work they hold, resumed elsewhere), "
            "so a few percent is no saving (ratio).",
        )
        rebalance: bool = Field(True, description="Move in-flight work onto freshly activated replicas.")

        @model_validator(mode="after")
        def _check_bounds(self) -> PredictivePolicy.Params:
            if self.probe_interval_min > self.probe_interval_max:
                raise ValueError("probe_interval_min must be <= probe_interval_max")
            return self

    params: Params

    def __init__(self, params: Params | Mapping[str, Any] | None = None) -> None:
        """Start with nothing measured."""
        super().__init__(params)
        self.est = Estimates()

    # ---- Decisions ------------------------------------------------------------------------

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        """Hand the GPUs back to the trainer whenever hybrid replicas are active."""
        return ctx.is_hybrid_active

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        """Wait until the queue holds what the cycle's fit steps need beyond later arrivals."""
        return self.forecast(ctx, self.est).wait_samples

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Activate when the forecast saving of the next cycle beats the switch cost."""
        if ctx.only_hybrid:
            return True
        return self._decide(ctx, self.learn(ctx))

    def should_rebalance(self, ctx: ScheduleContext) -> bool:
        """Move work onto freshly activated replicas (``rebalance`` param)."""
        return self.params.rebalance

    def update_after_step(self, ctx: ScheduleContext) -> None:
        """Learn rates, costs and the realised saving from the finished cycle."""
        self.est = self.learn(ctx)

    def _decide(self, ctx: ScheduleContext, est: Estimates) -> bool:
        if ctx.num_hybrid_replicas == 0:
            return False
        remaining = ctx.total_steps - ctx.global_steps if ctx.total_steps else -1
        if remaining == 0:
            return False  # the final sync leaves nothing to generate for
        fc = self.forecast(ctx, est)
        if remaining == 1 and fc.wait_samples <= ctx.queue_size + self.params.in_flight_credit * ctx.in_flight_samples:
            # The final cycle: no later cycle gains from what a window leaves queued, so a window
            # is worth it only if the fit steps need more than what is queued or nearly done
            # (verl-7b-async-32-32: a 70 s window for samples that came in time anyway).
            return False
        if ctx.global_steps == 0 or est.train_s <= 0:
            # Nothing measured: the trainer waits for its first batch anyway, and the hybrids
            # remove a rho / (1 + rho) share of that wait; a small prior share does not repay a
            # switch that is unmeasured and may be slow (cold engines).
            return self.params.activate_at_start and _replica_ratio(ctx) >= self.params.activate_at_start_min_gain
        if ctx.global_steps < est.suppress_until:
            return False
        p = self.params
        if ctx.global_steps == 1 and ctx.last_hybrid_active_s > 0 and ctx.queue_size >= ctx.required_samples:
            # The first cycle trained on the samples that finished first, the short ones: its
            # training time understates later cycles' (1.75-1.8x on two presets), so a forecast
            # from it overstates the next idle. When that cycle ended with a collection queued,
            # decide on what it measured instead: its fit steps' waits after the hybrid replicas
            # left, taken as the static idle X of the model's saving (the test below, X measured).
            # The wait target still comes from the forecast, and the window it makes the hybrids
            # hold is paid even where the measured waits are short (verl-7b-async-16-16, seed 0:
            # 39 s of waits, then a 300 s window where the cycle without hybrids waited 7 s).
            switch = self.switch_cost(est)
            rho = self.hybrid_gain(ctx, est)
            waits = sum(ctx.step_wait_times)
            hybrid_idle = switch + max(max(0.0, waits - switch) / (1.0 + rho), fc.window_s)
            return waits - hybrid_idle > p.switch_cost_margin * switch
        if fc.wait_samples <= ctx.queue_size:
            # The queue already holds the wait target: the next cycle would deactivate at once,
            # so the hybrid replicas would only cost their switch.
            return False
        if est.backoff and ctx.global_steps == est.suppress_until:
            return True  # the back-off is over: probe once, the realised cycle decides again
        stale = ctx.global_steps - est.last_hybrid_step >= p.probe_interval_max
        if stale and est.hybrid_cycles and fc.static_idle_s > fc.switch_s:
            return True  # what hybrids add was measured long ago: probe once
        if (
            p.calibrate_static
            and not self._static_reference(est)
            and (remaining < 0 or remaining >= p.calibrate_min_steps)
            and (ctx.queue_size >= ctx.buffer_samples or 0 < p.calibrate_by <= ctx.global_steps)
            and fc.saving_s <= p.calibrate_max_saving * fc.switch_s
        ):
            # The saving rests on the replica-count prior and is too small to be sure of: measure
            # one cycle without hybrids, one that starts with a full queue (it loses the least).
            return False
        return fc.saving_s > p.switch_cost_margin * fc.switch_s

    # ---- Forecast -------------------------------------------------------------------------

    def switch_cost(self, est: Estimates) -> float:
        """Measured activation + deactivation seconds, or the fallback before any was measured."""
        if est.activate_s <= 0 and est.deactivate_s <= 0:
            return self.params.switch_cost_fallback_s
        return est.activate_s + est.deactivate_s

    def measured_gain(self, est: Estimates) -> float:
        """rho measured from cycles with and without hybrids, or infinity before hybrid cycles and the
        static reference (``static_reference_cycles``) ran (ratio)."""
        if not self._static_reference(est) or est.hybrid_idle_share < 0 or est.train_s <= 0:
            return math.inf
        static_idle = est.static_idle_share * est.train_s
        saving = (est.static_idle_share - est.hybrid_idle_share) * est.train_s
        room = static_idle - self.switch_cost(est)
        r = min(0.95, max(0.0, saving / room)) if room > 0 else 0.0
        return r / (1.0 - r)

    def hybrid_gain(self, ctx: ScheduleContext, est: Estimates) -> float:
        """rho as the decisions use it: extra production with hybrids over the standalone
        replicas' alone (ratio).

        From the engines' token counts when they report them (``token_gain``, cut to 0 below
        ``min_hybrid_gain``): a direct measurement of what the hybrid replicas generate, which
        sample counts are not (with partial rollout, samples the hybrids worked on finish on
        standalone replicas, and the other way round). The tokens bound what hybrids can add, not
        what a cycle realises: once cycles without hybrids were measured as well, the lower of the
        two. Without token counts, :meth:`production_gain`.
        """
        if est.token_gain >= 0:
            tokens = est.token_gain if est.token_gain >= self.params.min_hybrid_gain else 0.0
            return min(tokens, self.measured_gain(est))
        return self.production_gain(ctx, est)

    def production_gain(self, ctx: ScheduleContext, est: Estimates) -> float:
        """rho from cycle-level measurements, what the standalone production is inferred with (ratio).

        Measured when both kinds of cycle have run: the model's saving ``(X - a - d) rho / (1 +
        rho)`` set equal to the realised one, ``X`` being the measured static idle. Before that,
        the replica-count prior (a hybrid replica as productive as a standalone one).
        """
        measured = self.measured_gain(est)
        if math.isfinite(measured):
            return measured
        return _replica_ratio(ctx)

    def initial_wait_ratio(self, ctx: ScheduleContext) -> float:
        """Wait target before anything is measured (fraction of a cycle's samples).

        ``initial_wait_ratio`` is meant for as many hybrid (trainer) as standalone replicas. With
        ``rho > 1`` times as many, the standalone replicas are ``rho`` times fewer next to the same
        trainer, so they deliver about ``1 / rho`` as much while it trains: the share of the cycle
        left to them, ``1 - initial_wait_ratio``, shrinks to ``(1 - initial_wait_ratio) / rho``
        (rollout-starved-24-8, seed 0: 0.5 made the first cycle's fit steps wait 403 s, 0.83 made
        them wait 66 s). Never below ``initial_wait_ratio``.
        """
        ratio = self.params.initial_wait_ratio
        rho = _replica_ratio(ctx)
        return max(ratio, 1.0 - (1.0 - ratio) / rho) if rho > 1.0 else ratio

    def initial_wait(self, ctx: ScheduleContext) -> int:
        """Wait target before anything is measured (samples; a whole cycle's in an only-hybrid cluster)."""
        ratio = 1.0 if ctx.only_hybrid else self.initial_wait_ratio(ctx)
        return min(ctx.step_required_samples + ctx.buffer_samples, math.ceil(ctx.step_required_samples * ratio))

    def second_wait_cap(self, ctx: ScheduleContext) -> int:
        """Cap on the wait target after a first cycle with hybrids, where ``wait_cap`` starts
        (samples): the first target raised as a miss raises it later (``wait_increase`` x the most
        samples a fit step waited for).

        The first cycle trained on the samples that finished first (the short ones), so the training
        time it measured understates the second cycle's, and a target forecast from it comes out too
        high (verl-7b-async-64-64, seed 2: 351 samples and a 212 s window whose fit steps never
        waited, where 204 would have done).
        """
        return self.initial_wait(ctx) + math.ceil(self.params.wait_increase * max(ctx.step_wait_samples, default=0))

    def forecast(self, ctx: ScheduleContext, est: Estimates) -> Forecast:
        """Forecast the next cycle from the queue in ``ctx`` and the estimates ``est``."""
        step_required = ctx.step_required_samples
        limit = step_required + ctx.buffer_samples
        k, n = ctx.required_samples, ctx.trigger_parameter_sync_step
        q = ctx.queue_size
        switch = self.switch_cost(est)
        if est.train_s <= 0 or est.standalone_share <= 0:
            return Forecast(
                static_idle_s=0.0, hybrid_idle_s=switch, switch_s=switch, wait_samples=self.initial_wait(ctx)
            )
        t = est.train_s / n
        g = _standalone_rate(ctx, est)
        static_idle = max(0.0, *(((i + 1) * k - q) / g - i * t for i in range(n)))
        if est.static_idle_share > 0:
            # The constant-rate model misses the pipeline's restart after each sync (all of it
            # without partial rollout): cycles without hybrids that idled longer are the better guide.
            static_idle = max(static_idle, est.static_idle_share * est.train_s)
        rho = self.hybrid_gain(ctx, est)
        fill = max(0.0, static_idle - switch) / (1.0 + rho)
        # What the standalone replicas alone deliver after the deactivation: a target that counts on
        # the hybrids' resumed work as well ends windows early when they did little (measured on
        # seed-dynamic-16-16: collections then waited 80-170 s after a window of 0 s).
        wait_f = max((i + 1) * k - g * (est.deactivate_s + i * t) for i in range(n))
        wait_f += est.wait_bias + self.params.wait_margin * step_required
        if not all(math.isfinite(x) for x in (static_idle, fill, wait_f)):
            # Extreme estimates (a rate near zero): decide nothing on them.
            return Forecast(static_idle_s=0.0, hybrid_idle_s=switch, switch_s=switch, wait_samples=limit)
        wait = max(0, min(limit, math.ceil(wait_f)))
        if est.wait_cap > 0:
            wait = min(wait, math.ceil(est.wait_cap))
        return Forecast(
            static_idle_s=static_idle,
            hybrid_idle_s=switch + fill,
            switch_s=switch,
            wait_samples=wait,
            window_s=max(0, wait - q) / (g * (1.0 + rho)),
        )

    # ---- Learning -------------------------------------------------------------------------

    def learn(self, ctx: ScheduleContext) -> Estimates:
        """The estimates after the cycle ``ctx`` reports on (pure: ``self.est`` is not changed)."""
        est = self.est
        if ctx.global_steps <= 0 or ctx.last_cycle_time_s <= 0:
            return est
        w = self.params.ema_weight
        step_required = ctx.step_required_samples
        cycle_s = ctx.last_cycle_time_s
        train_s = step_required / ctx.consumption_rate if ctx.consumption_rate > 0 else ctx.last_train_time_s
        if not (0 < train_s < _MAX_SECONDS):
            # Nothing measured, or a rate too small to be a measurement. The queue is still this
            # cycle's end: the next cycle's stock is counted from it, not from one cycle earlier.
            return replace(est, queue_end=float(ctx.queue_size))
        waited = sum(ctx.step_wait_times) > 0
        # Neither waited nor below the staleness cap: production was held back by the budget.
        throttled = not waited and ctx.queue_size >= ctx.buffer_samples
        generated = ctx.generation_rate * cycle_s
        h = ctx.last_hybrid_active_s
        out = replace(
            est,
            train_s=_ema(est.train_s, train_s, w),
            sync_s=_ema(est.sync_s, ctx.last_sync_s, w) if ctx.last_sync_s > 0 else est.sync_s,
            sync_min_s=min(est.sync_min_s or math.inf, ctx.last_sync_s) if ctx.last_sync_s > 0 else est.sync_min_s,
            activate_s=ctx.last_activate_duration_s or est.activate_s,
            deactivate_s=ctx.last_deactivate_duration_s or est.deactivate_s,
        )
        idle_s = self.stock_adjusted_idle(ctx, out, max(0.0, cycle_s - train_s - ctx.last_sync_s))
        # The run's first cycle starts from an empty pipeline and says little about later ones.
        settled = ctx.global_steps > 1
        # The first cycle also trained on the samples that finished first, the short ones: per
        # second of its (short) training the production looks low (standalone_share 0.22 after it
        # against 0.4 later on seed-dynamic-64-64, wait targets 30-60 samples too high for the
        # next three cycles). The second cycle's measurement replaces it instead of averaging.
        settled_before = ctx.global_steps > 2
        if h > 0:
            if ctx.last_standalone_tokens > 0:
                # Tokens per second: the hybrids' over their routable time against the standalone
                # replicas' over the whole cycle (their counts lag by the requests still running;
                # over a whole cycle that is a small share).
                gain = (ctx.last_hybrid_tokens / h) / (ctx.last_standalone_tokens / cycle_s)
                if gain < _MAX_GAIN:  # a window of a few nanoseconds is no measurement
                    prev = out.token_gain
                    out = replace(out, token_gain=gain if prev < 0 else (1.0 - w) * prev + w * gain)
            out = replace(out, hybrid_cycles=out.hybrid_cycles + 1, last_hybrid_step=ctx.global_steps)
            if out.static_cycles == 0:
                # No cycle without hybrids yet: infer the standalone production through rho.
                share = generated / (cycle_s + self.production_gain(ctx, out) * h) * train_s / step_required
                out = _learn_share(out, share, throttled, w, replace_old=not settled_before)
            # The wait target missed by what the collections still had to wait for; a cycle
            # that never waited may have waited too long for its hybrids: lower it a little.
            drain = self.drain_samples(ctx, out)
            missing = max(ctx.step_wait_samples, default=0) + drain
            if missing:
                step = self.params.wait_increase * missing
            else:
                cut = self.params.wait_decrease if ctx.buffer_samples else self.params.wait_decrease_unbuffered
                step = -cut * step_required
            bias = out.wait_bias + step
            out = replace(out, wait_cap=self._next_wait_cap(ctx, out, step, drain))
            if settled:
                share = (idle_s + ctx.last_activate_duration_s) / train_s
                prev = out.hybrid_idle_share
                out = replace(
                    out,
                    wait_bias=max(-step_required, min(step_required, bias)),
                    hybrid_idle_share=share if prev < 0 else _ema(prev, share, w),
                )
                out = self._judge(ctx, out)
        else:
            share = generated / cycle_s * train_s / step_required
            if est.static_cycles == 0 and share > 0:
                # The first direct measurement replaces what was inferred through the prior.
                out = replace(out, standalone_share=share)
            else:
                out = _learn_share(out, share, throttled, w, replace_old=not settled_before)
            out = replace(out, static_cycles=out.static_cycles + 1)
            if settled:
                share = idle_s / train_s
                prev = out.static_idle_share
                out = replace(out, static_idle_share=share if prev < 0 else _ema(prev, share, w))
        return replace(out, queue_end=float(ctx.queue_size))

    def stock_adjusted_idle(self, ctx: ScheduleContext, est: Estimates, idle_s: float) -> float:
        """A cycle's trainer idle less the standalone production time of the samples it added to the
        queue, plus that of the samples it took from it (seconds, at least 0).

        A cycle with hybrids that ends with a fuller queue than it started with has done part of the
        next cycle's work, and the cycle without hybrids after it idles little because it uses that
        stock up: counted raw, the pair blames the hybrids for the window and credits the static
        cycle with the hybrids' samples (moe-bigswitch-32-32, seed 1: one hybrid cycle measured
        0.69 idle per training second against 0.36 without, so rho was measured 0 and the policy
        never switched again; 0.928 -> 0.918 x default over six seeds once the stock is counted).
        """
        if est.queue_end < 0 or est.standalone_share <= 0 or est.train_s <= 0:
            return idle_s
        stocked = ctx.queue_size - est.queue_end
        return max(0.0, idle_s - stocked / _standalone_rate(ctx, est))

    def drain_samples(self, ctx: ScheduleContext, est: Estimates) -> int:
        """Samples the standalone replicas would have delivered while the latest weight sync took
        longer than the shortest one (count; 0 when it took at most ``DRAIN_MIN_RATIO`` times it).

        Without partial rollout a sync first waits for the running samples to finish, and the
        trainer idles meanwhile. A longer window leaves fewer of them running at the sync (the
        staleness budget closes admission earlier), so that drain is a wait the target missed by,
        like a fit step's; counting it moved seed-no-partial-16-16 from 1.001 to 0.973 x default.
        """
        if est.sync_min_s <= 0 or est.standalone_share <= 0 or est.train_s <= 0:
            return 0
        if ctx.last_sync_s <= DRAIN_MIN_RATIO * est.sync_min_s:
            # Export and load times vary from sync to sync: that jitter is no drain, and counting
            # it would raise the target a little every cycle.
            return 0
        drain_s = ctx.last_sync_s - est.sync_min_s
        return int(drain_s * _standalone_rate(ctx, est))

    def _next_wait_cap(self, ctx: ScheduleContext, est: Estimates, step: float, drain: int) -> float:
        """``wait_cap`` after a cycle with hybrids whose correction moved by ``step`` samples and
        whose sync drained ``drain`` samples' worth."""
        if ctx.global_steps == 1:
            return float(self.second_wait_cap(ctx))
        if est.wait_cap <= 0 or drain:
            # A sync that drained running samples (no partial rollout) is paid for by every sample
            # short at the sync, however many the fit steps needed: the forecast's target, which
            # counts the drain, is the better guide from then on.
            return 0.0
        return max(1.0, est.wait_cap + step)

    def _static_reference(self, est: Estimates) -> bool:
        """Whether enough cycles without hybrids were measured to compare hybrid cycles with."""
        return est.static_idle_share >= 0 and est.static_cycles >= self.params.static_reference_cycles

    def _judge(self, ctx: ScheduleContext, est: Estimates) -> Estimates:
        """Count a hybrid cycle after which the running hybrid idle is no better than the measured
        static idle; back off after ``backoff_after`` in a row."""
        if ctx.only_hybrid or not self._static_reference(est):
            # Only measured cycles are evidence against switching: a forecast that disagrees
            # with a measured hybrid cycle is more likely wrong than the measurement.
            return est
        if est.hybrid_idle_share < est.static_idle_share:
            return replace(est, losses=0)
        losses = est.losses + 1
        if losses < self.params.backoff_after:
            return replace(est, losses=losses)
        p = self.params
        backoff = p.probe_interval_min if est.backoff == 0 else min(p.probe_interval_max, 2 * est.backoff)
        return replace(est, losses=0, backoff=backoff, suppress_until=ctx.global_steps + backoff)

    # ---- State ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Every estimate and counter (JSON numbers)."""
        return asdict(self.est)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; reject missing, unknown or non-finite values.

        A state saved by an earlier dynres (a checkpoint from before an upgrade) loads too: its
        retired entries are dropped and the entries it lacks start unmeasured.
        """
        names = {f.name: f for f in fields(Estimates)}
        if set(state) - set(names) <= _RETIRED_STATE and set(names) - set(state) <= _ADDED_STATE:
            defaults = asdict(Estimates())
            state = {name: state[name] if name in state else defaults[name] for name in names}
        if set(state) != set(names):
            raise PolicyValidationError(
                f"policy 'predictive': state keys {sorted(state)} do not match {sorted(names)}; "
                "pass what state_dict() returned"
            )
        values: dict[str, Any] = {}
        for name, f in names.items():
            raw = state[name]
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
                raise PolicyValidationError(
                    f"policy 'predictive': state {name}={raw!r} must be a finite number; pass what "
                    "state_dict() returned"
                )
            if f.type == "int" and raw != int(raw):
                raise PolicyValidationError(f"policy 'predictive': state {name}={raw!r} must be a whole number")
            floor = -1.0 if f.default == -1.0 else (-math.inf if name == "wait_bias" else 0.0)
            if raw < floor:
                raise PolicyValidationError(f"policy 'predictive': state {name}={raw!r} must be >= {floor:g}")
            values[name] = int(raw) if f.type == "int" else float(raw)
        self.est = Estimates(**values)


DRAIN_MIN_RATIO = 1.5
"""A weight sync counts as draining running samples only above this many times the shortest (ratio;
once the shortest has itself drained some samples, one that drained many more is often under 2x)."""

_RETIRED_STATE = frozenset({"collect_share", "window_share"})
"""State entries earlier versions saved that this one no longer keeps (dropped on load)."""

_ADDED_STATE = frozenset({"sync_min_s", "queue_end", "wait_cap"})
"""State entries this version added (unmeasured when a state from before them is loaded)."""

_MAX_SECONDS = 1e9
"""Durations beyond this (about 30 years) are not measurements (seconds)."""

_MAX_GAIN = 1e6
"""Hybrid over standalone token rates beyond this are not measurements (ratio)."""


def _standalone_rate(ctx: ScheduleContext, est: Estimates) -> float:
    """Samples per second the standalone replicas deliver, from the learned share (samples/s;
    needs ``est.train_s > 0``)."""
    return est.standalone_share * ctx.step_required_samples / est.train_s


def _replica_ratio(ctx: ScheduleContext) -> float:
    # The prior rho: a hybrid replica as productive as a standalone one.
    return ctx.num_hybrid_replicas / max(1, ctx.num_standalone_replicas)


def _ema(old: float, new: float, weight: float) -> float:
    return new if old <= 0 else (1.0 - weight) * old + weight * new


def _learn_share(
    est: Estimates, share: float, throttled: bool, weight: float, *, replace_old: bool = False
) -> Estimates:
    # A throttled cycle's production is only a floor on what the replicas can do.
    if share <= 0 or (throttled and share <= est.standalone_share):
        return est
    return replace(est, standalone_share=share if replace_old else _ema(est.standalone_share, share, weight))
