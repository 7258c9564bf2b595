"""Ray backend: replicas, the train engine and the coordinator as async Ray actors.

Importing this package does not import Ray; the first call that needs it does, and raises
:class:`~dynres.core.errors.MissingExtraError` naming ``dynres-runtime[ray]`` when it is absent.
"""

from dynres.runtime.backends.ray._ray import require_ray
from dynres.runtime.backends.ray.actors import ActorInfo, ReplicaActor, TrainEngineActor
from dynres.runtime.backends.ray.cluster import RayCluster, RayClusterConfig, RaySystem
from dynres.runtime.backends.ray.factory import Factory
from dynres.runtime.backends.ray.monitor import LoopLag, LoopLagMonitor
from dynres.runtime.backends.ray.proxies import RayReplica, RayTrainEngine

__all__ = [
    "ActorInfo",
    "Factory",
    "LoopLag",
    "LoopLagMonitor",
    "RayCluster",
    "RayClusterConfig",
    "RayReplica",
    "RaySystem",
    "RayTrainEngine",
    "ReplicaActor",
    "TrainEngineActor",
    "require_ray",
]
