"""Connecting to Ray, reserving resources with placement groups, and starting the actors.

Placement mirrors the two node pools of a :class:`~dynres.core.config.DynresConfig`:

* every trainer node gets one placement group of ``trainer.n_gpus_per_node`` bundles
  (``STRICT_PACK``: one node). The train engine actor takes ``trainer_share`` of bundle 0 of
  the first group; hybrid replica ``h`` takes the rest of the bundle at slot ``h * tp``, so a
  hybrid replica is always on the same node and the same accelerator as the trainer's memory it
  borrows;
* every rollout node gets one group of ``rollout.n_gpus_per_node`` bundles; standalone replica
  ``s`` takes the whole bundle at slot ``s * tp``.

A *slot* is one accelerator (``{"GPU": 1, "CPU": ...}`` on GPUs; on a CPU-only machine a
fraction of a core, optionally tagged with a custom resource so tests can steer a pool onto
chosen nodes of a ``ray.cluster_utils.Cluster``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, field_validator

from dynres.core.config import DynresConfig, StrictModel
from dynres.core.errors import BackendError, BackendTimeoutError
from dynres.runtime.backends.ray._ray import remote_class, require_ray, use_loopback
from dynres.runtime.backends.ray.actors import ActorInfo, ReplicaActor, TrainEngineActor
from dynres.runtime.backends.ray.factory import Factory
from dynres.runtime.backends.ray.proxies import RayReplica, RayTrainEngine, SpawnSpec
from dynres.runtime.protocols import Replica, ReplicaKind


class RayClusterConfig(StrictModel):
    """The ``ray`` section of a run file: where Ray runs and what one accelerator slot reserves."""

    address: str | None = Field(
        None,
        description="Ray address to join ('auto', 'host:port', 'ray://...'); null starts a local Ray.",
    )
    num_cpus: int | None = Field(
        None, ge=1, description="CPUs of a local Ray (null: all of the machine); ignored with an address."
    )
    temp_dir: str | None = Field(None, description="Session directory of a local Ray (null: Ray's default /tmp/ray).")
    namespace: str = Field("dynres", min_length=1, description="Ray namespace of the run's actors.")
    slot: dict[str, float] = Field(
        default_factory=lambda: {"CPU": 1.0},
        description="Resources of one accelerator slot, e.g. {GPU: 1, CPU: 4}; CPU-only: {CPU: 0.5}.",
    )
    trainer_slot: dict[str, float] | None = Field(None, description="Slot of the trainer pool (null: `slot`).")
    standalone_slot: dict[str, float] | None = Field(None, description="Slot of the rollout pool (null: `slot`).")
    trainer_share: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="Fraction of a trainer slot the train engine takes; a hybrid replica takes the rest.",
    )
    env_vars: dict[str, str] = Field(
        default_factory=dict, description="Environment variables of every actor (runtime_env)."
    )
    placement_timeout_s: float = Field(
        120.0, gt=0, description="Wait for placement groups at most this long (seconds)."
    )
    start_timeout_s: float = Field(600.0, gt=0, description="Wait for engines to build at most this long (seconds).")
    shutdown_timeout_s: float = Field(
        30.0, gt=0, description="Wait for each engine's shutdown at most this long (seconds)."
    )
    lag_interval_s: float = Field(
        0.01, gt=0, description="Tick of the event-loop lag monitor in every actor (seconds)."
    )
    log_to_driver: bool = Field(False, description="Stream actor stdout/stderr to the driver.")

    @field_validator("slot", "trainer_slot", "standalone_slot")
    @classmethod
    def _non_negative(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None:
            bad = [k for k, v in value.items() if v < 0]
            if bad:
                raise ValueError(f"slot resources must be >= 0; negative: {', '.join(bad)}")
            if not any(v > 0 for v in value.values()):
                # An empty slot would let Ray stack every engine onto one process slot.
                raise ValueError("a slot must reserve some resource, e.g. {CPU: 0.5}")
        return value


def _scaled(resources: Mapping[str, float], share: float) -> dict[str, Any]:
    """Actor options asking for ``share`` of a slot (num_cpus / num_gpus / custom resources)."""
    res = {k: v * share for k, v in resources.items() if v > 0}
    return {
        "num_cpus": res.pop("CPU", 0.0),
        "num_gpus": res.pop("GPU", 0.0),
        "memory": res.pop("memory", None),
        "resources": res,
    }


def _pool_slots(cfg: RayClusterConfig) -> tuple[dict[str, float], dict[str, float]]:
    """The slot of a trainer bundle and of a rollout bundle (``slot`` where no pool slot is set)."""
    return cfg.trainer_slot or cfg.slot, cfg.standalone_slot or cfg.slot


def _bundle(pgs: list[Any], per_node: int, slot_index: int) -> Any:
    """The scheduling strategy of pool slot ``slot_index``: its node's group, its bundle there."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(
        placement_group=pgs[slot_index // per_node],
        placement_group_bundle_index=slot_index % per_node,
        placement_group_capture_child_tasks=True,
    )


def _actor_options(slot: Mapping[str, float], share: float, strategy: Any, name: str) -> dict[str, Any]:
    """Ray actor options: ``share`` of ``slot`` on the bundle of ``strategy``, named ``name``."""
    opts = {k: v for k, v in _scaled(slot, share).items() if v not in (None, {})}
    # No restarts: a replica that dies comes back empty and with stale weights, so the run
    # treats it as lost instead of silently routing to it again.
    return {**opts, "scheduling_strategy": strategy, "max_restarts": 0, "name": name, "max_concurrency": 10_000}


@dataclass
class RaySystem:
    """Everything a run placed on Ray: the proxies plus the handles needed to tear it down."""

    standalone: list[RayReplica] = field(default_factory=list)
    """Standalone replicas, on the rollout pool's bundles."""
    hybrid: list[RayReplica] = field(default_factory=list)
    """Hybrid replicas, on the trainer pool's bundles."""
    trainer: RayTrainEngine | None = None
    """Proxy of the train engine actor, on the first trainer bundle."""
    placement_groups: list[Any] = field(default_factory=list)
    """Placement groups to remove at shutdown."""
    start_s: float = 0.0
    """Wall time from placement to every engine built (seconds)."""

    @property
    def replicas(self) -> list[RayReplica]:
        """All replicas, standalone first."""
        return [*self.standalone, *self.hybrid]


class RayCluster:
    """Owns the connection to Ray for one run: connect, place, start actors, tear everything down."""

    def __init__(self, config: RayClusterConfig | None = None) -> None:
        """Prepare (nothing is started until :meth:`connect`)."""
        self.config = config or RayClusterConfig()
        self.started_ray = False
        """True when :meth:`connect` started a local Ray (so :meth:`disconnect` stops it)."""
        self.connected = False
        """True when :meth:`connect` called ``ray.init`` (so :meth:`disconnect` undoes it)."""
        self.system = RaySystem()
        self._extra_actors: list[Any] = []

    # -- connection (synchronous: call these outside the event loop) ---------------------------
    def connect(self) -> None:
        """Start a local Ray or join ``address``; a Ray already initialised in this process is reused.

        ``ray.init`` blocks for seconds, so it is called before the run's event loop starts.
        """
        ray = require_ray()
        if ray.is_initialized():
            return  # the caller's session: disconnect() leaves it alone
        cfg = self.config
        kwargs: dict[str, Any] = {
            "namespace": cfg.namespace,
            "log_to_driver": cfg.log_to_driver,
            "include_dashboard": False,
            "configure_logging": True,
            "logging_level": logging.WARNING,
        }
        if cfg.env_vars:
            kwargs["runtime_env"] = {"env_vars": dict(cfg.env_vars)}
        if cfg.address is None:
            # A local Ray serves this process only: keep it on 127.0.0.1.
            use_loopback()
            kwargs["num_cpus"] = cfg.num_cpus
            if cfg.temp_dir:
                kwargs["_temp_dir"] = cfg.temp_dir
        else:
            kwargs["address"] = cfg.address
        try:
            ray.init(**kwargs)
        except ConnectionError as exc:
            raise BackendError(
                f"cannot reach the Ray cluster at ray.address={cfg.address!r} ({exc}); "
                "start it with `ray start --head` or set ray.address to null for a local Ray"
            ) from None
        self.started_ray = cfg.address is None
        self.connected = True

    def disconnect(self) -> None:
        """Undo :meth:`connect`: a local Ray it started is stopped; a session it found is kept."""
        ray = require_ray()
        if self.connected and ray.is_initialized():
            ray.shutdown()
        self.connected = False

    # -- placement and actors (async) ------------------------------------------------------------
    async def start(
        self,
        dyn: DynresConfig,
        *,
        standalone: Factory | None,
        hybrid: Factory | None,
        trainer: Factory,
        on_started: Callable[[int, int], Any] | None = None,
    ) -> RaySystem:
        """Reserve bundles for both pools and start every engine concurrently; return the proxies.

        ``standalone`` / ``hybrid`` build one replica each (called with ``replica_id`` and
        ``kind``); ``trainer`` builds the train engine. ``on_started(done, total)`` hears each
        engine that finished starting (a progress display). Raises BackendTimeoutError naming
        what is missing when the cluster cannot host the placement in ``placement_timeout_s``.
        """
        t0 = time.perf_counter()
        trainer_pgs, rollout_pgs = await self._place(dyn)
        self._create_actors(dyn, trainer_pgs, rollout_pgs, standalone=standalone, hybrid=hybrid, trainer=trainer)
        await self._start_engines(on_started)
        self.system.start_s = time.perf_counter() - t0
        return self.system

    async def _place(self, dyn: DynresConfig) -> tuple[list[Any], list[Any]]:
        """One ready STRICT_PACK placement group per trainer node and per rollout node (in that order)."""
        ray = require_ray()
        from ray.util.placement_group import placement_group

        cfg = self.config
        trainer_slot, rollout_slot = _pool_slots(cfg)

        def groups(nnodes: int, per_node: int, slot: Mapping[str, float], pool: str) -> list[Any]:
            out = []
            for i in range(nnodes):
                pg = placement_group(
                    [dict(slot) for _ in range(per_node)], strategy="STRICT_PACK", name=f"dynres-{pool}-{i}"
                )
                self.system.placement_groups.append(pg)
                out.append(pg)
            return out

        trainer_pgs = groups(dyn.trainer.nnodes, dyn.trainer.n_gpus_per_node, trainer_slot, "trainer")
        rollout_pgs = groups(dyn.rollout.nnodes, dyn.rollout.n_gpus_per_node, rollout_slot, "rollout")
        try:
            await asyncio.wait_for(
                asyncio.gather(*(pg.ready() for pg in self.system.placement_groups)), cfg.placement_timeout_s
            )
        except TimeoutError:
            avail = ray.available_resources()
            raise BackendTimeoutError(
                f"placement groups not ready after {cfg.placement_timeout_s:.0f}s: asked for "
                f"{dyn.trainer.nnodes} trainer node(s) x {dyn.trainer.n_gpus_per_node} slot(s) of "
                f"{trainer_slot} and {dyn.rollout.nnodes} rollout node(s) x "
                f"{dyn.rollout.n_gpus_per_node} slot(s) of {rollout_slot}, but the cluster has "
                f"{avail} free; lower the slot resources or add nodes"
            ) from None
        return trainer_pgs, rollout_pgs

    def _create_actors(
        self,
        dyn: DynresConfig,
        trainer_pgs: list[Any],
        rollout_pgs: list[Any],
        *,
        standalone: Factory | None,
        hybrid: Factory | None,
        trainer: Factory,
    ) -> None:
        """The trainer and replica actors on their bundles, as proxies in :attr:`system`.

        The train engine takes ``trainer_share`` of the first trainer bundle; hybrid replica ``h``
        the rest of the trainer bundle at slot ``h * tp``; standalone replica ``s`` the whole
        rollout bundle at slot ``s * tp``. The actors build their engines on ``start``.
        """
        cfg = self.config
        tp = dyn.actor_rollout_ref.rollout.tensor_model_parallel_size
        trainer_slot, rollout_slot = _pool_slots(cfg)
        per_trainer_node, per_rollout_node = dyn.trainer.n_gpus_per_node, dyn.rollout.n_gpus_per_node
        share, lag = cfg.trainer_share, cfg.lag_interval_s
        bundle = _bundle(trainer_pgs, per_trainer_node, 0)
        trainer_actor = (
            remote_class(TrainEngineActor)
            .options(**_actor_options(trainer_slot, share, bundle, "dynres-trainer"))
            .remote(trainer, lag)
        )
        self.system.trainer = RayTrainEngine(trainer_actor)
        if standalone is not None:
            for s in range(dyn.num_standalone_replicas):
                rid = f"standalone-{s}"
                bundle = _bundle(rollout_pgs, per_rollout_node, s * tp)
                opts = _actor_options(rollout_slot, 1.0, bundle, f"dynres-{rid}")
                spec = SpawnSpec(opts["name"], opts, (rid, ReplicaKind.STANDALONE.value, standalone, lag))
                self.system.standalone.append(_spawn_replica(spec))
        if hybrid is not None:
            for h in range(dyn.num_hybrid_replicas):
                rid = f"hybrid-{h}"
                bundle = _bundle(trainer_pgs, per_trainer_node, h * tp)
                opts = _actor_options(trainer_slot, 1.0 - share, bundle, f"dynres-{rid}")
                spec = SpawnSpec(opts["name"], opts, (rid, ReplicaKind.HYBRID.value, hybrid, lag))
                self.system.hybrid.append(_spawn_replica(spec))

    async def _start_engines(self, on_started: Callable[[int, int], Any] | None = None) -> None:
        """Build every engine in its actor concurrently; keep each actor's info on its proxy."""
        sys_ = self.system
        proxies: list[Any] = [sys_.trainer, *sys_.standalone, *sys_.hybrid]
        done = 0

        async def start(proxy: Any) -> ActorInfo:
            nonlocal done
            info: ActorInfo = await proxy._call("start")
            done += 1
            if on_started is not None:
                on_started(done, len(proxies))
            return info

        try:
            infos: list[ActorInfo] = await asyncio.wait_for(
                asyncio.gather(*(start(p) for p in proxies)), self.config.start_timeout_s
            )
        except TimeoutError:
            raise BackendTimeoutError(
                f"engines not started after ray.start_timeout_s={self.config.start_timeout_s:.0f}s; "
                "raise it or check the actor logs (ray.log_to_driver: true)"
            ) from None
        for proxy, info in zip(proxies, infos, strict=True):
            proxy._info = info

    def spawn(self, cls: type, *args: Any, node_id: str | None = None, **options: Any) -> Any:
        """Start an extra actor of ``cls`` (e.g. the coordinator), pinned to ``node_id`` when given.

        The affinity is hard: Ray's soft affinity lets a zero-resource actor drift to any node,
        and the node asked for here is the driver's, which is alive as long as the run is.
        """
        if node_id is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        options.setdefault("num_cpus", 0)
        options.setdefault("max_concurrency", 10_000)
        handle = remote_class(cls).options(**options).remote(*args)
        self._extra_actors.append(handle)
        return handle

    async def shutdown(self) -> list[str]:
        """Shut every engine down (each with a timeout), kill the actors, free the placement groups.

        Returns one line per engine that did not shut down cleanly (empty when all did).
        """
        ray = require_ray()
        if not ray.is_initialized():
            return []
        from ray.util.placement_group import remove_placement_group

        sys_ = self.system
        proxies: list[Any] = [*sys_.replicas, *([sys_.trainer] if sys_.trainer else [])]
        timeout = self.config.shutdown_timeout_s

        async def one(p: Any) -> str | None:
            try:
                await asyncio.wait_for(p.shutdown(), timeout)
                return None
            except BaseException as exc:
                p.kill()
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return f"{p!r}: {type(exc).__name__}: {exc}"

        problems = [m for m in await asyncio.gather(*(one(p) for p in proxies)) if m]
        for handle in self._extra_actors:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:
                pass
        for pg in sys_.placement_groups:
            try:
                remove_placement_group(pg)
            except Exception:
                pass
        self._extra_actors.clear()
        sys_.placement_groups.clear()
        return problems


def _spawn_replica(spec: SpawnSpec) -> RayReplica:
    """Create the ReplicaActor that ``spec`` describes (not started yet) and its proxy."""
    options = dict(spec.options)
    if spec.generation:
        options["name"] = f"{spec.name}-r{spec.generation}"
    rid, kind = spec.args[0], spec.args[1]
    proxy = RayReplica(rid, ReplicaKind(kind), remote_class(ReplicaActor).options(**options).remote(*spec.args))
    proxy.spawn = spec
    return proxy


async def respawn_replica(old: Replica) -> RayReplica:
    """The Ray backend's :data:`~dynres.runtime.protocols.ReplicaRestarter`: kill ``old``'s actor
    (a no-op when it is dead already) and start a new one from its spawn spec.

    The new actor asks for the same placement group bundle. Ray moves the bundles of a group whose
    node died to another node that has the resources, so a replica whose node was lost comes back
    there; until such a node exists, the start waits (and the controller's op timeout ends the
    attempt). The caller's event loop is never blocked: the start is awaited.
    """
    spec = getattr(old, "spawn", None)
    if not isinstance(spec, SpawnSpec):
        raise BackendError(f"{old!r} was not started by RayCluster, so it cannot be recreated; start it there")
    if isinstance(old, RayReplica):
        old.kill()
    new = _spawn_replica(dataclasses.replace(spec, generation=spec.generation + 1))
    try:
        new._info = await new._call("start")
    except BaseException:
        new.kill()  # half-started: give its bundle back before the next attempt
        raise
    return new


def driver_node_id() -> str:
    """Ray node id of this (driver) process."""
    return require_ray().get_runtime_context().get_node_id()
