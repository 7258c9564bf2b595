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

The bound is the largest of the three. It ignores every switch, sync and scheduling cost, so the
ratio ``E / bound`` measures all of them together plus the idle time the schedule left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


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


@dataclass(frozen=True)
class LowerBound:
    """The bound and each of its terms (seconds)."""

    total_s: float
    """The lower bound: the largest term (seconds)."""
    terms: dict[str, float] = field(default_factory=dict)
    """Each term by name (seconds): train_serial, gpu_seconds, first_batch_then_train."""

    @property
    def binding(self) -> str:
        """Name of the term that sets the bound."""
        return max(self.terms, key=lambda k: self.terms[k]) if self.terms else ""


def lower_bound(inp: BoundInputs) -> LowerBound:
    """Compute the three terms of the module docstring and their maximum (seconds)."""
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
