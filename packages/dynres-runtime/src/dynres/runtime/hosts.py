"""Where a dynres run config puts its engines' compute: all on one machine's CPU cores, or not.

On one host every engine takes its share of the same cores, so a woken hybrid replica adds no
generation throughput; it only divides what the standalone replicas had. ``dynres run`` tells its
policy so (``ScheduleContext.shared_host``), and ``dynres scenario fit`` writes it into a fitted
scenario (``cluster.shared_host``): both read a run config here, so they agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def _gpu_slot(slot: Any) -> bool:
    """True for a Ray resource slot that asks for a GPU."""
    return isinstance(slot, Mapping) and float(slot.get("GPU") or 0) > 0


def host_facts(rcfg: Mapping[str, Any], show: Callable[[Any], str] = str) -> tuple[bool | None, str]:
    """Whether a dynres run config puts every engine on one machine's CPU cores, and the facts read.

    True: vLLM / torch engines, no GPU in any Ray slot nor a CUDA trainer device, all on one
    machine (``engines.runtime: local`` or a local Ray, ``ray.address`` null). False: fake
    engines (modelled speeds share nothing) or GPUs. None: the config does not tell. ``show``
    writes a Ray slot's value in the facts.
    """
    engines = rcfg.get("engines")
    if not isinstance(engines, Mapping):
        return None, ""
    rollout, trainer = engines.get("rollout"), engines.get("trainer")
    if rollout != "vllm":
        return False, f"engines.rollout={rollout}: modelled speeds, no compute shared"
    raw_cl, raw_topts = rcfg.get("ray"), engines.get("trainer_options")
    cl: Mapping[str, Any] = raw_cl if isinstance(raw_cl, Mapping) else {}
    topts: Mapping[str, Any] = raw_topts if isinstance(raw_topts, Mapping) else {}
    slots = {k: cl.get(k) for k in ("slot", "trainer_slot", "standalone_slot") if cl.get(k)}
    gpu = [f"ray.{k}={show(v)}" for k, v in slots.items() if _gpu_slot(v)]
    device = str(topts.get("device") or "cpu")
    if trainer == "torch" and device != "cpu":
        gpu.append(f"engines.trainer_options.device={device}")
    if gpu:
        return False, f"engines on accelerators ({', '.join(gpu)})"
    local = engines.get("runtime") == "local" or cl.get("address") is None
    where = "engines.runtime=local" if engines.get("runtime") == "local" else "a local Ray (ray.address null)"
    slot_text = ", ".join(f"ray.{k}={show(v)}" for k, v in slots.items()) or "no slot"
    facts = f"engines.rollout=vllm, engines.trainer={trainer} on CPU ({slot_text}, no GPU)"
    if not local:
        return None, f"{facts} on the Ray cluster at {cl.get('address')}: one host or several is not known"
    return True, f"{facts}, {where}"
