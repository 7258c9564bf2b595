"""An analytic lower bound on end-to-end time for the same work on the same GPUs.

Setting: ``A`` trainer GPUs, ``B`` standalone rollout GPUs. The work is what the simulated run
actually consumed: its fit steps, each of which takes ``t_s`` compute seconds on all ``A`` trainer
GPUs (so ``A * t_s`` GPU-seconds), and the samples it trained on, sample ``i`` needing ``w_i``
work units (decode-token equivalents, prefill of its prompts included, see
:func:`dynres.runtime.sim.workload.request_work`). A GPU generates at most ``p`` work units per
second (a replica's saturated peak divided by its GPUs; concurrency can only make it slower), and
one request at most ``r1 = peak / (1 + c_half)`` units per second (the rate of a lone request).

The idealised machine may do anything a real one could not: train only on trainer GPUs but
generate on any GPU, switch a GPU between the two for free, overlap perfectly, ignore weight
syncs, staleness and aborts. Any real schedule is also a schedule of this machine, so each of
these is a lower bound on the real end-to-end time ``E``:

1. ``E >= T``, ``T = sum_s t_s``: fit steps run one after another on the trainer GPUs, and
   training cannot be made faster by giving it fewer GPUs.
2. ``E >= (A * T + W / p) / (A + B)``, ``W = sum_i w_i``: all training and generation
   GPU-seconds fit into ``(A + B) * E`` GPU-seconds.
3. ``E >= t_1 + T``: no fit step starts before the first batch of ``k = required_samples``
   samples is finished, and after that the ``T`` seconds of training still run one after another.
   ``t_1`` is bounded twice: each of the first batch's ``k`` samples needs at least its own
   critical path (its longest response at the lone-request rate ``r1``), so ``t_1 >=`` the k-th
   smallest critical path; and their work needs the GPUs, so ``t_1 >=`` (the ``k`` smallest
   ``w_i`` summed) ``/ ((A + B) * p)``.

The largest of the three is :func:`lower_bound_naive`. It ignores every switch, sync and
scheduling cost. :func:`lower_bound` adds two terms that count them (``docs/simulator.md``,
"The tight lower bound", derives both); they need the run's per-cycle work
(:class:`CycleWork`) and the operation costs, and are skipped when those are not given:

4. ``whole_run``: everything the trainer does before its last fit step (every weight sync but the
   last, every fit step but the last, and at least one activation and one deactivation if hybrid
   replicas are used at all, one per cycle in an only-hybrid cluster) is serial, standalone
   replicas stand still while a sync loads weights, and hybrid replicas generate only while the
   trainer does none of that, at ``hybrid_speed_factor`` of a standalone GPU. The better of the
   run without and the run with hybrid replicas, plus the last fit step and sync. On a shared
   host (``cluster.shared_host``, standalone replicas present) the run with hybrids gains no
   capacity: generation takes at least ``W / (B * p)`` and the switches still cost trainer time.
5. ``per_cycle``: the admission rule lets at most ``max_required - step_required`` samples cross a
   weight sync (queued or in flight; ``max_required`` includes the largest extra the policy
   admitted, ``admit_extra_samples``), so at least ``2 x step_required - max_required`` of each
   cycle's samples are admitted after its opening sync and finish before its last fit step. The
   same better-of-two over each cycle's window, summed with the cycles' last fit steps and syncs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CycleWork:
    """One sync cycle's share of the work (what its fit steps trained on)."""

    train_step_s: Sequence[float]
    """Compute time of each of the cycle's fit steps, in order (seconds)."""
    sample_work: Sequence[float]
    """Generation work of each sample the cycle consumed (decode-token equivalents)."""
    sample_critical_work: Sequence[float]
    """Work of each of those samples' longest response (decode-token equivalents)."""


@dataclass(frozen=True)
class BoundInputs:
    """The work and machine a lower bound is computed for (units per field)."""

    trainer_gpus: int
    """A: GPUs that train (count)."""
    rollout_gpus: int
    """B: standalone rollout GPUs (count)."""
    train_step_s: Sequence[float]
    """Compute time of each fit step on all trainer GPUs (seconds)."""
    sample_work: Sequence[float]
    """Generation work of each consumed sample (decode-token equivalents)."""
    sample_critical_work: Sequence[float]
    """Work of each consumed sample's longest response (decode-token equivalents)."""
    peak_tokens_per_gpu_s: float
    """p: most work units one GPU generates per second (tokens/s/GPU)."""
    lone_request_tokens_per_s: float
    """r1: most work units one request gets per second (tokens/s)."""
    required_samples: int
    """k: samples in the first fit step's batch (count)."""
    hybrid_gpus: int = 0
    """GPUs whose hybrid replicas may generate (the trainer's; 0 = dynamic scheduling off) (count)."""
    hybrid_speed_factor: float = 1.0
    """phi: a hybrid GPU's peak relative to a standalone one (fraction)."""
    shared_host: bool = False
    """All replicas share one host whose capacity is the standalone GPUs' ``B * p`` (cluster.shared_host)."""
    cycles: Sequence[CycleWork] = ()
    """The run's sync cycles in order; empty = only the naive terms."""
    step_required_samples: int = 0
    """Samples each cycle consumes (count)."""
    max_required_samples: int = 0
    """Admission bound per weight version, int(required x (1 + staleness) x trigger), plus the
    most samples the run's policy admitted beyond it (``admit_extra_samples``) (count)."""
    export_s: float = 0.0
    """Trainer exporting one weight update (seconds)."""
    standalone_update_s: float = 0.0
    """Standalone replicas loading one update, paused meanwhile; 0 without standalone replicas (seconds)."""
    activate_s: float = 0.0
    """Least duration of one activation: offload + wake-up + weight load (seconds)."""
    deactivate_s: float = 0.0
    """Least duration of one deactivation: abort + sleep + onload (seconds)."""


@dataclass(frozen=True)
class LowerBound:
    """The bound and each of its terms (seconds)."""

    total_s: float
    """The lower bound: the largest term (seconds)."""
    terms: dict[str, float] = field(default_factory=dict)
    """Each term by name (seconds): train_serial, gpu_seconds, first_batch_then_train, and for the
    tight bound whole_run and per_cycle."""

    @property
    def binding(self) -> str:
        """Name of the term that sets the bound."""
        return max(self.terms, key=lambda k: self.terms[k]) if self.terms else ""


def lower_bound_naive(inp: BoundInputs) -> LowerBound:
    """Terms 1-3 of the module docstring and their maximum (seconds): no switch or sync counted."""
    a, b = inp.trainer_gpus, inp.rollout_gpus
    if a < 1 or b < 0:
        raise ValueError("lower_bound needs trainer_gpus >= 1 and rollout_gpus >= 0")
    if inp.peak_tokens_per_gpu_s <= 0 or inp.lone_request_tokens_per_s <= 0:
        raise ValueError("lower_bound needs positive generation rates")
    if len(inp.sample_work) != len(inp.sample_critical_work):
        raise ValueError("sample_work and sample_critical_work need one entry per sample")
    p = inp.peak_tokens_per_gpu_s
    train = float(sum(inp.train_step_s))
    gen_gpu_s = float(sum(inp.sample_work)) / p
    terms = {
        "train_serial": train,
        "gpu_seconds": (a * train + gen_gpu_s) / (a + b),
    }
    k = inp.required_samples
    if inp.train_step_s and k >= 1 and len(inp.sample_work) >= k:
        kth_path = sorted(inp.sample_critical_work)[k - 1] / inp.lone_request_tokens_per_s
        cheapest = float(sum(sorted(inp.sample_work)[:k])) / ((a + b) * p)
        terms["first_batch_then_train"] = max(kth_path, cheapest) + train
    return LowerBound(total_s=max(terms.values()), terms=terms)


def lower_bound(inp: BoundInputs) -> LowerBound:
    """All five terms of the module docstring and their maximum (seconds)."""
    naive = lower_bound_naive(inp)
    if not inp.cycles:
        return naive
    terms = dict(naive.terms)
    terms["whole_run"] = _whole_run(inp)
    terms["per_cycle"] = _per_cycle(inp)
    return LowerBound(total_s=max(terms.values()), terms=terms)


def _admitted_after_sync(inp: BoundInputs, index: int, consumed: int) -> int:
    """Samples of cycle ``index`` (from 0) admitted after its opening sync, at least (count)."""
    if index == 0:
        return consumed  # the run starts with nothing admitted
    carried = max(0, inp.max_required_samples - inp.step_required_samples)
    return max(0, consumed - carried)


def _fastest(inp: BoundInputs, work: float, chain_s: float, paused_s: float, switches: int) -> float:
    """Least time for ``work`` units of generation alongside ``chain_s`` serial trainer seconds.

    Without hybrids the standalone GPUs generate while not ``paused_s``; with them the window also
    holds ``switches`` activations and deactivations, and the trainer GPUs generate (at
    ``hybrid_speed_factor``) for whatever the window leaves them. On a shared host with standalone
    replicas the hybrids add no capacity: all replicas together generate at most ``B * p``, at
    any moment (also while the standalone ones pause for a sync, so that pause is not counted).
    """
    a, b, p = inp.hybrid_gpus * inp.hybrid_speed_factor, inp.rollout_gpus, inp.peak_tokens_per_gpu_s
    options = []
    if b > 0:
        options.append(max(chain_s, work / (b * p) + paused_s))
    elif work <= 0:
        options.append(chain_s)
    if a > 0:
        busy = chain_s + max(1, switches) * (inp.activate_s + inp.deactivate_s)
        if inp.shared_host and b > 0:
            options.append(max(busy, work / (b * p)))
        else:
            options.append(max(busy, (work / p + b * paused_s + a * busy) / (b + a)))
    return min(options) if options else float("inf")


def _whole_run(inp: BoundInputs) -> float:
    cycles = inp.cycles
    sync = inp.export_s + inp.standalone_update_s
    fits = [t for c in cycles for t in c.train_step_s]
    last = fits[-1] if fits else 0.0
    # Before the last fit step: the start-up sync and every cycle's sync but the last, and every
    # fit step but the last.
    chain = len(cycles) * sync + float(sum(fits)) - last
    work = float(sum(w for c in cycles for w in c.sample_work))
    needing = sum(1 for i, c in enumerate(cycles) if _admitted_after_sync(inp, i, len(c.sample_work)) > 0)
    switches = needing if inp.rollout_gpus == 0 else 1
    return _fastest(inp, work, chain, len(cycles) * inp.standalone_update_s, switches) + last + sync


def _per_cycle(inp: BoundInputs) -> float:
    sync = inp.export_s + inp.standalone_update_s
    total = 0.0
    for i, c in enumerate(inp.cycles):
        fits = list(c.train_step_s)
        last = fits[-1] if fits else 0.0
        chain = float(sum(fits)) - last
        paused = 0.0
        if i == 0:  # the first cycle's window opens at the run's start, before the start-up sync
            chain += sync
            paused = inp.standalone_update_s
        m = min(_admitted_after_sync(inp, i, len(c.sample_work)), len(c.sample_work))
        if m > 0:
            work = float(sum(sorted(c.sample_work)[:m]))
            window = _fastest(inp, work, chain, paused, 1)
            window = max(window, sorted(c.sample_critical_work)[m - 1] / inp.lone_request_tokens_per_s)
        else:
            window = chain
        total += window + last + sync
    return total
