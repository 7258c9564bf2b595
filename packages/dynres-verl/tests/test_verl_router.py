"""dynres.verl.router.PolicyRouter: verl's rollout load balancer, routing by a dynres policy."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import pytest
import yaml

from dynres.core.errors import DynresError
from dynres.verl.router import PolicyRouter

POLICIES = Path(__file__).with_name("router_policies.py")
STANDALONE = {"10.0.0.1:8000": "handle-s0", "10.0.0.2:8000": "handle-s1"}
HYBRID = {"10.0.1.1:8000": "handle-h0"}


def router(policy: str, **extra: object) -> PolicyRouter:
    return PolicyRouter(
        dict(STANDALONE), {"router_class": "dynres.verl.router.PolicyRouter", "policy": policy, **extra}
    )


def test_verl_loads_it_from_a_router_yaml_as_its_own_factory_does(tmp_path: Path) -> None:
    from verl.workers.rollout import router as verl_router

    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump({"router_class": "dynres.verl.router.PolicyRouter", "policy": "default"}))
    config = verl_router._load_router_yaml(str(path))
    cls = verl_router._resolve_router_class(config["router_class"])
    assert cls is PolicyRouter
    lb = cls(dict(STANDALONE), config)  # what verl's factory calls, inside ray.remote
    sid, handle = lb.acquire_server("r0")
    assert STANDALONE[sid] == handle


def test_it_has_every_method_of_verls_balancer_protocol() -> None:
    from verl.workers.rollout.router import RequestLoadBalancer

    for name, member in inspect.getmembers(RequestLoadBalancer, inspect.isfunction):
        if name.startswith("_"):
            continue
        ours = getattr(PolicyRouter, name, None)
        assert ours is not None, name
        theirs = [p for p in inspect.signature(member).parameters if p not in ("self", "extra")]
        assert set(theirs) <= set(inspect.signature(ours).parameters), name


def test_a_policy_without_request_decisions_routes_by_load_and_sticks() -> None:
    lb = router("default")
    assert lb.decisions is None
    first = [lb.acquire_server(f"r{i}")[0] for i in range(4)]
    assert sorted(first) == sorted([*STANDALONE, *STANDALONE])  # least in flight: two each
    again, _ = lb.acquire_server("r0")
    assert again == first[0]  # sticky
    lb.remove_servers([first[0]])
    moved, _ = lb.acquire_server("r0")
    assert moved != first[0]
    assert lb.get_total_inflight() == 3  # the removed server's requests no longer count


def test_short_requests_go_to_hybrids_once_verl_adds_them() -> None:
    lb = router(f"{POLICIES}:ShortToHybrids")
    assert lb.decisions is not None
    before, _ = lb.acquire_server("short-0", prompt_ids=[1] * 50, sampling_params={"max_tokens": 512})
    assert before in STANDALONE  # no hybrid yet: the built-in choice
    lb.add_servers(HYBRID)
    assert lb.get_status()["kinds"] == {**dict.fromkeys(STANDALONE, "standalone"), **dict.fromkeys(HYBRID, "hybrid")}
    short = [lb.acquire_server(f"short-{i}", prompt_ids=[1] * 50)[0] for i in range(1, 4)]
    long = [lb.acquire_server(f"long-{i}", prompt_ids=[1] * 500)[0] for i in range(4)]
    assert set(short) == set(HYBRID)
    assert not set(long) & set(HYBRID)
    assert lb.get_status()["request_decisions"]["routed"] == 3


def test_a_wrong_answer_falls_back_to_the_least_loaded_server_with_one_warning(caplog) -> None:
    lb = router(f"{POLICIES}:Wrong")
    with caplog.at_level(logging.WARNING, logger="dynres.verl.router"):
        chosen = [lb.acquire_server(f"r{i}")[0] for i in range(4)]
    assert sorted(chosen) == sorted([*STANDALONE, *STANDALONE])
    assert lb.get_status()["request_decisions"]["route_fallbacks"] == 4
    assert len([r for r in caplog.records if "not routable now" in r.getMessage()]) == 1


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({}, "needs 'policy'"),
        ({"policy": "default", "polcy_params": {}}, "'polcy_params' is unknown"),
        ({"policy": "default", "seed": "x"}, "'seed' must be an integer"),
        ({"policy": "no_such_policy"}, "no_such_policy"),
    ],
)
def test_bad_router_configs_name_the_key_and_the_fix(config: dict, match: str) -> None:
    with pytest.raises(DynresError, match=match):
        PolicyRouter(dict(STANDALONE), config)
