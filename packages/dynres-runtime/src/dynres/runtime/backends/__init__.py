"""Backends: the protocols every backend implements, and the backends themselves."""

from dynres.runtime.backends.protocols import (
    GenerationRequest,
    GenerationResult,
    OperationCosts,
    Replica,
    ReplicaHealth,
    ReplicaKind,
    TrainEngine,
    TrainStepResult,
    WeightUpdate,
)

__all__ = [
    "GenerationRequest",
    "GenerationResult",
    "OperationCosts",
    "Replica",
    "ReplicaHealth",
    "ReplicaKind",
    "TrainEngine",
    "TrainStepResult",
    "WeightUpdate",
]
