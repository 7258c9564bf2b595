"""A scenario fitted from a run's own per-cycle metrics (``dynres scenario fit``), and predictions
per policy on it (``dynres scenario compare``).

:func:`fit_scenario` turns a :class:`~dynres.runtime.sim.metrics_io.RunMetrics` (``dynres run``'s
``metrics.jsonl`` or verl's file-logger JSONL) into a scenario for the simulator, and records for
every key where its number came from and how well the run determines it (cycles used, spread),
or which metric was missing and which default stands in. :meth:`FitResult.to_yaml` writes that as
a commented scenario file ``dynres simulate`` loads.

The modules: :mod:`.fitter` walks the scenario's sections once for both formats; :mod:`.formats`
holds one adapter per metrics format (the metric names, the facts it has, its notes);
:mod:`.provenance` the scenario whose every value carries its note, and the commented YAML;
:mod:`.replicas` the replica speed, hybrid factor and shared host; :mod:`.costs` the switch
costs; :mod:`.stats` the statistics; :mod:`.compare` the predictions.

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
  switch calibration's idle switch, ``switch_calibration``) and each cycle's weight sync;
* the run config (batch, staleness, partial rollout, policy, cluster split) from the run's
  config (dynres ``config.json`` or ``--config``), else derived from the records where they tell;
* ``cluster.shared_host`` from the config's engines and device (vLLM / torch on CPU slots of one
  machine share its cores), or from a hybrid factor solved ``<= 0`` from ``--costs-from``.

Time before the first cycle (engine warm-up, first compilation) is not part of a scenario; the
fit reports it as :attr:`FitResult.first_cycle_start_s` and ``dynres scenario compare`` adds the
part the simulator does not model to every prediction.
"""

from __future__ import annotations

from dynres.runtime.sim.fit.compare import Comparison, Prediction, check_policies, predict
from dynres.runtime.sim.fit.fitter import FitResult, config_from_file, fit_scenario
from dynres.runtime.sim.fit.stats import MIN_CYCLES
from dynres.runtime.sim.metrics_io import DYNRES, VERL

__all__ = [
    "DYNRES",
    "MIN_CYCLES",
    "VERL",
    "Comparison",
    "FitResult",
    "Prediction",
    "check_policies",
    "config_from_file",
    "fit_scenario",
    "predict",
]
