"""The simulator's workload model: response lengths, replica speed, trainer speed.

Every formula the simulator uses lives here as a small pure function, so that tests and
``docs/simulator.md`` can check each one by hand. Symbols: ``m`` median length, ``sigma`` the
log-length standard deviation, ``rho`` the group correlation, ``g`` growth per step, ``P`` prompt
tokens, ``c`` requests running on a replica, ``peak`` its saturated throughput, ``f`` the lone
request fraction.

1. **Response lengths** of sample ``i`` (a prompt group of ``n`` responses), nominal step
   ``k = i // step_required_samples``::

       m_k      = m * (1 + g) ** k
       log L_ij = log m_k + sigma * (sqrt(rho) * Z_i + sqrt(1 - rho) * Z_ij),  Z ~ N(0, 1) iid
       L_ij     = min(max_tokens, max(1, round(exp(log L_ij))))

   so each length is lognormal(m_k, sigma) before the cap and two responses of one group share
   ``rho`` of their log-variance. Lengths depend only on (seed, i): every policy gets the same work.
   With a prompt pool of ``P`` prompts (``response.prompt_pool``), sample ``i`` asks prompt
   ``i mod P`` and ``Z_i`` is that prompt's, drawn once per run: a prompt keeps its length scale
   in every epoch, as a dataset does.
2. **Decode speed**: the ``c`` requests on a replica share its throughput equally::

       tput(c)   = peak * c / (c + c_half)        aggregate tokens/s, saturating at peak
       rate(c)   = tput(c) / c = peak / (c + c_half)   per request
       c_half    = (1 - f) / f                    so that tput(1) = f * peak

   On a **shared host** (``cluster.shared_host``, a CPU-only machine where every engine runs on
   the same cores) the replicas generating at a moment divide the host's capacity ``C``, the
   standalone replicas' combined peak (the hybrid replicas' when there are no standalone ones)::

       C         = S * peak                       (H * peak * phi when S = 0)
       scale     = min(1, C / sum of peak_i over the replicas with requests running, not paused)
       rate_i(c) = peak_i * scale / (c + c_half)

   so a replica alone never runs faster than its own peak, and a woken hybrid replica only takes
   a share of what the standalone ones had: it adds no throughput.
3. **Prefill** costs replica work like decoding ``prefill_cost`` tokens per prompt token; a
   request resumed after an abort (partial rollout) re-prefills its prompt *and* the tokens it
   had generated::

       work = prefill_cost * (P + prefix) + (L - prefix)      decode-token equivalents

4. **Training** one fit step on ``G`` trainer GPUs with ``T`` tokens (prompts + responses)::

       train_s = step_s * ((1 - a) + a * T / T_0) * (G_ref / G) ** e * (s_off if G < G_off else 1)

   with ``a`` the token fraction, ``e`` the scaling exponent, ``T_0`` the tokens of a step-0
   batch of mean length (``required_samples * n * (P + E[min(L, max_tokens)])``), and
   ``s_off`` the slowdown of offloading the optimizer to CPU when fewer than ``G_off`` GPUs
   cannot hold the training state.
5. **Weight sync, switches**: fixed durations from the scenario's ``costs`` section, paid by the
   replica or trainer operation the runtime calls (``update_weights``, ``sleep``, ``wake_up``,
   ``abort``, ``offload``, ``onload``, ``export_weights``).
"""

from __future__ import annotations

import math

import numpy as np

from dynres.runtime.sim.scenario import DecodeConfig, ResponseLengthConfig, Scenario, TrainConfig

# ---- 1. Response lengths ---------------------------------------------------------------------


def median_at_step(median_tokens: float, growth_per_step: float, step: int) -> float:
    """Median response length at nominal step ``step``: m * (1 + g) ** step (tokens)."""
    return median_tokens * (1.0 + growth_per_step) ** step


def _norm_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def capped_lognormal_mean(median: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for X ~ lognormal(median, sigma) (tokens).

    E = m e^(s^2/2) Phi((ln(cap/m) - s^2)/s) + cap (1 - Phi(ln(cap/m)/s)); m when sigma is 0.
    """
    if sigma <= 0:
        return min(median, cap)
    z = math.log(cap / median) / sigma
    return median * math.exp(sigma * sigma / 2) * _norm_cdf(z - sigma) + cap * (1.0 - _norm_cdf(z))


def lengths_from_normals(
    log_median: np.ndarray, z_group: np.ndarray, z_resp: np.ndarray, cfg: ResponseLengthConfig
) -> np.ndarray:
    """Lengths (samples x n) from log-medians (samples), group normals (samples) and own normals."""
    rho = cfg.group_correlation
    log_len = log_median[:, None] + cfg.sigma * (math.sqrt(rho) * z_group[:, None] + math.sqrt(1.0 - rho) * z_resp)
    # Clip in log space first: exp() of a huge tail draw must not overflow before the cap.
    log_len = np.minimum(log_len, math.log(cfg.max_tokens) + 1.0)
    return np.clip(np.rint(np.exp(log_len)), 1, cfg.max_tokens).astype(np.int64)


class LengthOracle:
    """Response lengths of every sample of a run, a pure function of (seed, sample index).

    Lengths are drawn in blocks of :attr:`BLOCK` samples from ``numpy.random.default_rng([seed,
    block])`` so that any sample can be asked for in any order with the same answer.
    """

    BLOCK = 512
    """Samples drawn per RNG block (count)."""

    def __init__(self, cfg: ResponseLengthConfig, *, n: int, step_required_samples: int, seed: int) -> None:
        """Lengths for ``n`` responses per sample; step = index // step_required_samples."""
        self.cfg = cfg
        self.n = n
        self.step_required_samples = step_required_samples
        self.seed = seed
        self._blocks: dict[int, list[tuple[int, ...]]] = {}
        self._prompt_z: np.ndarray | None = None

    def _block(self, b: int) -> list[tuple[int, ...]]:
        rng = np.random.default_rng([self.seed, b])
        z_group = rng.standard_normal(self.BLOCK)
        z_resp = rng.standard_normal((self.BLOCK, self.n))
        idx = np.arange(b * self.BLOCK, (b + 1) * self.BLOCK)
        pool = self.cfg.prompt_pool
        if pool:
            # The group-common draw belongs to the prompt, not the sample. It comes from a stream of
            # its own, so the per-response draws stay those of the same run without a pool.
            z_group = self._prompt_normals()[idx % pool]
        steps = idx // self.step_required_samples
        log_median = math.log(self.cfg.median_tokens) + steps * math.log1p(self.cfg.growth_per_step)
        arr = lengths_from_normals(log_median, z_group, z_resp, self.cfg)
        return [tuple(int(v) for v in row) for row in arr]

    def _prompt_normals(self) -> np.ndarray:
        if self._prompt_z is None:
            self._prompt_z = np.random.default_rng([self.seed, 1 << 32]).standard_normal(self.cfg.prompt_pool)
        return self._prompt_z

    def prompt_id(self, index: int) -> str | None:
        """The prompt sample ``index`` asks (``p<i mod prompt_pool>``), None without a pool."""
        pool = self.cfg.prompt_pool
        return f"p{index % pool}" if pool else None

    def sample(self, index: int) -> tuple[int, ...]:
        """The ``n`` response lengths of sample ``index`` (tokens each)."""
        if index < 0:
            raise ValueError(f"sample index must be >= 0, got {index}")
        b, off = divmod(index, self.BLOCK)
        block = self._blocks.get(b)
        if block is None:
            block = self._blocks[b] = self._block(b)
        return block[off]

    def response(self, index: int, j: int) -> int:
        """Length of response ``j`` of sample ``index`` (tokens)."""
        return self.sample(index)[j % self.n]


# ---- 2. Decode speed -------------------------------------------------------------------------


def aggregate_throughput(c: float, peak: float, c_half: float) -> float:
    """tput(c) = peak * c / (c + c_half): tokens/s of a replica running ``c`` requests."""
    if c <= 0:
        return 0.0
    return peak * c / (c + c_half)


def per_request_rate(c: float, peak: float, c_half: float) -> float:
    """rate(c) = peak / (c + c_half): tokens/s each of ``c`` concurrent requests decodes at."""
    if c <= 0:
        return 0.0
    return peak / (c + c_half)


def replica_peak(cfg: DecodeConfig, hybrid: bool) -> float:
    """Saturated throughput of a replica: peak, times hybrid_speed_factor for hybrid ones (tokens/s)."""
    return cfg.peak_tokens_per_s * (cfg.hybrid_speed_factor if hybrid else 1.0)


def host_peak(scenario: Scenario) -> float:
    """C: the shared host's generation capacity, S * peak (H * peak * phi without standalone) (tokens/s)."""
    d = scenario.workload.decode
    if scenario.num_standalone_replicas:
        return scenario.num_standalone_replicas * replica_peak(d, hybrid=False)
    return scenario.num_hybrid_replicas * replica_peak(d, hybrid=True)


def host_scale(capacity: float, busy_peaks: float) -> float:
    """min(1, C / sum of the generating replicas' peaks): the factor on each one's peak (fraction)."""
    if busy_peaks <= capacity:
        return 1.0
    return capacity / busy_peaks


# ---- 3. Prefill ------------------------------------------------------------------------------


def request_work(prompt_tokens: int, prefix_tokens: int, target_tokens: int, prefill_cost: float) -> float:
    """prefill_cost * (P + prefix) + (L - prefix): replica work of a (resumed) request (decode tokens)."""
    remaining = max(0, target_tokens - prefix_tokens)
    return prefill_cost * (prompt_tokens + prefix_tokens) + remaining


# ---- 4. Training -----------------------------------------------------------------------------


def reference_batch_tokens(scenario: Scenario) -> float:
    """T_0: tokens of a step-0 fit-step batch of mean length (prompts + responses, tokens)."""
    r = scenario.workload.response
    mean_len = capped_lognormal_mean(r.median_tokens, r.sigma, r.max_tokens)
    return scenario.required_samples * scenario.responses_per_sample * (scenario.workload.prompt_tokens + mean_len)


def train_step_seconds(batch_tokens: float, reference_tokens: float, cfg: TrainConfig, gpus: int) -> float:
    """step_s * ((1 - a) + a * T / T_0) * (G_ref / G) ** e [* s_off]: one fit step's compute (seconds)."""
    size = (1.0 - cfg.token_fraction) + cfg.token_fraction * (batch_tokens / reference_tokens)
    offload = cfg.optimizer_offload_slowdown if gpus < cfg.optimizer_offload_below_gpus else 1.0
    return cfg.step_s * size * (cfg.reference_gpus / gpus) ** cfg.scaling_exponent * offload
