"""Fake backends for tests: the runtime's own fakes, under the testkit's import path.

They live in :mod:`dynres.runtime.backends.fake` because ``dynres run`` uses them as its
default engines and ``dynres-runtime`` must work without the testkit installed; this module keeps
``dynres.testkit.fakes`` as the documented place policy authors import them from.
"""

from dynres.runtime.backends.fake import (
    REPLICA_OPS,
    TRAIN_OPS,
    FakeCluster,
    FakeReplica,
    FakeTrainEngine,
    OpRecord,
    fake_prompts,
)

__all__ = [
    "REPLICA_OPS",
    "TRAIN_OPS",
    "FakeCluster",
    "FakeReplica",
    "FakeTrainEngine",
    "OpRecord",
    "fake_prompts",
]
