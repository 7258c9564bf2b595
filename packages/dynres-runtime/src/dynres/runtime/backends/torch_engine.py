"""torch backend: a GRPO-style policy-gradient :class:`TrainEngine` on a HF causal LM.

One fit step (phase names from ``dynres.core.metrics.TRAIN_COMPUTE_PHASES``):

* ``reward``       score responses that arrive without rewards (``reward_fn(prompt, response)``);
* ``old_log_prob`` token log-probs of every response under the weights before the update
  (no grad), the denominator of the PPO ratio;
* ``adv``          group-normalised advantages: within one sample's ``n`` responses,
  ``(r - mean) / (std + eps)``, broadcast to each response token;
* ``update_actor`` ``ppo_epochs`` passes of the clipped surrogate
  ``-min(ratio * A, clip(ratio, 1-eps, 1+eps) * A)``, token-mean over the mini-batch, micro-batched
  gradient accumulation, gradient-norm clipping, one AdamW step per pass.

Memory hand-over (``offload``/``onload``): every parameter, gradient and optimizer-state tensor is
copied to a host copy (pinned when the source is on an accelerator) and its original storage is
resized to 0 bytes, so the device memory is released while the ``Parameter`` objects (and the
optimizer's references to them) stay the same; ``onload`` resizes the storages back and copies
the bytes in, which restores them bit-exact. On a CPU-only machine the "device" is host memory
too: the original storages are freed (``resident_bytes()`` drops to 0) but the copies live in
the same RAM.

With ``fsdp=True`` the model is wrapped with torch FSDP2 (``fully_shard``, one unit per decoder
layer plus the root) in an already initialised process group (gloo on CPU, NCCL on GPUs);
offload/onload then act on each rank's local shards and ``export_weights`` all-gathers full
tensors.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynres.core.errors import BackendError, ConfigError, MissingExtraError, did_you_mean
from dynres.core.loading import import_object
from dynres.runtime.backends.extras import RunningMean, require_module
from dynres.runtime.backends.train_state import load_torch_state, save_torch_state
from dynres.runtime.backends.weights import DEFAULT_BUCKET_BYTES, WeightBuckets, bucketize
from dynres.runtime.protocols import OperationCosts, TrainStepResult, WeightUpdate


def _torch():
    """Import torch or raise MissingExtraError naming the ``torch`` extra."""
    return require_module("torch", "torch")


RewardFn = Callable[[Sequence[int], Sequence[int]], float]
"""A verifiable reward: (prompt token ids, response token ids) -> reward."""


def resolve_reward_fn(reward_fn: RewardFn | str | None) -> RewardFn | None:
    """Return ``reward_fn`` itself, or import it from a ``"module:function"`` string."""
    if reward_fn is None or callable(reward_fn):
        return reward_fn
    fn = import_object(
        str(reward_fn),
        what="reward_fn",
        error=ConfigError,
        hint="e.g. 'dynres.runtime.realrun.tiny_task:parity_reward'",
    )
    if not callable(fn):
        raise ConfigError(f"reward_fn {reward_fn!r} is not callable")
    return fn


def own_parameter_storage(model: Any) -> None:
    """Give every parameter a private, resizable storage (offload frees storages by resizing them).

    Weights loaded from safetensors can stay memory-mapped from the file, and a mapped storage
    cannot be resized, so the first offload before a hybrid activation would fail.
    """
    torch = _torch()
    with torch.no_grad():
        for p in model.parameters():
            if not _resizable(p):
                p.data = p.data.clone()


def _resizable(t: Any) -> bool:
    try:
        storage = t.untyped_storage()
        storage.resize_(storage.nbytes())
    except RuntimeError:
        return False
    return True


def offloadable_tensors(model: Any, optimizer: Any = None) -> list[Any]:
    """Tensors that hold a trainer's memory, one per storage: params (local shards), grads, optimizer state.

    Understands FSDP2 DTensor parameters (their local shard), Megatron's ``main_grad`` buffers and
    optimizers that wrap a torch optimizer in ``.optimizer`` (Megatron's ``MegatronOptimizer``).
    """
    torch = _torch()
    seen: set[int] = set()
    out: list[Any] = []

    def add(t: Any) -> None:
        if t is None or not torch.is_tensor(t):
            return
        if isinstance(t, torch.nn.Parameter):
            t = t.data
        if hasattr(t, "to_local"):
            # FSDP2 parameters are DTensors: the memory lives in the local shard.
            t = t.to_local()
        # Deduplicate by storage (tied weights, views into one buffer): _cdata names the StorageImpl.
        key = t.untyped_storage()._cdata
        if key not in seen:
            seen.add(key)
            out.append(t)

    for p in model.parameters():
        add(p)
        add(p.grad)
        add(getattr(p, "main_grad", None))
    opt = optimizer
    while opt is not None:
        for state in getattr(opt, "state", {}).values():
            if isinstance(state, Mapping):
                for v in state.values():
                    add(v)
        inner = getattr(opt, "optimizer", None)
        opt = inner if inner is not opt else None
    return out


class TensorOffloader:
    """Frees the storages of a set of tensors into host copies and restores them bit-exact.

    The tensors (and every view, ``Parameter`` or optimizer reference to them) stay the same
    Python objects: only their storage is resized to 0 bytes and back, so nothing that holds a
    reference needs rebuilding after :meth:`onload`.
    """

    def __init__(self) -> None:
        """Start with nothing offloaded."""
        self._saved: list[tuple[Any, Any]] | None = None

    @property
    def offloaded(self) -> bool:
        """True between offload and onload."""
        return self._saved is not None

    @staticmethod
    def resident_bytes(tensors: Sequence[Any]) -> int:
        """Bytes held by the storages of ``tensors`` (bytes)."""
        return sum(t.untyped_storage().nbytes() for t in tensors)

    @staticmethod
    def _bytes_view(t: Any) -> Any:
        """A uint8 tensor over the whole storage of ``t`` (same memory)."""
        torch = _torch()
        st = t.untyped_storage()
        return torch.empty(0, dtype=torch.uint8, device=st.device).set_(st)

    def offload(self, tensors: Sequence[Any]) -> int:
        """Copy each storage to host (pinned when on an accelerator), then free it; return bytes freed."""
        torch = _torch()
        if self._saved is not None:
            return 0
        saved = []
        freed = 0
        for t in tensors:
            # Raw bytes of the whole storage: the restore is bit-exact whatever dtype, offset or stride.
            src = self._bytes_view(t)
            pin = src.device.type != "cpu" and torch.cuda.is_available()
            host = torch.empty(src.numel(), dtype=torch.uint8, pin_memory=pin)
            host.copy_(src)
            freed += src.numel()
            saved.append((t, host))
        # Free only once every copy succeeded, so a failure part-way loses nothing.
        for t, _ in saved:
            t.untyped_storage().resize_(0)
        self._saved = saved
        return freed

    def onload(self) -> int:
        """Reallocate each freed storage and copy the host bytes back; return bytes restored."""
        if self._saved is None:
            return 0
        restored = 0
        for t, host in self._saved:
            t.untyped_storage().resize_(host.numel())
            self._bytes_view(t).copy_(host)
            restored += host.numel()
        self._saved = None
        return restored

    def discard(self) -> None:
        """Forget the host copies (the offloaded tensors stay empty)."""
        self._saved = None


@dataclass(frozen=True)
class TrainSample:
    """One prompt group: a prompt and its ``n`` responses (the unit of group normalisation)."""

    prompt_token_ids: Sequence[int]
    """Token ids of the prompt the responses continue (count: prompt length)."""
    responses: Sequence[Any]
    """Responses: ``GenerationResult``-like objects (``.token_ids``) or plain token sequences."""
    rewards: Sequence[float] | None = None
    """One reward per response; None = computed by the engine's ``reward_fn``."""
    sample_id: str = ""
    """Id of the sample (for logs)."""


@dataclass(frozen=True)
class TorchTrainConfig:
    """Hyper-parameters and placement of :class:`TorchTrainEngine`."""

    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    clip_eps: float = 0.2
    """PPO ratio clip range (ratio kept within [1 - eps, 1 + eps])."""
    ppo_epochs: int = 1
    """Optimizer steps per fit step (each a full pass over the batch)."""
    micro_batch_size: int = 8
    """Sequences per forward/backward (gradient accumulation across micro-batches)."""
    max_grad_norm: float | None = 1.0
    """Gradient-norm clip (None = off)."""
    adv_eps: float = 1e-6
    """Added to the group std before dividing (avoids 0/0 on uniform rewards)."""
    recompute_old_log_prob: bool = True
    """Compute old log-probs with the trainer's weights (True) or trust the rollout's (False)."""
    device: str = "cpu"
    """Torch device of the model ("cpu", "cuda", "cuda:1", ...)."""
    dtype: str = "float32"
    """dtype the parameters are kept and trained in ("float32", "bfloat16")."""
    export_bucket_bytes: int = DEFAULT_BUCKET_BYTES
    """Upper bound of one exported weight bucket (bytes)."""
    export_dtype: str | None = None
    """Cast exported weights to this dtype (None = as trained)."""
    fsdp: bool = False
    """Shard the model with torch FSDP2 in the current (initialised) process group."""
    seed: int = 0
    """Torch seed set at construction."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Free-form settings for subclasses."""


@dataclass
class PreparedBatch:
    """Padded tensors of one fit step: token ids, masks, advantages and old log-probs."""

    input_ids: Any
    """[B, T] token ids (right-padded with 0)."""
    attention_mask: Any
    """[B, T] 1 for real tokens."""
    loss_mask: Any
    """[B, T-1] 1 where position t+1 is a response token (the positions that are trained)."""
    advantages: Any
    """[B] advantage of each sequence (group-normalised reward)."""
    old_log_probs: Any
    """[B, T-1] token log-probs before the update (0 where loss_mask is 0)."""
    rewards: list[float]
    """[B] reward of each sequence, before group normalisation."""
    rollout_gap: float | None = None
    """Mean |trainer - rollout| log-prob per response token (nats); None without rollout log-probs."""


def _tokens_of(resp: Any) -> list[int]:
    """Token ids of a response given as a GenerationResult-like object or a sequence."""
    ids = getattr(resp, "token_ids", resp)
    return [int(t) for t in ids]


def _field(obj: Any, name: str, default: Any = None) -> Any:
    """Attribute or mapping key ``name`` of a duck-typed sample."""
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


_Group = tuple[list[int], list[list[int]], list[float], list[Any]]
"""One sample being prepared: prompt tokens, each response's tokens, their rewards, the responses."""


class TorchTrainEngine:
    """A :class:`TrainEngine` that trains a HF causal LM with a GRPO-style clipped policy gradient."""

    def __init__(
        self, model: Any, config: TorchTrainConfig | None = None, reward_fn: RewardFn | str | None = None
    ) -> None:
        """Take ownership of ``model`` (a HF ``PreTrainedModel``), place it, build AdamW."""
        torch = _torch()
        self.torch = torch
        self.config = config or TorchTrainConfig()
        self.reward_fn = resolve_reward_fn(reward_fn)
        torch.manual_seed(self.config.seed)
        self.device = torch.device(self.config.device)
        self.model = model.to(device=self.device, dtype=getattr(torch, self.config.dtype))
        self.model.train()
        if self.config.fsdp:
            self._shard()
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=self.config.lr,
            weight_decay=self.config.weight_decay,
        )
        self.version = 0
        self._offloader = TensorOffloader()
        self._export_names: list[str] | None = None
        self._lock = asyncio.Lock()
        self._avg = {op: RunningMean() for op in ("offload", "onload", "export_weights")}

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        config: TorchTrainConfig | None = None,
        reward_fn: RewardFn | str | None = None,
        **config_fields: Any,
    ) -> TorchTrainEngine:
        """Load a HF causal LM from local directory ``path`` and wrap it.

        ``config_fields`` override fields of ``config`` (e.g. ``lr=1e-4, seed=1``); ``reward_fn``
        may be a callable or a ``"module:function"`` string.
        """
        torch = _torch()
        try:
            from transformers import AutoModelForCausalLM
        except ImportError as exc:
            raise MissingExtraError("transformers", "torch") from exc
        cfg = config or TorchTrainConfig()
        if config_fields:
            known = {f.name for f in dataclasses.fields(TorchTrainConfig)}
            unknown = sorted(set(config_fields) - known)
            if unknown:
                raise ConfigError(
                    f"unknown TorchTrainConfig field(s) {unknown}{did_you_mean(unknown[0], known)}; "
                    f"valid fields: {sorted(known)}"
                )
            cfg = dataclasses.replace(cfg, **config_fields)
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, cfg.dtype))
        except (OSError, ValueError) as exc:
            raise BackendError(
                f"could not load a causal LM from {path!r}: {exc}; pass a local HF model directory"
            ) from exc
        own_parameter_storage(model)
        return cls(model, cfg, resolve_reward_fn(reward_fn))

    # ------------------------------------------------------------------ FSDP2
    def _shard(self) -> None:
        """Wrap decoder layers and the root with FSDP2 ``fully_shard`` (needs an initialised group)."""
        torch = self.torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise BackendError(
                "TorchTrainConfig.fsdp=True needs torch.distributed initialised first: "
                "call torch.distributed.init_process_group('gloo' or 'nccl') before building the engine"
            )
        from torch.distributed.fsdp import fully_shard

        layers = getattr(getattr(self.model, "model", self.model), "layers", None)
        for layer in layers or []:
            fully_shard(layer)
        fully_shard(self.model)
        del torch

    # ------------------------------------------------------------------ batch preparation
    def _compute_rewards(self, prompt: Sequence[int], responses: Sequence[list[int]]) -> list[float]:
        """Rewards of one group via ``reward_fn`` (raises when none is configured)."""
        if self.reward_fn is None:
            raise BackendError(
                "a sample has no rewards and TorchTrainEngine has no reward_fn; "
                "pass reward_fn=... or fill TrainSample.rewards"
            )
        return [float(self.reward_fn(prompt, r)) for r in responses]

    def prepare(self, batch: Sequence[Any], phase_times: dict[str, float] | None = None) -> PreparedBatch:
        """Rewards, padding, old log-probs and group-normalised advantages for ``batch`` (sync).

        ``phase_times`` receives the seconds of the ``reward``, ``adv`` and ``old_log_prob`` phases.
        """
        times = phase_times if phase_times is not None else {}
        t0 = time.perf_counter()
        groups = [self._group(sample) for sample in batch]
        times["reward"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        advs = self._advantages(groups)
        times["adv"] = time.perf_counter() - t0
        prepared = self._padded(groups, advs)
        t0 = time.perf_counter()
        prepared.old_log_probs = self._old_log_probs(prepared, groups)
        times["old_log_prob"] = time.perf_counter() - t0
        return prepared

    def _group(self, sample: Any) -> _Group:
        """One sample as (prompt, response tokens, rewards, responses); rewards from ``reward_fn`` if absent."""
        prompt_ids = _field(sample, "prompt_token_ids")
        if prompt_ids is None and _field(sample, "group") is not None:
            # dynres.runtime.samples.Sample keeps the prompt on its PromptGroup.
            prompt_ids = _field(_field(sample, "group"), "prompt_token_ids")
        if prompt_ids is None:
            raise BackendError(
                f"batch item {type(sample).__name__} has no prompt_token_ids (nor "
                ".group.prompt_token_ids); pass TrainSample or runtime Sample objects"
            )
        prompt = [int(t) for t in prompt_ids]
        resps = list(_field(sample, "responses"))
        toks = [_tokens_of(r) for r in resps]
        rewards = _field(sample, "rewards")
        rewards = list(map(float, rewards)) if rewards is not None else self._compute_rewards(prompt, toks)
        if len(rewards) != len(toks):
            raise BackendError(
                f"sample {_field(sample, 'sample_id', '')!r} has {len(toks)} responses "
                f"but {len(rewards)} rewards; give one reward per response"
            )
        return prompt, toks, rewards, resps

    def _advantages(self, groups: Sequence[_Group]) -> list[float]:
        """One advantage per response, normalised within its group (GRPO: only relative quality matters)."""
        advs: list[float] = []
        for _, _, rewards, _ in groups:
            m = sum(rewards) / len(rewards)
            sd = math.sqrt(sum((r - m) ** 2 for r in rewards) / len(rewards)) if len(rewards) > 1 else 0.0
            advs.extend((r - m) / (sd + self.config.adv_eps) for r in rewards)
        return advs

    def _padded(self, groups: Sequence[_Group], advs: list[float]) -> PreparedBatch:
        """Prompt + response of every response as right-padded rows, with the response-token mask."""
        torch = self.torch
        seqs = [(p, r) for p, toks, _, _ in groups for r in toks]
        if not seqs:
            raise BackendError("train_step got an empty batch; wait for at least one sample")
        width = max(len(p) + len(r) for p, r in seqs)
        n = len(seqs)
        input_ids = torch.zeros((n, width), dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        loss_mask = torch.zeros((n, width - 1), dtype=torch.float32)
        for i, (p, r) in enumerate(seqs):
            ids = p + r
            input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attn[i, : len(ids)] = 1
            # Position t predicts token t+1: response tokens are predicted from len(p)-1 on.
            loss_mask[i, len(p) - 1 : len(ids) - 1] = 1.0
        return PreparedBatch(
            input_ids=input_ids.to(self.device),
            attention_mask=attn.to(self.device),
            loss_mask=loss_mask.to(self.device),
            advantages=torch.tensor(advs, device=self.device),
            old_log_probs=None,
            rewards=[r for _, _, rewards, _ in groups for r in rewards],
        )

    def _old_log_probs(self, prepared: PreparedBatch, groups: Sequence[_Group]) -> Any:
        """[rows, T-1] response-token log-probs before the update: recomputed, or the rollout's own."""
        rollout = self._rollout_log_probs(prepared, groups)
        if self.config.recompute_old_log_prob:
            with self.torch.no_grad():
                old = self._token_log_probs(prepared, range(prepared.input_ids.shape[0])).detach()
            if rollout is not None:
                # Staleness (how far the policy moved since sampling) plus any engine mismatch.
                gap = ((old - rollout).abs() * prepared.loss_mask).sum() / prepared.loss_mask.sum().clamp_min(1.0)
                prepared.rollout_gap = float(gap)
            return old
        if rollout is None:
            msg = "recompute_old_log_prob=False needs rollout log-probs for every response token"
            raise BackendError(msg + "; enable recompute_old_log_prob")
        return rollout

    def _rollout_log_probs(self, prepared: PreparedBatch, groups: Sequence[_Group]) -> Any | None:
        """[rows, T-1] the rollout's log-probs of the response tokens; None unless every response has them."""
        torch = self.torch
        old = torch.zeros((prepared.input_ids.shape[0], prepared.input_ids.shape[1] - 1), dtype=torch.float32)
        rows = ((p, t, r) for p, toks, _, resps in groups for t, r in zip(toks, resps, strict=False))
        for i, (p, toks_r, resp) in enumerate(rows):
            lps = list(getattr(resp, "logprobs", ()) or ())
            if len(lps) != len(toks_r):
                return None
            old[i, len(p) - 1 : len(p) - 1 + len(toks_r)] = torch.tensor(lps, dtype=torch.float32)
        return old.to(self.device)

    def _token_log_probs(self, pb: PreparedBatch, rows: Sequence[int] | range) -> Any:
        """[len(rows), T-1] log-prob of each next token under the current weights (micro-batched)."""
        torch = self.torch
        rows = list(rows)
        out = []
        mbs = max(1, self.config.micro_batch_size)
        for s in range(0, len(rows), mbs):
            idx = rows[s : s + mbs]
            ids = pb.input_ids[idx]
            logits = self.model(input_ids=ids, attention_mask=pb.attention_mask[idx]).logits[:, :-1].float()
            lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            out.append(lp * pb.loss_mask[idx])
        return torch.cat(out, dim=0)

    def _surrogate(self, pb: PreparedBatch, idx: Sequence[int], denom: float) -> tuple[Any, Any]:
        """Clipped surrogate loss of rows ``idx`` (sum over tokens / ``denom``) and its clip count."""
        torch = self.torch
        new_lp = self._token_log_probs(pb, idx)
        mask = pb.loss_mask[idx]
        ratio = torch.exp((new_lp - pb.old_log_probs[idx]) * mask)
        adv = pb.advantages[idx].unsqueeze(-1)
        eps = self.config.clip_eps
        unclipped = ratio * adv
        clipped = torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * adv
        loss = -(torch.minimum(unclipped, clipped) * mask).sum() / denom
        clip_count = ((unclipped > clipped).float() * mask).sum()
        return loss, clip_count

    def loss_on(self, pb: PreparedBatch) -> float:
        """Surrogate loss of a prepared batch under the current weights (token mean; no update)."""
        torch = self.torch
        with torch.no_grad():
            denom = float(pb.loss_mask.sum().clamp_min(1.0))
            loss, _ = self._surrogate(pb, list(range(pb.input_ids.shape[0])), denom)
        return float(loss)

    # ------------------------------------------------------------------ fit step
    def train_step_sync(self, batch: Sequence[Any]) -> TrainStepResult:
        """One fit step, blocking (the async :meth:`train_step` runs it in a thread)."""
        torch = self.torch
        if self._offloader.offloaded:
            raise BackendError("train_step called while the trainer is offloaded; await onload() first")
        # Compute timings are wall-clock seconds of real work in this worker thread (never run under
        # the simulator's virtual clock).
        times: dict[str, float] = {}
        pb = self.prepare(batch, times)
        t0 = time.perf_counter()
        n = pb.input_ids.shape[0]
        denom = float(pb.loss_mask.sum().clamp_min(1.0))
        mbs = max(1, self.config.micro_batch_size)
        losses, clips, norms = [], 0.0, []
        for _ in range(max(1, self.config.ppo_epochs)):
            self.optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for s in range(0, n, mbs):
                idx = list(range(s, min(n, s + mbs)))
                loss, clip_count = self._surrogate(pb, idx, denom)
                loss.backward()
                total += float(loss.detach())
                clips += float(clip_count)
            if self.config.max_grad_norm is not None:
                norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)))
            self.optimizer.step()
            losses.append(total)
        self.optimizer.zero_grad(set_to_none=True)
        times["update_actor"] = time.perf_counter() - t0
        self.version += 1
        n_tokens = float(pb.loss_mask.sum())
        metrics = {
            "loss": losses[0],
            "reward/mean": sum(pb.rewards) / len(pb.rewards),
            "pg_clipfrac": clips / max(1.0, n_tokens * max(1, self.config.ppo_epochs)),
            "response_length/mean": n_tokens / n,
        }
        if norms:
            metrics["grad_norm"] = norms[0]
        if pb.rollout_gap is not None:
            metrics["rollout_logprob_gap"] = pb.rollout_gap
        return TrainStepResult(phase_times=times, metrics=metrics)

    async def train_step(self, batch: Sequence[Any]) -> TrainStepResult:
        """Run one fit step on a batch of samples in a worker thread; report per-phase times (s)."""
        async with self._lock:
            return await asyncio.to_thread(self.train_step_sync, batch)

    # ------------------------------------------------------------------ memory hand-over
    def _tensors(self) -> list[Any]:
        """Every tensor offload moves: parameters (local shards), their grads, optimizer state."""
        return offloadable_tensors(self.model, self.optimizer)

    def resident_bytes(self) -> int:
        """Bytes held by the storages of parameters, grads and optimizer state (0 after offload)."""
        return self._offloader.resident_bytes(self._tensors())

    def offload_sync(self) -> int:
        """Copy every tensor to host and free its storage; return the bytes freed (blocking)."""
        if self._offloader.offloaded:
            return 0
        self.optimizer.zero_grad(set_to_none=True)
        return self._offloader.offload(self._tensors())

    def onload_sync(self) -> int:
        """Reallocate every freed storage and copy the host bytes back; return bytes restored."""
        return self._offloader.onload()

    async def offload(self) -> None:
        """Free parameter, gradient and optimizer-state memory (host copies kept for onload)."""
        async with self._lock:
            t0 = asyncio.get_running_loop().time()
            await asyncio.to_thread(self.offload_sync)
            self._avg["offload"].add(asyncio.get_running_loop().time() - t0)

    async def onload(self) -> None:
        """Restore what :meth:`offload` freed, bit-exact."""
        async with self._lock:
            t0 = asyncio.get_running_loop().time()
            await asyncio.to_thread(self.onload_sync)
            self._avg["onload"].add(asyncio.get_running_loop().time() - t0)

    @property
    def offloaded(self) -> bool:
        """True between offload and onload."""
        return self._offloader.offloaded

    # ------------------------------------------------------------------ weight export
    def named_weights(self) -> Iterator[tuple[str, Any]]:
        """``(HF name, full tensor)`` of every weight to ship to the replicas (all-gathers under FSDP)."""
        torch = self.torch
        dtype = getattr(torch, self.config.export_dtype) if self.config.export_dtype else None
        for name, t in self.model.state_dict().items():
            if hasattr(t, "full_tensor"):
                t = t.full_tensor()
            yield name, (t.to(dtype) if dtype is not None else t)

    def export_weights_sync(self) -> WeightUpdate:
        """Copy the weights into bounded CPU buckets (blocking); onloads temporarily if offloaded."""
        was_offloaded = self._offloader.offloaded
        if was_offloaded:
            # Exporting from the host copies would need their dtype/shape bookkeeping; a temporary
            # onload is simpler and on the device path costs one extra host->device copy.
            self.onload_sync()
        try:
            buckets = bucketize(self.named_weights(), self.config.export_bucket_bytes)
        finally:
            if was_offloaded:
                self.offload_sync()
        return WeightUpdate(version=self.version, payload=buckets, nbytes=buckets.nbytes)

    async def export_weights(self) -> WeightUpdate:
        """Export the current weights as :class:`WeightBuckets` (bucket size bounded in bytes)."""
        async with self._lock:
            t0 = asyncio.get_running_loop().time()
            upd = await asyncio.to_thread(self.export_weights_sync)
            self._avg["export_weights"].add(asyncio.get_running_loop().time() - t0)
            return upd

    # ------------------------------------------------------------------ checkpoint
    def _state_op(self, op: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the whole, onloaded model (onloaded for the call when offloaded)."""
        if self.config.fsdp:
            raise BackendError(f"TorchTrainEngine.{op} does not support fsdp=True yet; checkpoint without FSDP")
        was_offloaded = self._offloader.offloaded
        if was_offloaded:
            self.onload_sync()
        try:
            return fn()
        finally:
            if was_offloaded:
                self.offload_sync()

    async def save_state(self, path: str) -> None:
        """Write weights, AdamW state and the step counter into folder ``path``."""
        async with self._lock:
            await asyncio.to_thread(
                self._state_op,
                "save_state",
                lambda: save_torch_state(
                    self.torch,
                    path,
                    model_state=self.model.state_dict(),
                    optimizer=self.optimizer,
                    counters={"version": self.version},
                ),
            )

    async def load_state(self, path: str) -> None:
        """Load what :meth:`save_state` wrote (same model shape); BackendError otherwise."""
        async with self._lock:
            fn = functools.partial(load_torch_state, self.torch, path, model=self.model, optimizer=self.optimizer)
            counters = await asyncio.to_thread(self._state_op, "load_state", fn)
            self.version = counters.get("version", self.version)

    def costs(self) -> OperationCosts:
        """Measured mean offload / onload / export durations (seconds; None before the first)."""
        return OperationCosts(
            offload_s=self._avg["offload"].mean,
            onload_s=self._avg["onload"].mean,
            export_weights_s=self._avg["export_weights"].mean,
        )

    async def shutdown(self) -> None:
        """Drop the model, optimizer and any host copies."""
        self._offloader.discard()
        self.optimizer = None
        self.model = None


__all__ = [
    "PreparedBatch",
    "TensorOffloader",
    "TorchTrainConfig",
    "TorchTrainEngine",
    "TrainSample",
    "WeightBuckets",
    "offloadable_tensors",
    "resolve_reward_fn",
]
