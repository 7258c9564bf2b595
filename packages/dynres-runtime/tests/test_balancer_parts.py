"""The routing parts on their own: the in-flight index, the completed-id window, the sticky table,
the router's use of the RNG and the rebalance planner's moved ranges.

The balancer's own tests (test_balancer.py, test_balancer_stateful.py) cover them together; these
check the properties each part promises whatever the balancer does with it.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dynres.runtime.loop.routing.completed import CompletedIds
from dynres.runtime.loop.routing.inflight import InflightIndex
from dynres.runtime.loop.routing.rebalance import RebalancePlanner
from dynres.runtime.loop.routing.router import Router
from dynres.runtime.loop.routing.sticky import StickyTable

_OPS = st.lists(st.tuples(st.sampled_from(["add", "remove", "up", "down"]), st.integers(0, 5)), max_size=200)


@settings(max_examples=200, deadline=None)
@given(ops=_OPS)
def test_inflight_index_matches_a_plain_dict_under_random_moves(ops: list[tuple[str, int]]) -> None:
    index = InflightIndex()
    model: dict[str, int] = {}
    for op, k in ops:
        rid = f"r{k}"
        if op == "add" and rid not in model:
            model[rid] = k % 3  # a re-added replica may start with requests still running
            index.add(rid, k % 3)
        elif op == "remove" and rid in model:
            assert index.remove(rid) == model.pop(rid)
            index.refresh_lowest()
        elif op == "up" and rid in model:
            model[rid] += 1
            index.up(rid)
        elif op == "down" and model.get(rid, 0) > 0:
            model[rid] -= 1
            index.down(rid)
        index.check()
        assert index.count == model
        assert index.lowest == min(model.values(), default=0)
        assert set(index.buckets[index.lowest]) == {r for r, c in model.items() if c == index.lowest}
    index.down("never-added")  # a replica removed while its request ran: nothing to count down
    index.check()


def test_completed_ids_remember_the_last_window_and_at_most_twice_it() -> None:
    window = 50
    done = CompletedIds(window)
    ids = [f"q{i}" for i in range(1_000)]
    for n, rid in enumerate(ids, 1):
        assert not done.add(rid)
        assert done.remembered <= 2 * window
        assert done.remembered >= min(n, window)
    assert all(done.add(rid) for rid in ids[-window:])  # the newest window: duplicates, all of them
    assert not done.add(ids[0])  # long gone: memory stays bounded, so it cannot be caught
    assert done.remembered <= 2 * window


def test_sticky_table_is_bounded_keeps_recent_entries_and_drops_ended_registrations() -> None:
    sticky = StickyTable(8192)  # large enough to be split over shards
    assert len(sticky.shards) > 1
    sticky.register("a")
    ids = [f"q{i}" for i in range(20_000)]
    for rid in ids:
        shard = sticky.shards[hash(rid) & sticky.mask]
        shard[rid] = sticky.epoch["a"]
        if len(shard) > sticky.shard_capacity:
            shard.popitem(last=False)
    assert sum(map(len, sticky.shards)) <= 8192
    assert all(sticky.replica_of(rid, hash(rid)) == "a" for rid in ids[-1_000:])
    sticky.unregister("a")
    sticky.register("a")  # back, with a new epoch: the old entries stay stale
    assert sticky.replica_of(ids[-1], hash(ids[-1])) is None


def test_router_draws_the_rng_only_among_tied_replicas() -> None:
    index = InflightIndex()
    sticky = StickyTable(100)
    for rid, c in (("a", 0), ("b", 1), ("c", 1)):
        index.add(rid, c)
        sticky.register(rid)
    router = Router(index, sticky, seed=3)
    reference = random.Random(3)
    assert router.choose("x", hash("x")) == "a"  # one least loaded replica: no draw
    index.up("a")  # now a, b, c all carry 1
    assert router.choose("x", hash("x")) == "a"  # sticky: no draw
    pick = router.choose("y", hash("y"))
    bucket = index.buckets[1]
    assert pick == bucket[int(reference.random() * len(bucket))]  # exactly one draw, scaled to the tie
    assert router._rng.getstate() == reference.getstate()


def test_rebalance_planner_drops_the_ranges_of_plans_whose_attempts_ended() -> None:
    index = InflightIndex()
    by_replica: dict[str, dict[str, int]] = {"a": {f"q{i}": i + 1 for i in range(6)}, "b": {}}
    index.add("a", 6)
    index.add("b", 0)
    planner = RebalancePlanner(index, by_replica)
    plan = planner.plan(next_seq=7)
    assert plan == {"a": ["q3", "q4", "q5"]}  # ceil(6 / 2) = 3 stay, the newest 3 go
    assert [s for s in range(1, 7) if planner.is_moved("a", s)] == [4, 5, 6]
    for rid in plan["a"]:  # the picked attempts end
        del by_replica["a"][rid]
        index.down("a")
    assert planner.target(next_seq=7) == 2 and planner.moved == {"a": [(4, 7)]}  # older attempts still run
    by_replica["a"] = {"q6": 7}  # the rest end too; one routed after the plan runs
    index.down("a")
    index.down("a")
    assert not planner.is_moved("a", 7)
    assert planner.target(next_seq=8) == 1 and planner.moved == {}  # the ended plan's range is gone
