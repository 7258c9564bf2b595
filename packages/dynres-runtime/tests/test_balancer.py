"""Load balancer: routing, sticky sessions, membership, retry with partial output, rebalance.

Every test that lets time pass runs on the virtual-time loop (``run_virtual``): the fakes'
token rates, latencies and the op timeouts then count loop time only, so how busy the machine
is cannot change which request finishes before an abort or a probe (on a real loop, a test
that slept 50 ms to catch a 300 ms request mid-flight failed when the process lost its core).
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from dynres.core.errors import ReplicaUnavailableError, RuntimeStateError
from dynres.runtime.backends.fake import FakeReplica
from dynres.runtime.loop.routing import LoadBalancer
from dynres.runtime.protocols import GenerationRequest
from dynres.runtime.sim.virtual_time import run_virtual


def req(i: int | str, max_tokens: int = 1000) -> GenerationRequest:
    return GenerationRequest(request_id=f"r{i}", sample_id=f"s{i}", prompt_token_ids=[1, 2], max_tokens=max_tokens)


def lb_with(*replicas: FakeReplica, **kw) -> LoadBalancer:
    lb = LoadBalancer(**kw)
    for r in replicas:
        lb.add_replica(r)
    return lb


# ---- routing ---------------------------------------------------------------------------


def test_routes_to_least_in_flight() -> None:
    a, b, c = (FakeReplica(x) for x in "abc")
    lb = lb_with(a, b, c, sticky_capacity=0)
    for i in range(30):
        lb.route(f"r{i}")
    assert lb.in_flight_counts() == {"a": 10, "b": 10, "c": 10}
    for _ in range(10):  # free 'b' entirely: the next 10 must all go there
        lb.release(lb.running_on("b")[0])
    picked = [lb.route(f"x{i}").replica_id for i in range(10)]
    assert picked == ["b"] * 10
    lb.check_invariants()


def test_tie_break_is_random_but_seeded() -> None:
    def order(seed: int) -> list[str]:
        lb = lb_with(*(FakeReplica(f"r{k}") for k in range(8)), seed=seed, sticky_capacity=0)
        out = []
        for i in range(64):
            out.append(lb.route(f"q{i}").replica_id)
            lb.release(f"q{i}")
        return out

    assert order(1) == order(1)
    assert order(1) != order(2)
    assert len(set(order(1))) > 4  # ties really are spread, not always the first replica


def test_route_without_replica_names_the_request() -> None:
    lb = LoadBalancer()
    with pytest.raises(ReplicaUnavailableError, match="r7"):
        lb.route("r7")


def test_add_twice_and_remove_unknown_are_errors() -> None:
    a = FakeReplica("a")
    lb = lb_with(a)
    with pytest.raises(RuntimeStateError, match="already registered"):
        lb.add_replica(a)
    with pytest.raises(RuntimeStateError, match="'zz' is not registered"):
        lb.remove_replica("zz")


def test_remove_returns_running_requests_and_counts_stay_sane() -> None:
    a, b = FakeReplica("a"), FakeReplica("b")
    lb = lb_with(a, b, sticky_capacity=0)
    routed = {f"r{i}": lb.route(f"r{i}").replica_id for i in range(6)}
    on_a = sorted(r for r, rid in routed.items() if rid == "a")
    assert sorted(lb.remove_replica("a")) == on_a
    assert lb.replica_ids == ["b"]
    for r in on_a:  # attempts on the removed replica end later: no negative counts
        lb.release(r)
    assert lb.in_flight("a") == 0
    assert lb.in_flight_counts() == {"b": 6 - len(on_a)}
    lb.check_invariants()


def test_batch_membership_changes_call_on_change_once_and_are_all_or_nothing() -> None:
    seen: list[list[str]] = []
    lb = LoadBalancer(sticky_capacity=0)
    lb._on_change = lambda: seen.append(sorted(lb.replica_ids))  # what the callback sees
    reps = [FakeReplica(f"r{i}") for i in range(6)]
    lb.add_replicas(reps)
    for i in range(12):
        lb.route(f"q{i}")
    lb.remove_replicas(["r1", "r3", "r5"])
    assert seen == [[f"r{i}" for i in range(6)], ["r0", "r2", "r4"]]  # once per batch, after it
    assert {lb.route(f"x{i}").replica_id for i in range(30)} == {"r0", "r2", "r4"}
    lb.check_invariants()
    with pytest.raises(RuntimeStateError, match="'r1' is not registered"):
        lb.remove_replicas(["r0", "r1"])  # r1 already left: nothing is removed
    with pytest.raises(RuntimeStateError, match="'r2' is already registered"):
        lb.add_replicas([reps[1], reps[2]])  # r2 is routable: nothing is added
    with pytest.raises(RuntimeStateError, match="'r0' is listed twice"):
        lb.remove_replicas(["r0", "r0"])
    assert lb.replica_ids == ["r0", "r2", "r4"] and len(seen) == 2
    lb.remove_replicas(["r0", "r2", "r4"])
    assert lb.num_replicas == 0 and seen[-1] == []
    with pytest.raises(ReplicaUnavailableError):
        lb.route("y")
    lb.check_invariants()


# ---- sticky sessions -------------------------------------------------------------------


def test_sticky_session_returns_to_same_replica_even_if_busier() -> None:
    a, b = FakeReplica("a"), FakeReplica("b")
    lb = lb_with(a, b)
    first = lb.route("sess").replica_id
    lb.release("sess")
    lb.route("f0")
    lb.route("f1")  # one on each replica
    other = "b" if first == "a" else "a"
    lb.release(lb.running_on(other)[0])  # now the sticky replica is the busier one
    assert lb.in_flight_counts() == {first: 1, other: 0}
    assert lb.route("sess").replica_id == first
    assert lb.sticky_replica("sess") == first


def test_sticky_entries_invalidated_when_replica_leaves() -> None:
    a, b = FakeReplica("a"), FakeReplica("b")
    lb = lb_with(a, b)
    rid = lb.route("sess").replica_id
    lb.release("sess")
    lb.remove_replica(rid)
    assert lb.sticky_replica("sess") is None
    assert lb.route("sess").replica_id != rid
    lb.release("sess")
    lb.add_replica(a if rid == "a" else b)  # re-added: a new epoch, old entries stay invalid
    assert lb.sticky_replica("sess") != rid


def test_sticky_lru_is_bounded() -> None:
    lb = lb_with(FakeReplica("a"), FakeReplica("b"), sticky_capacity=2)
    for i in range(3):
        lb.route(f"r{i}")
        lb.release(f"r{i}")
    assert lb.sticky_replica("r0") is None  # least recently used, evicted
    assert lb.sticky_replica("r1") is not None and lb.sticky_replica("r2") is not None


def test_route_same_request_twice_is_an_error() -> None:
    lb = lb_with(FakeReplica("a"))
    lb.route("r1")
    with pytest.raises(RuntimeStateError, match="already running"):
        lb.route("r1")


# ---- generate and retry ----------------------------------------------------------------


def test_aborted_request_completes_once_elsewhere_with_partial_output() -> None:
    async def main() -> None:
        a = FakeReplica("a", tokens_per_s=1000, response_tokens=200)
        b = FakeReplica("b", tokens_per_s=1000, response_tokens=200)
        lb = lb_with(a, sticky_capacity=0)
        task = asyncio.create_task(lb.generate(req(1)))
        await asyncio.sleep(0.05)  # about 50 tokens on 'a'
        lb.add_replica(b)
        lb.remove_replica("a")  # routing cut first ...
        await a.abort(None)  # ... then the abort: the retry can only land on 'b'
        result = await task
        assert result.finish_reason == "stop" and result.replica_id == "b"
        assert list(result.token_ids) == list(range(200))  # nothing lost, nothing doubled
        assert b.resumed_with["r1"] == 50  # 'b' continued from a's partial output: 50 ms at 1000 tokens/s
        assert a.completed == [] and b.completed == ["r1"]
        assert lb.counters.resumed == 1 and lb.counters.duplicates == 0
        lb.check_invariants()

    run_virtual(main)


def test_completed_ids_stay_bounded_and_a_recent_duplicate_is_still_caught() -> None:
    async def main() -> None:
        a = FakeReplica("a", tokens_per_s=1e6, response_tokens=4)
        lb = lb_with(a, completed_window=10)
        for i in range(100):  # a long run: 100 completions through a window of 10
            await lb.generate(req(i))
        assert lb.completed_remembered <= 20  # memory does not grow with the run's length
        assert lb.counters.duplicates == 0
        await lb.generate(req(99))  # a late second completion of a recent request ...
        assert lb.counters.duplicates == 1  # ... is still recognised as a duplicate
        lb.check_invariants()

    run_virtual(main)


def test_without_partial_rollout_retry_restarts_from_scratch() -> None:
    async def main() -> None:
        a = FakeReplica("a", tokens_per_s=1000, response_tokens=200)
        b = FakeReplica("b", tokens_per_s=1000, response_tokens=200)
        lb = lb_with(a, partial_rollout=False)
        task = asyncio.create_task(lb.generate(req(1)))
        await asyncio.sleep(0.05)
        lb.add_replica(b)
        lb.remove_replica("a")
        await a.abort(None)
        result = await task
        assert result.replica_id == "b" and list(result.token_ids) == list(range(200))
        assert "r1" not in b.resumed_with
        assert lb.counters.restarted == 1 and lb.counters.resumed == 0

    run_virtual(main)


def test_requests_wait_for_a_replica_and_survive_an_empty_cluster() -> None:
    async def main() -> None:
        a = FakeReplica("a", tokens_per_s=1000, response_tokens=100)
        lb = lb_with(a)
        task = asyncio.create_task(lb.generate(req(1)))
        await asyncio.sleep(0.03)
        lb.remove_replica("a")
        await a.abort(None)
        await asyncio.sleep(0.05)
        assert not task.done()  # no replica: it waits, keeping its partial output
        c = FakeReplica("c", tokens_per_s=1000, response_tokens=100)
        lb.add_replica(c)
        result = await task
        assert result.replica_id == "c" and list(result.token_ids) == list(range(100))
        assert c.resumed_with["r1"] > 0

    run_virtual(main)


def test_replica_dying_mid_generation_is_removed_and_request_retried() -> None:
    async def main() -> None:
        failures = []
        a = FakeReplica("a", tokens_per_s=1000, response_tokens=100, die_after_s=0.02)
        b = FakeReplica("b", tokens_per_s=1000, response_tokens=100)
        lb = LoadBalancer(on_replica_failure=lambda rid, exc: failures.append(rid))
        lb.add_replica(a)
        task = asyncio.create_task(lb.generate(req(1)))
        await asyncio.sleep(0.005)
        lb.add_replica(b)
        result = await task
        assert result.replica_id == "b" and list(result.token_ids) == list(range(100))
        assert failures == ["a"] and lb.replica_ids == ["b"]
        assert lb.counters.replica_failures == 1

    run_virtual(main)


def test_evict_retries_requests_of_a_replica_that_stopped_answering() -> None:
    async def main() -> None:
        a = FakeReplica("a", manual=True, response_tokens=10, hang_on={"abort"})
        b = FakeReplica("b", tokens_per_s=1000, response_tokens=10)
        lb = lb_with(a)
        task = asyncio.create_task(lb.generate(req(1)))
        await asyncio.sleep(0.01)
        a.advance("r1", 4)
        lb.add_replica(b)
        lb.remove_replica("a")
        assert lb.evict("a") == 1
        result = await task
        assert result.replica_id == "b" and lb.counters.evicted == 1
        assert lb.in_flight("a") == 0

    run_virtual(main)


def test_evict_refuses_a_routable_replica() -> None:
    lb = lb_with(FakeReplica("a"))
    with pytest.raises(RuntimeStateError, match="remove the replica from routing"):
        lb.evict("a")


def test_draining_returns_partial_output_instead_of_retrying() -> None:
    async def main() -> None:
        a = FakeReplica("a", tokens_per_s=1000, response_tokens=500)
        lb = lb_with(a)
        task = asyncio.create_task(lb.generate(req(1)))
        await asyncio.sleep(0.05)
        lb.start_draining()
        await a.abort(None)
        result = await task
        assert result.aborted and len(result.token_ids) == 50  # 50 ms at 1000 tokens/s
        assert lb.counters.parked == 1 and lb.counters.resumed == 0

    run_virtual(main)


# ---- rebalance -------------------------------------------------------------------------


def test_rebalance_moves_only_the_excess_onto_new_replicas() -> None:
    async def main() -> None:
        s1, s2 = FakeReplica("s1", manual=True), FakeReplica("s2", manual=True)
        lb = lb_with(s1, s2)
        tasks = [asyncio.create_task(lb.generate(req(i))) for i in range(20)]
        await asyncio.sleep(0.01)
        assert lb.in_flight_counts() == {"s1": 10, "s2": 10}
        h1, h2 = FakeReplica("h1", manual=True, asleep=False), FakeReplica("h2", manual=True, asleep=False)
        lb.add_replica(h1)
        lb.add_replica(h2)
        plan = lb.plan_rebalance()
        assert {k: len(v) for k, v in plan.items()} == {"s1": 5, "s2": 5}
        newest = lb.running_on("s1")[-5:]
        assert plan["s1"] == newest  # the most recently started move: least to re-prefill
        for rid, ids in plan.items():
            await lb.replica(rid).abort(ids)
        await asyncio.sleep(0.01)
        assert lb.in_flight_counts() == {"s1": 5, "s2": 5, "h1": 5, "h2": 5}
        for r in (s1, s2, h1, h2):
            for rid in r.in_flight_ids:
                r.finish(rid)
        results = await asyncio.gather(*tasks)
        assert sorted(r.request_id for r in results) == sorted(f"r{i}" for i in range(20))
        done = Counter(x for r in (s1, s2, h1, h2) for x in r.completed)
        assert set(done.values()) == {1}
        assert lb.counters.rebalanced == 10

    run_virtual(main)


def test_rebalance_leaves_balanced_replicas_alone() -> None:
    lb = lb_with(FakeReplica("a"), FakeReplica("b"), sticky_capacity=0)
    for i in range(4):
        lb.route(f"r{i}")
    lb.add_replica(FakeReplica("c"))
    plan = lb.plan_rebalance()  # ceil(4/3) = 2: nobody is above target
    assert plan == {}


def test_wait_idle_resolves_after_abort() -> None:
    async def main() -> None:
        a = FakeReplica("a", tokens_per_s=100, response_tokens=100)
        b = FakeReplica("b", tokens_per_s=100, response_tokens=100)
        lb = lb_with(a, b)
        tasks = [asyncio.create_task(lb.generate(req(i))) for i in range(4)]
        await asyncio.sleep(0.01)
        lb.remove_replica("a")
        await a.abort(None)
        await asyncio.wait_for(lb.wait_idle("a"), 1.0)
        assert lb.in_flight("a") == 0
        results = await asyncio.gather(*tasks)
        assert {r.replica_id for r in results} == {"b"}

    run_virtual(main)


def test_retries_are_spread_over_loop_iterations_without_loss() -> None:
    async def main() -> None:
        a = FakeReplica("a", tokens_per_s=2000, response_tokens=100)
        b = FakeReplica("b", tokens_per_s=2000, response_tokens=100)
        lb = lb_with(a, retry_batch=1)
        tasks = [asyncio.create_task(lb.generate(req(i))) for i in range(20)]
        await asyncio.sleep(0.01)
        lb.add_replica(b)
        lb.remove_replica("a")
        await a.abort(None)
        for _ in range(3):
            await asyncio.sleep(0)
        assert lb.total_in_flight < 20  # one retry per iteration, not all at once
        results = await asyncio.gather(*tasks)
        assert {r.replica_id for r in results} == {"b"}
        assert sorted(b.completed) == sorted(f"r{i}" for i in range(20))
        assert lb.counters.resumed == 20

    run_virtual(main)


def test_a_failing_request_reporting_its_replica_is_not_cancelled_by_the_eviction() -> None:
    async def main() -> None:
        a = FakeReplica("a", tokens_per_s=1000, response_tokens=100, die_after_s=0.02)
        b = FakeReplica("b", tokens_per_s=1000, response_tokens=100)
        lb = LoadBalancer()

        # what the controller does on a failure: quarantine = remove (already done) + evict
        def quarantine(rid: str, exc: BaseException) -> None:
            lb.evict(rid)

        lb._on_replica_failure = quarantine
        lb.add_replica(a)
        tasks = [asyncio.create_task(lb.generate(req(i))) for i in range(3)]
        await asyncio.sleep(0.005)
        lb.add_replica(b)
        results = await asyncio.gather(*tasks)
        assert {r.replica_id for r in results} == {"b"}
        assert all(list(r.token_ids) == list(range(100)) for r in results)

    run_virtual(main)
