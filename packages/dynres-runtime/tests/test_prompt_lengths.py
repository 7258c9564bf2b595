"""A prompt's earlier response lengths reach length predictions; the long-tail toy task gives each
prompt its own heavy-tailed length, the same in every epoch."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from statistics import median
from typing import Any

import pytest

from dynres.core import RequestContext, get_plugin_manager
from dynres.core.plugins import BoundPolicy
from dynres.policies.default import DefaultPolicy
from dynres.runtime.loop.routing import LoadBalancer
from dynres.runtime.loop.routing.decider import RequestDecider
from dynres.runtime.protocols import GenerationRequest, GenerationResult, ReplicaKind
from dynres.runtime.realrun import load_run_config
from dynres.runtime.realrun.builders import prompt_groups

REPO = Path(__file__).resolve().parents[3]
LONGTAIL = REPO / "examples" / "tiny-grpo-longtail-cpu.yaml"


class Recorder(DefaultPolicy):
    """Keeps every request context it is asked about."""

    name = "recorder"

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self.seen: dict[str, RequestContext] = {}

    def route(self, request: RequestContext) -> str | None:
        self.seen[request.request_id] = request
        return None


class _Replica:
    """Answers request ``s<k>/<i>`` with ``length(k, i)`` tokens."""

    replica_id = "standalone-0"
    kind = ReplicaKind.STANDALONE

    async def generate(self, req: GenerationRequest) -> GenerationResult:
        await asyncio.sleep(0)
        k, i = (int(x) for x in req.request_id[1:].split("/"))
        return GenerationResult(req.request_id, [1] * (10 * k + i + 1), [0.0] * (10 * k + i + 1), "stop", "s")


def test_a_request_sees_its_prompts_earlier_samples_but_not_its_own_or_other_prompts() -> None:
    policy = Recorder()
    lb = LoadBalancer(
        seed=0, decider=RequestDecider(BoundPolicy(policy, get_plugin_manager(load_plugins=False)), lambda: 0.0)
    )
    lb.add_replicas([_Replica()])  # type: ignore[list-item]  # generate() is all routing needs

    async def sample(k: int, prompt: str | None) -> None:
        # One response first, so the others see a sibling, then the rest together.
        reqs = [GenerationRequest(f"s{k}/{i}", f"s{k}", [1, 2], 64, prompt_id=prompt) for i in range(3)]
        await lb.generate(reqs[0])
        await asyncio.gather(*(lb.generate(r) for r in reqs[1:]))

    async def main() -> None:
        await sample(0, "p0")  # lengths 1, 2, 3
        await sample(1, "p1")  # another prompt: 11, 12, 13
        await sample(2, "p0")  # p0 again: 21, 22, 23
        await sample(3, "p0")
        await sample(4, None)  # a prompt source without ids

    asyncio.run(main())
    seen = policy.seen
    assert seen["s0/0"].prompt_lengths == () and seen["s0/0"].prompt_id == "p0"
    assert seen["s1/1"].prompt_lengths == () and seen["s1/1"].sibling_lengths == (11,)
    assert seen["s2/0"].prompt_lengths == (1, 2, 3)  # s1 is another prompt's
    assert seen["s2/2"].prompt_lengths == (1, 2, 3) and seen["s2/2"].sibling_lengths == (21,)
    assert seen["s3/0"].prompt_lengths == (1, 2, 3, 21, 22, 23)
    assert seen["s4/0"].prompt_id is None and seen["s4/0"].prompt_lengths == ()


def test_the_long_tail_task_gives_each_prompt_one_heavy_tailed_length_in_every_epoch() -> None:
    cfg = load_run_config(str(LONGTAIL), {})
    groups = list(itertools.islice(prompt_groups(cfg), 3 * cfg.task.num_prompts))
    by_prompt: dict[str, set[int]] = {}
    for g in groups:
        by_prompt.setdefault(g.prompt_id, set()).add(g.max_tokens)
    assert len(by_prompt) == cfg.task.num_prompts
    assert all(len(limits) == 1 for limits in by_prompt.values())  # the same length in every epoch
    limits = [next(iter(v)) for v in by_prompt.values()]
    assert max(limits) <= cfg.task.max_tokens and min(limits) >= 1
    # Heavy-tailed: the longest prompt runs several times the median one.
    assert max(limits) >= 4 * median(limits)
    # The plain task keeps every response at max_tokens, each prompt still named.
    plain = load_run_config(str(LONGTAIL), {"task.length_median": None})
    first = list(itertools.islice(prompt_groups(plain), 4))
    assert {g.max_tokens for g in first} == {plain.task.max_tokens}
    assert [g.prompt_id for g in first] == ["p0", "p1", "p2", "p3"]


def test_a_median_above_the_cap_is_refused_by_name() -> None:
    from dynres.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"task.length_median=64 exceeds task.max_tokens=48"):
        load_run_config(str(LONGTAIL), {"task.length_median": 64})


def test_a_checkpointed_group_keeps_its_prompt() -> None:
    from dynres.runtime.samples import group_from_dict, group_to_dict

    cfg = load_run_config(str(LONGTAIL), {})
    group = next(prompt_groups(cfg, start=33))
    back = group_from_dict(group_to_dict(group))
    assert (back.prompt_id, back.max_tokens) == ("p1", group.max_tokens)
