"""Throw-away Ray sessions for tests: a local Ray or a multi-node ``Cluster`` in a private temp dir.

Each session lives in its own short directory under ``/tmp`` (Unix socket paths are limited to
107 bytes) that is deleted afterwards, so parallel test runs never share or leave ``/tmp/ray``.

A helper of the runtime's tests (``from ray_sessions import local_ray``), not part of the
runtime: only tests start throw-away clusters, so the wheel does not ship it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dynres.runtime.backends.ray._ray import require_ray, use_loopback

FAST_FAILURE_DETECTION: dict[str, Any] = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 200,
    "health_check_failure_threshold": 3,
}
"""GCS settings that notice a removed node in about a second instead of Ray's default ~30 s."""


def _quiet_env() -> None:
    # Test clusters have no dashboard and no token: say so before Ray reads the environment.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Every node of a test session binds to 127.0.0.1: its traffic never leaves the machine.
    use_loopback()


@contextlib.contextmanager
def local_ray(num_cpus: int = 2, **init_kwargs: Any) -> Iterator[str]:
    """Start a single-node Ray in a private temp dir; yield that dir; shut down and delete it."""
    _quiet_env()
    ray = require_ray()
    tmp = tempfile.mkdtemp(prefix="dynres-ray-", dir="/tmp")
    try:
        ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=tmp, **init_kwargs)
        yield tmp
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def multi_node_cluster(
    head: Mapping[str, Any], workers: Sequence[Mapping[str, Any]]
) -> Iterator[tuple[Any, list[Any]]]:
    """Start a ``ray.cluster_utils.Cluster`` (head + workers on this machine), connect to it.

    ``head`` / each worker are ``add_node`` arguments (``num_cpus``, ``resources``, ...).
    Yields ``(cluster, worker_nodes)``; failure detection is fast so that a removed node is
    noticed within about a second.
    """
    _quiet_env()
    ray = require_ray()
    from ray.cluster_utils import Cluster

    tmp = tempfile.mkdtemp(prefix="dynres-rc-", dir="/tmp")
    head_args = {
        "include_dashboard": False,
        "temp_dir": tmp,
        "_system_config": dict(FAST_FAILURE_DETECTION),
        **head,
    }
    # Cluster.add_node records the head's address in Ray's default temp dir (/tmp/ray) whatever
    # temp_dir says, and fails when that folder is missing (a fresh machine, or an earlier cleanup).
    default_dir = Path(tempfile.gettempdir()) / "ray"
    created = not default_dir.exists()
    default_dir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(initialize_head=True, head_node_args=head_args)
    try:
        nodes = [cluster.add_node(**w) for w in workers]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
        if created:
            shutil.rmtree(default_dir, ignore_errors=True)
        else:
            (default_dir / "ray_current_cluster").unlink(missing_ok=True)
