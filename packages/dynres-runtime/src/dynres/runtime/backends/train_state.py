"""A torch train engine's state on disk: weights, optimizer state and counters, in one file.

The torch and Megatron engines save what a resumed run needs to go on as if it had never
stopped: every weight, the optimizer's state (AdamW's moments and step counts: without them the
first steps after a resume take a different size), and the engine's own counters. One file per
checkpoint folder, written by ``torch.save`` and read back with ``weights_only=True``, so loading
a checkpoint never runs code from it. Whole-file atomicity is the checkpoint folder's (see
:class:`~dynres.runtime.loop.checkpoint.CheckpointStore`): the file is written into a folder
that is renamed into place only once complete.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dynres.core.errors import BackendError

TRAIN_STATE_FILE = "train_state.pt"
"""The file a torch engine's ``save_state`` writes into its checkpoint folder."""


def save_torch_state(
    torch: Any, path: str | Path, *, model_state: Mapping[str, Any], optimizer: Any, counters: Mapping[str, int]
) -> None:
    """Write ``model_state`` (name -> tensor), ``optimizer``'s state (None: none) and ``counters``."""
    state = {
        "model": {k: v for k, v in model_state.items() if torch.is_tensor(v)},
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "counters": {k: int(v) for k, v in counters.items()},
    }
    torch.save(state, Path(path) / TRAIN_STATE_FILE)


def load_torch_state(torch: Any, path: str | Path, *, model: Any, optimizer: Any) -> dict[str, int]:
    """Load what :func:`save_torch_state` wrote into ``model`` (every parameter and buffer it saved,
    shapes checked) and ``optimizer``; return the counters. BackendError names what does not fit."""
    file = Path(path) / TRAIN_STATE_FILE
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError) as exc:
        raise BackendError(f"cannot read the train state {file}: {exc}; resume from a complete checkpoint") from exc
    saved = state["model"]
    own = {k: v for k, v in model.state_dict().items() if torch.is_tensor(v)}
    missing, extra = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    shapes = [k for k in set(own) & set(saved) if tuple(own[k].shape) != tuple(saved[k].shape)]
    if missing or extra or shapes:
        raise BackendError(
            f"the train state in {file} does not fit this model (missing {missing[:3]}, unexpected {extra[:3]}, "
            f"other shapes {sorted(shapes)[:3]}); resume with the model the run was started with"
        )
    with torch.no_grad():
        for name, tensor in own.items():
            tensor.copy_(saved[name])
    if optimizer is not None:
        if state["optimizer"] is None:
            raise BackendError(f"the train state in {file} has no optimizer state; it was saved without an optimizer")
        try:
            # torch.load's storages cannot be resized, and an optimizer keeps the tensors it is
            # given when their device and dtype fit: give it copies, which offload can free.
            optimizer.load_state_dict(_owned(torch, state["optimizer"]))
        except (ValueError, KeyError, RuntimeError) as exc:
            raise BackendError(f"the optimizer state in {file} does not fit this optimizer: {exc}") from exc
    return {str(k): int(v) for k, v in state["counters"].items()}


def _owned(torch: Any, value: Any) -> Any:
    """``value`` with every tensor inside replaced by a copy that owns its (resizable) storage."""
    if torch.is_tensor(value):
        return value.clone()
    if isinstance(value, dict):
        return {k: _owned(torch, v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_owned(torch, v) for v in value)
    return value
