"""Fake backends: a replica and a train engine that only ``asyncio.sleep``.

Three users share them: the tests (a double with fault injection and an op log), ``dynres run``
(its default ``fake`` engines, so the CLI runs with nothing but ``dynres-runtime`` installed)
and ``benchmarks/scale_bench.py`` (hundreds of replicas on one loop). That is why they live in
the runtime and not in the testkit; ``dynres.testkit.fakes`` re-exports them for policy authors.

Both fakes work on a real and on a virtual-time event loop, take a configurable latency per
operation, can be told to fail or hang on any operation, and append every operation to an op
log (:class:`OpRecord`, with loop timestamps) so tests can assert the order of events across
replicas and the trainer. They also record *violations*: calls that a real engine would reject
or that would corrupt a run (generate on a sleeping replica, sleep with requests in flight,
loading weights into a replica whose weights are offloaded, training while offloaded). Tests
assert that no violation happened.

One job per module:

* ``faults``: latency / failure / hang per operation, the op log, violations (both fakes);
* ``timer``: the per-replica wake-up heap and the per-loop take-out budget, which keep hundreds
  of replicas cheap on the caller's loop;
* ``replica``: :class:`FakeReplica` and the state of each request in flight;
* ``train``: :class:`FakeTrainEngine`;
* ``cluster``: :class:`FakeCluster` (replicas and a trainer on one op log) and :func:`fake_prompts`.
"""

from dynres.runtime.backends.fake.cluster import FakeCluster, fake_prompts
from dynres.runtime.backends.fake.faults import REPLICA_OPS, TRAIN_OPS, OpRecord
from dynres.runtime.backends.fake.replica import FakeReplica
from dynres.runtime.backends.fake.train import FakeTrainEngine

__all__ = [
    "REPLICA_OPS",
    "TRAIN_OPS",
    "FakeCluster",
    "FakeReplica",
    "FakeTrainEngine",
    "OpRecord",
    "fake_prompts",
]
