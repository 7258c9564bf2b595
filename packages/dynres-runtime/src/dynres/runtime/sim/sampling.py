"""A space of fully-async RL workloads and a seeded sampler: scenarios nobody tuned a policy on.

``dynres scenario sample --seed S --count N --out DIR`` writes N scenario files drawn from the
distribution below; the same seed gives the same files. Each draw starts from physical facts and
derives the simulator's parameters from them, so a scenario is coherent (a large model decodes
slowly, trains slowly and syncs slowly; a small one does everything fast):

1. **Model**: dense (1.5B-72B total parameters, all active) or MoE (16B-700B total, 3-12% active),
   log-uniform; trained in bf16 (2 bytes a parameter).
2. **GPU**: an H100-class (990 TFLOPS bf16, 3.35 TB/s, 80 GB), H20-class (148 TFLOPS, 4.0 TB/s,
   96 GB) or A100-class (312 TFLOPS, 2.0 TB/s, 80 GB) part.
3. **Replica size**: the least tensor-parallel group (1, 2, 4 or 8 GPUs) whose shard of the bf16
   weights leaves room for the KV cache (at most 60% of a GPU's memory), one time in four doubled
   for speed; a model too large for 8 GPUs serves in FP8, or over 16 (TP8 x PP2).
4. **Cluster**: total GPUs log-uniform in 8-512 with at most 16 replicas per pool (the
   simulator's cost grows with replicas, so large clusters come with large tensor-parallel
   groups); the rollout pool takes 20-80% of them; one draw in 25 is only-hybrid (no rollout GPUs).
5. **Decode speed** of one standalone replica: memory-bound, its peak batch of 128 sequences
   reads the active weights once per step (``TP x bandwidth x 60% / active bytes`` steps a
   second), capped by compute (``TP x FLOPS x 40% / (2 x active parameters)`` tokens a second),
   times an engine efficiency of 8-50% (KV-cache limits on the batch, sampling and scheduling
   overhead: what RL rollouts realise of a serving benchmark's peak). A lone request decodes at
   5-20% of the peak; re-prefill costs 5-20% of a decode token.
6. **Training**: ``10 x active parameters`` FLOPs a token (forward and backward, the old-policy
   and reference forwards) at 30-45% MFU over the trainer GPUs, for the batch's tokens.
7. **Switch and sync costs** from bytes and links: a weight sync moves the model's bytes at 3-30
   GB/s, sleep and wake-up move one replica's shard over PCIe at 10-25 GB/s (plus 0.5 s), the
   trainer's offload and onload move its share of 16 bytes a parameter (weights, gradients and
   Adam states) at 10-25 GB/s.
8. **Hybrid replicas**: 5-100% of a standalone replica's speed (their KV cache shares the
   trainer's memory; near zero is a trainer that leaves them almost nothing); one draw in 25
   puts every replica on one shared host (a CPU machine: woken hybrids add no throughput).
9. **Responses**: lognormal lengths, median 300-8,000 tokens, sigma 0.6-1.4, capped at 4-16x
   the median (8K-128K), group correlation 0.3-0.8, growth -0.2% to +0.6% a cycle.
10. **Algorithm**: staleness 0, 0.1, 0.3, 0.5, 1 or 2; trigger 1-8; partial rollout on in four
    draws of five; 4, 8 or 16 responses a prompt; 16-64 samples in flight per replica; the
    mini-batch sized so that a cycle's samples are 0.5-2x what the rollout pool holds in flight;
    20 sync cycles.
11. **Scale**: a cycle of more than 1,024 responses is simulated at 1/k scale, one simulated
    sample standing for k real ones: the mini-batch and the samples in flight per replica divided
    by k, the replica's peak divided by k and its half-saturation concurrency with it, so that each
    sample takes its real time, a cycle its real length, and switch and sync costs keep their real
    share of it; training time is the real batch's. This keeps one simulation to seconds.

docs/simulator.md cites where each range comes from.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dynres.core.config import validate_model
from dynres.core.errors import ConfigError
from dynres.runtime.sim.scenario import Scenario

GPUS: dict[str, tuple[float, float, float]] = {
    "H100": (990e12, 3.35e12, 80e9),
    "H20": (148e12, 4.0e12, 96e9),
    "A100": (312e12, 2.0e12, 80e9),
}
"""GPU class -> (bf16 FLOP/s, memory bandwidth in bytes/s, memory in bytes): vendors' data sheets."""

MAX_REPLICAS_PER_POOL = 16
"""Most replicas a pool may hold (count): the simulator's work grows with them."""

MAX_RESPONSES_PER_CYCLE = 1024
"""Most responses one sync cycle trains on (count): what keeps one simulation to seconds."""

PEAK_BATCH = 128
"""Sequences a replica decodes together at its peak (count)."""

STEPS = 20
"""Sync cycles of every sampled scenario unless the caller asks for another count (count)."""

TRAIN_FLOPS_PER_PARAM = 10.0
"""Trainer FLOPs per active parameter and token: forward and backward (6), the old-policy and the
reference forwards (2 each)."""


@dataclass(frozen=True)
class Draw:
    """The physical facts one scenario was derived from (kept in its file's header)."""

    model: str
    """``dense`` or ``moe``."""
    total_b: float
    """Total parameters (billions)."""
    active_b: float
    """Parameters active per token (billions)."""
    gpu: str
    """GPU class (a key of :data:`GPUS`)."""
    sync_gbps: float
    """Weight-sync bandwidth (GB/s)."""
    pcie_gbps: float
    """Host-device bandwidth for sleep, wake-up, offload and onload (GB/s)."""
    mfu: float
    """Trainer model-FLOPs utilisation (fraction)."""
    scale: float = 1.0
    """Real samples one simulated sample stands for (ratio; see :func:`draw_scenario`)."""


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _draw_model(rng: random.Random) -> tuple[str, float, float]:
    if rng.random() < 0.5:
        total = _log_uniform(rng, 1.5, 72.0)
        return "dense", total, total
    total = _log_uniform(rng, 16.0, 700.0)
    return "moe", total, total * _log_uniform(rng, 0.03, 0.12)


def _replica_gpus(rng: random.Random, total_b: float, memory: float) -> tuple[int, float] | None:
    """GPUs one replica spans and its weights' bytes per parameter, or None when nothing fits."""
    for bytes_per_param in (2.0, 1.0):  # bf16, else FP8 serving, as the largest MoE models do
        for gpus in (1, 2, 4, 8, 16):  # 16 = TP8 x PP2 across two nodes
            if bytes_per_param * total_b * 1e9 / gpus <= 0.6 * memory:
                faster = gpus < 8 and rng.random() < 0.25
                return (gpus * 2 if faster else gpus), bytes_per_param
    return None  # drawn again


def _cluster(rng: random.Random, tp: int) -> tuple[int, int]:
    cap = 2 * MAX_REPLICAS_PER_POOL * tp
    total = max(2 * tp, min(cap, int(_log_uniform(rng, 8, 512))))
    if rng.random() < 0.04:
        return min(total // tp, MAX_REPLICAS_PER_POOL) * tp, 0
    rollout = int(total * rng.uniform(0.2, 0.8)) // tp * tp
    rollout = min(max(tp, rollout), MAX_REPLICAS_PER_POOL * tp)
    trainer = min(max(tp, (total - rollout) // tp * tp), MAX_REPLICAS_PER_POOL * tp)
    return trainer, rollout


def _draw_hardware(rng: random.Random) -> tuple[str, float, float, str, int, float]:
    """A model and a GPU it fits on: (model, total B, active B, GPU, GPUs per replica, bytes per weight)."""
    while True:
        model, total_b, active_b = _draw_model(rng)
        gpu = rng.choice(sorted(GPUS))
        fit = _replica_gpus(rng, total_b, GPUS[gpu][2])
        if fit is not None:
            tp, weight_bytes = fit
            return model, total_b, active_b, gpu, tp, weight_bytes


def _costs(
    total_b: float, weight_bytes: float, tp: int, trainer_gpus: int, sync_gbps: float, pcie_gbps: float
) -> dict[str, float]:
    """Switch and sync costs (seconds) from the bytes each moves: all weights over the sync link, one
    replica's shard or one trainer GPU's state (16 bytes per parameter) over PCIe."""
    shard_gb = weight_bytes * total_b / tp
    trainer_gb = 16.0 * total_b / trainer_gpus
    return {
        "weight_sync_s": round(weight_bytes * total_b / sync_gbps, 3),
        "sleep_s": round(0.5 + shard_gb / pcie_gbps, 3),
        "wake_up_s": round(0.5 + shard_gb / pcie_gbps, 3),
        "abort_s": 0.1,
        "trainer_offload_s": round(trainer_gb / pcie_gbps, 3),
        "trainer_onload_s": round(trainer_gb / pcie_gbps, 3),
    }


def draw_scenario(rng: random.Random, name: str, steps: int = STEPS) -> tuple[dict[str, Any], Draw]:
    """One scenario mapping of ``steps`` sync cycles (validated by the caller) and the facts it came from."""
    model, total_b, active_b, gpu, tp, weight_bytes = _draw_hardware(rng)
    flops, bandwidth, _ = GPUS[gpu]
    trainer_gpus, rollout_gpus = _cluster(rng, tp)
    active_bytes = weight_bytes * active_b * 1e9
    efficiency = _log_uniform(rng, 0.08, 0.5)
    peak = efficiency * min(PEAK_BATCH * tp * bandwidth * 0.6 / active_bytes, tp * flops * 0.4 / (2.0 * active_b * 1e9))
    median = _log_uniform(rng, 300, 8000)
    cap = int(min(131072, max(8192, 2 ** math.ceil(math.log2(median * rng.uniform(4, 16))))))
    n = rng.choice((4, 8, 16))
    concurrent = rng.choice((16, 32, 64))
    staleness = rng.choice((0.0, 0.1, 0.3, 0.5, 1.0, 2.0))
    trigger = rng.randint(1, 8)
    replicas = max(1, rollout_gpus // tp) if rollout_gpus else max(1, trainer_gpus // tp)
    mini_real = max(1, round(replicas * concurrent * rng.uniform(0.5, 2.0) / trigger))
    # Simulated at 1/scale: one simulated sample stands for `scale` real ones, each replica holds
    # 1/scale of the samples at 1/scale of the speed, so every sample takes its real time and a
    # cycle its real length (switch and sync costs keep their real proportion to it).
    scale = max(1.0, min(concurrent, mini_real * n * trigger / MAX_RESPONSES_PER_CYCLE))
    mini_batch = max(1, round(mini_real / scale))
    scale = mini_real / mini_batch
    concurrent_sim = max(1, round(concurrent / scale))
    lone = rng.uniform(0.05, 0.2)
    mfu = rng.uniform(0.30, 0.45)
    mean_tokens = median * math.exp(0.5 * 1.0**2)  # the lognormal's mean at sigma ~ 1, before the cap
    prompt = int(_log_uniform(rng, 64, 2048))
    step_tokens = mini_real * n * (prompt + mean_tokens)
    step_s = step_tokens * TRAIN_FLOPS_PER_PARAM * active_b * 1e9 / (trainer_gpus * flops * mfu)
    sync_gbps = _log_uniform(rng, 3, 30)
    pcie_gbps = rng.uniform(10, 25)
    shared = rng.random() < 0.04
    scenario = {
        "name": name,
        "description": (
            f"sampled: {model} {total_b:.0f}B ({active_b:.1f}B active) on {gpu}, "
            f"{trainer_gpus}+{rollout_gpus} GPUs {'TP8xPP2' if tp == 16 else f'TP{tp}'}"
            f"{', FP8' if weight_bytes == 1.0 else ''}"
        ),
        "steps": steps,
        "seed": 0,
        "async_training": {
            "use_dynamic_resource_scheduling": True,
            "dynamic_schedule_policy": "default",
            "staleness_threshold": staleness,
            "trigger_parameter_sync_step": trigger,
            "partial_rollout": rng.random() < 0.8,
            "concurrent_samples_per_replica": concurrent_sim,
        },
        "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": mini_batch}, "rollout": {"n": n}},
        "cluster": {
            "trainer_gpus": trainer_gpus,
            "rollout_gpus": rollout_gpus,
            "gpus_per_replica": tp,
            "shared_host": shared,
        },
        "workload": {
            "prompt_tokens": prompt,
            "response": {
                "median_tokens": round(median, 1),
                "sigma": round(rng.uniform(0.6, 1.4), 3),
                "max_tokens": cap,
                "group_correlation": round(rng.uniform(0.3, 0.8), 3),
                "growth_per_step": round(rng.uniform(-0.002, 0.006), 5),
            },
            "decode": {
                "peak_tokens_per_s": round(peak / scale, 3),
                # c_half = (1 - f) / f shrinks with the scale, so a simulated request decodes as fast as a real one.
                "lone_request_fraction": round(1.0 / (1.0 + (1.0 / lone - 1.0) / scale), 4),
                "prefill_cost": round(rng.uniform(0.05, 0.2), 3),
                "hybrid_speed_factor": round(min(1.0, max(0.05, rng.betavariate(2.0, 1.2))), 3),
            },
            "train": {"step_s": round(step_s, 2), "reference_gpus": trainer_gpus, "token_fraction": 0.9},
        },
        "costs": _costs(total_b, weight_bytes, tp, trainer_gpus, sync_gbps, pcie_gbps),
    }
    return scenario, Draw(model, total_b, active_b, gpu, sync_gbps, pcie_gbps, mfu, round(scale, 3))


def sample_scenarios(seed: int, count: int, steps: int = STEPS) -> Iterator[tuple[dict[str, Any], Draw]]:
    """``count`` validated scenario mappings drawn with ``seed`` (the same seed, the same scenarios).

    ``steps`` (sync cycles of each) changes nothing else of a draw: the same seed at another run
    length gives the same workloads, run longer.
    """
    if count < 1:
        raise ConfigError(f"--count must be >= 1 scenarios, got {count}")
    if seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {seed}")
    if steps < 1:
        raise ConfigError(f"--steps must be >= 1 sync cycles, got {steps}")
    rng = random.Random(seed)
    for i in range(count):
        name = f"sample-{seed}-{i:03d}"
        scenario, draw = draw_scenario(rng, name, steps)
        validate_model(Scenario, scenario, name)  # a draw the model refuses is a sampler bug: raise
        yield scenario, draw


def write_samples(seed: int, count: int, out: Path, steps: int = STEPS) -> list[Path]:
    """Write the scenarios of :func:`sample_scenarios` as ``out/sample-<seed>-<i>.yaml``; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    command = f"dynres scenario sample --seed {seed}" + (f" --steps {steps}" if steps != STEPS else "")
    for scenario, draw in sample_scenarios(seed, count, steps):
        path = out / f"{scenario['name']}.yaml"
        header = (
            f"# Drawn by `{command}` (dynres.runtime.sim.sampling): "
            f"{draw.model} model, {draw.total_b:.1f}B parameters ({draw.active_b:.2f}B active), "
            f"{draw.gpu} GPUs, weight sync at {draw.sync_gbps:.1f} GB/s, PCIe {draw.pcie_gbps:.1f} GB/s, "
            f"MFU {draw.mfu:.2f}; simulated at 1/{draw.scale:g} scale (one sample stands for {draw.scale:g}).\n"
        )
        path.write_text(header + yaml.safe_dump(scenario, sort_keys=False), encoding="utf-8")
        paths.append(path)
    return paths
