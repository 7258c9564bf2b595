"""Weight export and transfer helpers shared by the trainer engines and the vLLM replica.

A trainer exports its weights as :class:`WeightBuckets`: HF-layout names mapped to contiguous CPU
tensors, cut into buckets of bounded size so that neither side ever holds a second full copy
of a large model in one piece. A replica loads a bucket by writing it as a safetensors file into
shared memory (``/dev/shm``) and asking its vLLM worker to read that file (see
``dynres.runtime.backends.vllm``). When many replicas on one node load the same update,
:func:`materialize` writes the files once and every replica reads the same paths.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynres.core.errors import BackendError
from dynres.runtime.backends.extras import require_module

DEFAULT_BUCKET_BYTES = 256 * 1024 * 1024
"""Default upper bound of one export bucket (bytes); a single larger tensor gets its own bucket."""


def _torch():
    """Import torch or raise MissingExtraError naming the ``torch`` extra."""
    return require_module("torch", "torch")


def _safetensors_torch():
    """Import safetensors.torch or raise MissingExtraError naming the ``torch`` extra."""
    return require_module("safetensors.torch", "torch")


def tensor_nbytes(t: Any) -> int:
    """Size of a tensor's data (bytes)."""
    return int(t.numel()) * int(t.element_size())


@dataclass(frozen=True)
class WeightBuckets:
    """Payload of a :class:`~dynres.runtime.protocols.WeightUpdate`: named tensors in buckets.

    Exactly one of ``buckets`` (in-memory CPU tensors) and ``files`` (safetensors files, one
    per bucket, readable by every replica on the node) is set.
    """

    buckets: tuple[Mapping[str, Any], ...] = ()
    """In-memory buckets: HF parameter name -> contiguous CPU tensor."""
    files: tuple[str, ...] = ()
    """Safetensors files (absolute paths), one per bucket; owned by whoever wrote them."""
    nbytes: int = 0
    """Total size of the tensors (bytes)."""
    names: tuple[str, ...] = field(default=())
    """Every parameter name in the update, in export order."""

    @property
    def num_buckets(self) -> int:
        """Number of buckets (count)."""
        return len(self.files) if self.files else len(self.buckets)

    def iter_tensors(self) -> Iterator[tuple[str, Any]]:
        """Yield ``(name, tensor)`` for every tensor, reading files bucket by bucket."""
        if self.files:
            st = _safetensors_torch()
            for path in self.files:
                yield from st.load_file(path).items()
        else:
            for bucket in self.buckets:
                yield from bucket.items()


def bucketize(named_tensors: Iterable[tuple[str, Any]], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> WeightBuckets:
    """Copy ``(name, tensor)`` pairs into contiguous CPU buckets of at most ``bucket_bytes`` (bytes).

    Each tensor is detached and copied (``clone`` on CPU, a device-to-host copy otherwise), so
    that the export stays valid after the trainer's next step or an offload.
    """
    if bucket_bytes <= 0:
        raise ValueError("bucket_bytes must be positive")
    buckets: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    current_bytes = 0
    names: list[str] = []
    total = 0
    for name, tensor in named_tensors:
        size = tensor_nbytes(tensor)
        if current and current_bytes + size > bucket_bytes:
            buckets.append(current)
            current, current_bytes = {}, 0
        t = tensor.detach()
        # clone() on CPU, .to("cpu") elsewhere: either way a private contiguous copy.
        t = t.clone() if t.device.type == "cpu" else t.to("cpu")
        current[name] = t.contiguous()
        current_bytes += size
        total += size
        names.append(name)
    if current:
        buckets.append(current)
    return WeightBuckets(buckets=tuple(buckets), nbytes=total, names=tuple(names))


def shm_dir() -> Path:
    """Directory for weight files: ``/dev/shm`` when it exists (RAM-backed), else the temp dir."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def write_bucket_files(
    buckets: Sequence[Mapping[str, Any]], directory: str | Path | None = None, prefix: str = "dynres-weights"
) -> list[str]:
    """Write each bucket as one safetensors file in a fresh directory; return the paths."""
    st = _safetensors_torch()
    base = Path(directory) if directory is not None else shm_dir()
    target = base / f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        target.mkdir(parents=True, exist_ok=False)
        paths = []
        for i, bucket in enumerate(buckets):
            path = target / f"bucket-{i:05d}.safetensors"
            st.save_file(dict(bucket), str(path))
            paths.append(str(path))
    except OSError as exc:
        raise BackendError(
            f"could not write weight bucket files under {base}: {exc}; "
            "free space in /dev/shm or pass another directory (weight_dir)"
        ) from exc
    return paths


def remove_bucket_files(paths: Sequence[str]) -> None:
    """Delete weight files written by :func:`write_bucket_files` and their directory (best effort)."""
    dirs = set()
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
        dirs.add(os.path.dirname(p))
    for d in dirs:
        try:
            os.rmdir(d)
        except OSError:
            pass


def materialize(buckets: WeightBuckets, directory: str | Path | None = None) -> WeightBuckets:
    """Return the same weights as files in ``directory`` (default /dev/shm), to share on one node.

    The caller owns the files and deletes them with ``remove_bucket_files(result.files)`` once
    every replica has loaded them.
    """
    if buckets.files:
        return buckets
    files = write_bucket_files(buckets.buckets, directory)
    return WeightBuckets(files=tuple(files), nbytes=buckets.nbytes, names=buckets.names)
