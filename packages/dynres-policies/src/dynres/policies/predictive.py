"""`predictive`: lend the trainer's GPUs only when a forecast of the next cycle says it pays.

The numbers it learns and forecasts (:class:`Estimates`, :class:`Forecast`) live in
``dynres.policies.predictive_estimates``; the figures behind its defaults and rules, with the
commands that measured them, in docs/builtin-policies.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from dynres.core import Policy, ScheduleContext
from dynres.policies.predictive_estimates import (
    DRAIN_MIN_RATIO,
    MAX_GAIN,
    MAX_SECONDS,
    MIN_SHARE,
    MIN_TRAIN_SECONDS,
    Estimates,
    Forecast,
    drain_samples,
    ema,
    first_production,
    learn_share,
    replica_ratio,
    standalone_rate,
    stock_adjusted_idle,
    throttled,
)
from dynres.policies.renamed_params import move_renamed_params

__all__ = ["DRAIN_MIN_RATIO", "RENAMED_PARAMS", "Estimates", "Forecast", "PredictivePolicy"]

RENAMED_PARAMS: dict[str, str] = {
    "probe_interval_min": "backoff_min_cycles",
    "probe_interval_max": "backoff_max_cycles",
}
"""Deprecated param name -> its current name; the old name still loads, with a FutureWarning."""


class PredictivePolicy(Policy):
    """Forecast the next cycle's trainer idle and lend the GPUs only when the saving beats the switch.

    **Model** of a sync cycle: ``n`` fit steps of ``t`` s, ``k`` samples each, ``q`` samples queued
    at its start, standalone production ``g`` samples/s, hybrids adding ``rho x g`` while active,
    activation ``a`` and deactivation ``d`` s. Without hybrids the trainer idles ``X = max(0,
    max_i ((i + 1) k - q) / g - i t)``; hybrids active for the least time that removes every wait,
    ``(X - a - d) / (1 + rho)``, save ``(X - a - d) rho / (1 + rho)``.

    **Decisions**; each exception is a case where the forecast is wrong or cannot pay:

    * activate when that saving exceeds ``switch_cost_margin`` switch costs;
    * always in an only-hybrid cluster (nothing else generates); never after the final sync, nor
      before the final cycle unless the wait target exceeds the queue plus ``in_flight_credit`` of
      the samples in flight (no later cycle uses what a window leaves queued);
    * never when the queue already holds the wait target (the next cycle would deactivate at
      once), during a back-off, or while ``calibrate_static`` wants a cycle without hybrids: where
      the saving is small, or without a buffer (staleness 0), where token rates overstate it, and
      until such cycles confirm the hybrids' saving or form a reference;
    * before anything is measured, per ``activate_at_start`` (the first switch is unmeasured);
      after a first cycle with hybrids, on its measured waits instead of ``X`` (it trained on the
      short samples first, so a forecast from it overstates the idle);
    * wait target: what lets the standalone production alone feed every fit step after the
      deactivation, plus the learned ``wait_bias``, at most ``wait_cap`` (a target forecast from
      the first cycle runs high);
    * deactivate whenever hybrids are active.

    **Estimates**: running averages (``ema_weight``) relative to a cycle's training time, so that
    they hold while responses grow. ``X`` is at least the idle measured without hybrids (the model
    misses the pipeline's restart after a sync), and that idle alone once ``static_reference_cycles``
    such cycles ran; ``a + d`` before any switch was measured is ``switch_cost_fallback_s`` plus a
    weight sync. Idle is counted at equal stock (a cycle that fills the queue did part of the next
    one's work). ``rho`` starts at the replica-count ratio and is then measured: token rates bound
    what hybrids add, idle with and without them what they realise (with a buffer, after more than
    ``backoff_after`` hybrid cycles). Engines that count no tokens (inside verl, both token fields
    read 0) leave only the idle comparison: ``rho`` stays the prior until cycles without hybrids ran.
    ``wait_bias`` rises by ``wait_increase`` x the most samples a fit step still waited for (a sync
    that drained running samples counts) and falls by ``wait_decrease`` after a cycle that never
    waited, by ``k x`` that after the ``k``-th in a row before the run's first miss. Where hybrid
    cycles idled less than cycles without them, a cycle without hybrids whose fit steps waited
    while the target was at most the queue raises the target to the queue it started with plus the
    most samples one of its fit steps waited for.

    **Back-off**: after ``backoff_after`` hybrid cycles in a row that idled no less than the
    reference of ``static_reference_cycles`` cycles without hybrids, no activation for
    ``backoff_min_cycles``, then one trial cycle; each failed trial doubles the pause, up to
    ``backoff_max_cycles``.
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
            10.0,
            ge=0.0,
            description="Activation + deactivation cost assumed before any was measured, on top of the "
            "weight sync an activation includes (seconds).",
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
            description="Cut of the wait target after a hybrid cycle whose fit steps never waited; before the "
            "run's first miss the k-th such cycle in a row cuts k times this (fraction of a cycle's samples).",
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
        backoff_min_cycles: int = Field(
            4,
            ge=1,
            description="Cycles without activation after a first back-off (cycles; formerly probe_interval_min, "
            "which still loads with a warning).",
        )
        backoff_max_cycles: int = Field(
            32,
            ge=1,
            description="Longest back-off: each failed trial cycle doubles the pause up to this; also the age "
            "after which a measurement of the hybrids is refreshed by one trial cycle (cycles; formerly "
            "probe_interval_max, which still loads with a warning).",
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
            "switch costs (a clearer saving is not worth a cycle of waiting to confirm), except without a "
            "buffer, where token rates overstate it; stop once a cycle without hybrids idled this many switch "
            "costs longer than the hybrid cycles (switch costs).",
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
            "starts with the hybrids' partly generated work in flight and idles least, so alone it makes "
            "hybrids look useless (count).",
        )
        min_hybrid_gain: float = Field(
            0.3,
            ge=0.0,
            description="Count the hybrid replicas as adding nothing when their measured token rate is below "
            "this fraction of the standalone replicas' (token_gain): the model's saving rho / (1 + rho) of the "
            "idle leaves out what slow hybrids cost besides the switch (work they hold, resumed elsewhere), "
            "so a small measured gain is no saving (ratio).",
        )
        rebalance: bool = Field(True, description="Move in-flight work onto freshly activated replicas.")
        abandon_queued_activation: bool = Field(
            True,
            description="Give up an activation once the queue holds what the deactivation after it would wait "
            "for (the dynres runtime asks; verl does not).",
        )
        extra_admission: float = Field(
            0.0,
            ge=0.0,
            le=1.0,
            description="Samples each weight version admits beyond a staleness budget of less than a cycle's run-"
            "ahead, of none without partial rollout (admit_extra_samples), trained up to a cycle staler than "
            "staleness_threshold allows: off unless the user accepts that (fraction of a cycle's samples).",
        )

        @model_validator(mode="before")
        @classmethod
        def _renamed_params(cls, data: Any) -> Any:
            return move_renamed_params(data, RENAMED_PARAMS, "predictive")

        @model_validator(mode="after")
        def _check_bounds(self) -> PredictivePolicy.Params:
            if self.backoff_min_cycles > self.backoff_max_cycles:
                raise ValueError("backoff_min_cycles must be <= backoff_max_cycles")
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

    def should_abandon_activation(self, ctx: ScheduleContext) -> bool:
        """Give up an activation whose batch is queued when the deactivation that follows it would
        wait for no more (``abandon_queued_activation``): the hybrids would go back before adding
        anything the cycle needs, and the trainer would wait for both switches."""
        # Only the start activation, the one decided on nothing measured. A later one was decided
        # on a forecast that its window pays, and a window given up reads to learn() as a cycle
        # without hybrids: with every activation open to it, seed-no-partial-16-16 ran 1.2% longer.
        if not self.params.abandon_queued_activation or ctx.only_hybrid or ctx.global_steps > 0:
            return False
        return ctx.queue_size >= self.deactivate_wait_samples(ctx)

    def should_rebalance(self, ctx: ScheduleContext) -> bool:
        """Move work onto freshly activated replicas (``rebalance`` param)."""
        return self.params.rebalance

    def admit_extra_samples(self, ctx: ScheduleContext) -> int:
        """``extra_admission`` of a cycle's samples beyond the staleness budget (0 unless set)."""
        # Run-ahead (a cycle; without partial rollout, any, as each sync waits for the running
        # extra samples) already keeps the replicas busy beside the tail. With no standalone
        # replica, the deactivation before training cuts what starts beside it.
        if ctx.buffer_samples >= (ctx.step_required_samples if ctx.partial_rollout else 1) or ctx.only_hybrid:
            return 0
        return int(self.params.extra_admission * ctx.step_required_samples)

    def update_after_step(self, ctx: ScheduleContext) -> None:
        """Learn rates, costs and the realised saving from the finished cycle."""
        self.est = self.learn(ctx)

    def _decide(self, ctx: ScheduleContext, est: Estimates) -> bool:
        if ctx.num_hybrid_replicas == 0:
            return False
        if ctx.shared_host:
            # One host's compute: a woken hybrid divides the standalone replicas' throughput and
            # adds none, so a window costs its switches and gains nothing (an only-hybrid cluster,
            # where the hybrids are the only producers, was answered before this).
            return False
        remaining = ctx.total_steps - ctx.global_steps if ctx.total_steps else -1
        if remaining == 0:
            return False  # the final sync leaves nothing to generate for
        fc = self.forecast(ctx, est)
        if remaining == 1 and fc.wait_samples <= ctx.queue_size + self.params.in_flight_credit * ctx.in_flight_samples:
            # The final cycle: no later cycle gains from what a window leaves queued, so a window
            # is worth it only if the fit steps need more than what is queued or nearly done.
            return False
        if ctx.global_steps == 0 or est.train_s <= 0:
            # Nothing measured: the trainer waits for its first batch anyway, and the hybrids
            # remove a rho / (1 + rho) share of that wait; a small prior share does not repay a
            # switch that is unmeasured and may be slow (cold engines).
            return self.params.activate_at_start and replica_ratio(ctx) >= self.params.activate_at_start_min_gain
        if ctx.global_steps < est.suppress_until:
            return False
        p = self.params
        if ctx.global_steps == 1 and ctx.last_hybrid_active_s > 0 and ctx.queue_size >= ctx.required_samples:
            # The first cycle trained on the samples that finished first, the short ones: its
            # training time understates later cycles', so a forecast from it overstates the next
            # idle. When that cycle ended with a collection queued, decide on what it measured
            # instead: its fit steps' waits after the hybrid replicas left, taken as the static
            # idle X of the model's saving (the test below, X measured). The wait target still
            # comes from the forecast, and the window it makes the hybrids hold is paid even where
            # the measured waits are short.
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
            return True  # the back-off is over: one trial cycle, whose realised idle decides again
        stale = ctx.global_steps - est.last_hybrid_step >= p.backoff_max_cycles
        if stale and est.hybrid_cycles and fc.static_idle_s > fc.switch_s:
            return True  # what hybrids add was measured long ago: one trial cycle
        if (
            p.calibrate_static
            and not self._static_reference(est)
            and not self._hybrids_confirmed(est)
            and (remaining < 0 or remaining >= p.calibrate_min_steps)
            and (ctx.queue_size >= ctx.buffer_samples or 0 < p.calibrate_by <= ctx.global_steps)
            and (fc.saving_s <= p.calibrate_max_saving * fc.switch_s or self._token_gain_in_doubt(ctx, est))
        ):
            # The saving rests on the replica-count prior and is too small to be sure of, or on
            # token rates that overstate it: measure a cycle without hybrids, one that starts with a
            # full queue (it loses the least).
            return False
        return fc.saving_s > p.switch_cost_margin * fc.switch_s

    # ---- Forecast -------------------------------------------------------------------------

    def switch_cost(self, est: Estimates) -> float:
        """Measured activation + deactivation seconds; before any was measured, the fallback plus a
        weight sync (an activation loads the weights the trainer just published into the hybrids)."""
        if est.activate_s <= 0 and est.deactivate_s <= 0:
            return self.params.switch_cost_fallback_s + est.sync_s
        return est.activate_s + est.deactivate_s

    def measured_gain(self, est: Estimates, buffered: bool = True) -> float:
        """rho measured from cycles with and without hybrids, or infinity before hybrid cycles and the
        static reference (``static_reference_cycles``) ran; with a buffer (``buffered``), also until
        more than ``backoff_after`` hybrid cycles ran or a back-off started (ratio; docs, M23)."""
        if not self._static_reference(est) or est.hybrid_idle_share < 0 or est.train_s <= 0:
            return math.inf
        if buffered and est.backoff == 0 and est.hybrid_cycles <= self.params.backoff_after:
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
            return min(tokens, self.measured_gain(est, ctx.buffer_samples > 0))
        return self.production_gain(ctx, est)

    def production_gain(self, ctx: ScheduleContext, est: Estimates) -> float:
        """rho from cycle-level measurements, what the standalone production is inferred with (ratio).

        Measured when both kinds of cycle have run: the model's saving ``(X - a - d) rho / (1 +
        rho)`` set equal to the realised one, ``X`` being the measured static idle. Before that,
        the replica-count prior (a hybrid replica as productive as a standalone one).
        """
        measured = self.measured_gain(est, ctx.buffer_samples > 0)
        if math.isfinite(measured):
            return measured
        return replica_ratio(ctx)

    def initial_wait_ratio(self, ctx: ScheduleContext) -> float:
        """Wait target before anything is measured (fraction of a cycle's samples).

        ``initial_wait_ratio`` is meant for as many hybrid (trainer) as standalone replicas. With
        ``rho > 1`` times as many, the standalone replicas are ``rho`` times fewer next to the same
        trainer, so they deliver about ``1 / rho`` as much while it trains: the share of the cycle
        left to them, ``1 - initial_wait_ratio``, shrinks to ``(1 - initial_wait_ratio) / rho``.
        Never below ``initial_wait_ratio``.
        """
        ratio = self.params.initial_wait_ratio
        rho = replica_ratio(ctx)
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
        high: a window whose fit steps never wait.
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
        g = standalone_rate(ctx, est)
        static_idle = max(0.0, *(((i + 1) * k - q) / g - i * t for i in range(n)))
        if self._static_reference(est):
            # Measured beats modelled: the model also errs the other way (with staleness 0 it
            # counts a cycle's samples as made after the sync, which the standalone replicas
            # partly make during it), and a reference is what the back-off judges hybrids by.
            static_idle = est.static_idle_share * est.train_s
        elif est.static_idle_share > 0:
            # The constant-rate model misses the pipeline's restart after each sync (all of it
            # without partial rollout): cycles without hybrids that idled longer are the better guide.
            static_idle = max(static_idle, est.static_idle_share * est.train_s)
        rho = self.hybrid_gain(ctx, est)
        fill = max(0.0, static_idle - switch) / (1.0 + rho)
        # What the standalone replicas alone deliver after the deactivation: a target that counts on
        # the hybrids' resumed work as well ends windows early when they did little, and the fit
        # steps then wait after all.
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
        if ctx.consumption_rate > 0:
            train_s = ctx.step_required_samples / ctx.consumption_rate
        else:
            train_s = ctx.last_train_time_s
        if not (MIN_TRAIN_SECONDS <= train_s < MAX_SECONDS):
            # Nothing measured, or a rate too small to be a measurement. The queue is still this
            # cycle's end: the next cycle's stock is counted from it, not from one cycle earlier.
            return replace(est, queue_end=float(ctx.queue_size))
        out = replace(
            est,
            train_s=ema(est.train_s, train_s, w),
            sync_s=ema(est.sync_s, ctx.last_sync_s, w) if ctx.last_sync_s > 0 else est.sync_s,
            sync_min_s=min(est.sync_min_s or math.inf, ctx.last_sync_s) if ctx.last_sync_s > 0 else est.sync_min_s,
            activate_s=ctx.last_activate_duration_s or est.activate_s,
            deactivate_s=ctx.last_deactivate_duration_s or est.deactivate_s,
        )
        idle_s = self.stock_adjusted_idle(ctx, out, max(0.0, ctx.last_cycle_time_s - train_s - ctx.last_sync_s))
        if ctx.last_hybrid_active_s > 0:
            out = self._learn_hybrid_cycle(ctx, out, train_s, idle_s)
        else:
            out = self._learn_static_cycle(ctx, out, train_s, idle_s)
        return replace(out, queue_end=float(ctx.queue_size))

    def _learn_hybrid_cycle(self, ctx: ScheduleContext, est: Estimates, train_s: float, idle_s: float) -> Estimates:
        """``est`` after a cycle that ran with hybrid replicas: what they generated, by how much the
        wait target missed, and the realised idle (seconds of training ``train_s``, idle ``idle_s``)."""
        w = self.params.ema_weight
        step_required = ctx.step_required_samples
        cycle_s, h = ctx.last_cycle_time_s, ctx.last_hybrid_active_s
        out = est
        if ctx.last_standalone_tokens > 0:
            # Tokens per second: the hybrids' over their routable time against the standalone
            # replicas' over the whole cycle (their counts lag by the requests still running;
            # over a whole cycle that is a small share).
            gain = (ctx.last_hybrid_tokens / h) / (ctx.last_standalone_tokens / cycle_s)
            if gain < MAX_GAIN:  # a window of a few nanoseconds is no measurement
                prev = out.token_gain
                out = replace(out, token_gain=gain if prev < 0 else (1.0 - w) * prev + w * gain)
        out = replace(out, hybrid_cycles=out.hybrid_cycles + 1, last_hybrid_step=ctx.global_steps)
        if out.static_cycles == 0:
            # No cycle without hybrids yet: infer the standalone production through rho.
            generated = ctx.generation_rate * cycle_s
            share = generated / (cycle_s + self.production_gain(ctx, out) * h) * train_s / step_required
            out = learn_share(out, share, throttled(ctx), w, replace_old=first_production(ctx))
        # The wait target missed by what the collections still had to wait for; a cycle
        # that never waited may have waited too long for its hybrids: lower it a little.
        drain = self.drain_samples(ctx, out)
        missing = max(ctx.step_wait_samples, default=0) + drain
        calm = 0 if missing else out.calm_cycles + 1
        if missing:
            step = self.params.wait_increase * missing
        else:
            # Until the first miss the k-th calm cycle in a row cuts k times as much: a target
            # forecast far too high (from the first cycles' short training) comes down in a few
            # cycles instead of a run's worth. After it the target is near the need, where a cut
            # that grows would overshoot into waits, which cost 1 + rho times more per sample.
            cut = self.params.wait_decrease if ctx.buffer_samples else self.params.wait_decrease_unbuffered
            step = -cut * step_required * (calm if out.misses == 0 else 1)
        bias = out.wait_bias + step
        cap = self._next_wait_cap(ctx, out, step, drain)
        out = replace(out, wait_cap=cap, calm_cycles=calm, misses=out.misses + (1 if missing else 0))
        if ctx.global_steps > 1:  # the run's first cycle starts from an empty pipeline
            # The learned activation time, not the context's: inside verl the context's value at
            # update_after_step is the activation that opens the next window (verl counts switch
            # times per cycle); in the dynres runtime both are the window's own activation.
            share = (idle_s + out.activate_s) / train_s
            prev = out.hybrid_idle_share
            # Float bounds: min/max return the bound itself, and an int bound would make the
            # field an int, which a checkpoint saves as such and loads back as a float.
            bound = float(step_required)
            out = replace(
                out,
                wait_bias=max(-bound, min(bound, bias)),
                hybrid_idle_share=share if prev < 0 else ema(prev, share, w),
            )
            out = self._judge(ctx, out)
        return out

    def _learn_static_cycle(self, ctx: ScheduleContext, est: Estimates, train_s: float, idle_s: float) -> Estimates:
        """``est`` after a cycle without hybrid replicas: the standalone production and the idle of
        the static reference (seconds of training ``train_s``, idle ``idle_s``)."""
        w = self.params.ema_weight
        generated = ctx.generation_rate * ctx.last_cycle_time_s
        share = generated / ctx.last_cycle_time_s * train_s / ctx.step_required_samples
        held_back = throttled(ctx)
        if held_back and est.standalone_share <= 0:
            # The staleness budget held production back, so the share is only a floor; taken as the
            # first estimate it forecasts the idle of a pipeline that is in fact full.
            out = est
        elif est.static_cycles == 0 and share >= MIN_SHARE and not held_back:
            # The first direct measurement replaces what was inferred through the prior.
            out = replace(est, standalone_share=share)
        else:
            out = learn_share(est, share, held_back, w, replace_old=first_production(ctx))
        out = replace(out, static_cycles=out.static_cycles + 1)
        if ctx.global_steps > 1:  # the run's first cycle starts from an empty pipeline
            share = idle_s / train_s
            prev = out.static_idle_share
            out = replace(out, static_idle_share=share if prev < 0 else ema(prev, share, w))
        return self._lift_wait_target(ctx, out)

    def _lift_wait_target(self, ctx: ScheduleContext, est: Estimates) -> Estimates:
        """``est`` with the wait target raised to what a cycle without hybrids showed it must reach:
        the queue it started with plus the most samples one of its fit steps waited for.

        Hybrid cycles that never waited cut the target, and once it falls to the queue the policy
        no longer activates, so no hybrid cycle raises it again, while the cycles without hybrids
        wait: the target stays too low for the rest of the run.
        """
        short = max(ctx.step_wait_samples, default=0)
        if not short or est.queue_end < 0 or est.train_s <= 0 or est.standalone_share <= 0:
            return est
        if est.hybrid_idle_share < 0 or est.hybrid_idle_share >= est.static_idle_share:
            # Hybrid cycles were not measured to idle less: then a target the queue holds, which
            # keeps the policy from activating, may be the right answer.
            return est
        need = est.queue_end + short
        wait = self.forecast(ctx, est).wait_samples
        if wait > ctx.queue_size or wait >= need or wait >= ctx.step_required_samples + ctx.buffer_samples:
            # A target above the queue still lets the policy activate, and the hybrid cycles
            # correct it by what their own fit steps miss.
            return est
        bias = min(float(ctx.step_required_samples), est.wait_bias + need - wait)
        return replace(est, wait_bias=bias, wait_cap=max(est.wait_cap, need) if est.wait_cap > 0 else 0.0)

    def stock_adjusted_idle(self, ctx: ScheduleContext, est: Estimates, idle_s: float) -> float:
        """:func:`~dynres.policies.predictive_estimates.stock_adjusted_idle` (seconds; a method so
        that a subclass can change the rule)."""
        return stock_adjusted_idle(ctx, est, idle_s)

    def drain_samples(self, ctx: ScheduleContext, est: Estimates) -> int:
        """:func:`~dynres.policies.predictive_estimates.drain_samples` (count; a method so that a
        subclass can change the rule)."""
        return drain_samples(ctx, est)

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

    def _token_gain_in_doubt(self, ctx: ScheduleContext, est: Estimates) -> bool:
        """Whether a saving, however clear, must be checked by cycles without hybrids: without a
        buffer (staleness 0) once ``backoff_after`` hybrid cycles ran.

        Without a buffer the standalone replicas have no admissible work while a cycle's last
        responses finish, its last fit step trains and its weights sync, so their tokens per
        second of the cycle understate their rate: ``token_gain`` overstates ``rho``, the standalone
        production inferred through it comes out low and the forecast idle high, and the realised
        hybrid cycles agree with that forecast (it was inferred from them). Only a cycle without
        hybrids shows the idle they would have had. Engines that count no tokens leave the
        replica-count prior, which such a cycle checks as well.
        """
        return ctx.buffer_samples == 0 and est.hybrid_cycles >= self.params.backoff_after

    def _hybrids_confirmed(self, est: Estimates) -> bool:
        """Whether the cycles without hybrids run so far already show the hybrid cycles' saving to
        exceed ``calibrate_max_saving`` switch costs, so that no further one is worth running.

        The first such cycle after hybrid ones idles least (it starts with their work in flight),
        so a full reference would only show a larger saving; the other way round it is no
        evidence (:meth:`_static_reference`).
        """
        if est.static_cycles < 1 or est.hybrid_idle_share < 0 or est.static_idle_share < 0:
            return False
        saving = (est.static_idle_share - est.hybrid_idle_share) * est.train_s
        return saving > self.params.calibrate_max_saving * self.switch_cost(est)

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
        backoff = p.backoff_min_cycles if est.backoff == 0 else min(p.backoff_max_cycles, 2 * est.backoff)
        return replace(est, losses=0, backoff=backoff, suppress_until=ctx.global_steps + backoff)

    # ---- State ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Every estimate and counter (JSON numbers; see :class:`Estimates`)."""
        return self.est.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (:meth:`Estimates.from_state`: a state saved by an
        earlier dynres loads too); reject missing, unknown or non-finite values."""
        self.est = Estimates.from_state(state)
