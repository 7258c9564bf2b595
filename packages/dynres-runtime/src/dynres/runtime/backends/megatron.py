"""Megatron-core backend: trainer-side offload/onload and HF-layout weight export of a ``GPTModel``.

Megatron keeps a decoder layer's weights in fused tensors that HF Qwen2/Llama checkpoints (and
vLLM's loaders) keep apart. The mapping used by :func:`megatron_to_hf`:

==================================================  ==============================================
Megatron-core ``GPTModel``                          HF Qwen2 / Llama
==================================================  ==============================================
``embedding.word_embeddings.weight``                ``model.embed_tokens.weight``
``decoder.layers.i.input_layernorm.weight`` or      ``model.layers.i.input_layernorm.weight``
``...self_attention.linear_qkv.layer_norm_weight``
``...self_attention.linear_qkv.{weight,bias}``      ``...self_attn.{q,k,v}_proj.{weight,bias}``
``...self_attention.linear_proj.weight``            ``...self_attn.o_proj.weight``
``...self_attention.{q,k}_layernorm.weight``        ``...self_attn.{q,k}_norm.weight`` (Qwen3)
``decoder.layers.i.pre_mlp_layernorm.weight`` or    ``model.layers.i.post_attention_layernorm.weight``
``...mlp.linear_fc1.layer_norm_weight``
``...mlp.linear_fc1.weight`` (gated)                ``...mlp.gate_proj.weight`` + ``up_proj.weight``
``...mlp.linear_fc2.weight``                        ``...mlp.down_proj.weight``
``decoder.final_layernorm.weight``                  ``model.norm.weight``
``output_layer.weight``                             ``lm_head.weight`` (absent when tied)
==================================================  ==============================================

The fused QKV is grouped by key/value head: for each of the ``G`` query groups it holds that
group's ``H/G`` query heads, then its key head, then its value head (``head_dim`` rows each).
The gated fc1 is ``[gate; up]`` stacked on the output dimension.

Scope: export works on a single model-parallel rank holding the whole model (TP = PP = 1, any
data-parallel size). Megatron's forward, its optimizers and its checkpointing need CUDA; the
model itself builds on CPU with a gloo process group, which is what the CPU tests use.
``save_state``/``load_state`` (a run checkpoint) have the same scope: the whole model's tensors
and an optimizer whose ``state_dict`` holds all of its state (a torch optimizer, or a Megatron
optimizer that is not distributed); a sharded (distributed) optimizer needs Megatron's own
``dist_checkpointing`` and is refused with an error saying so.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynres.core.errors import BackendError
from dynres.runtime.backends.extras import require_module
from dynres.runtime.backends.torch_engine import TensorOffloader, offloadable_tensors
from dynres.runtime.backends.train_state import load_torch_state, save_torch_state
from dynres.runtime.backends.weights import DEFAULT_BUCKET_BYTES, bucketize
from dynres.runtime.protocols import (
    OperationCosts,
    TrainStepResult,
    WeightUpdate,
)


def _torch():
    """Import torch or raise MissingExtraError naming the ``megatron`` extra."""
    return require_module("torch", "megatron")


def import_megatron_core():
    """Import ``megatron.core`` or raise MissingExtraError naming the ``megatron`` extra."""
    return require_module("megatron.core", "megatron")


@dataclass(frozen=True)
class AttentionLayout:
    """Head geometry needed to split/fuse Megatron's QKV (counts)."""

    num_attention_heads: int
    """Query heads (count)."""
    num_query_groups: int
    """Key/value heads (count; = query heads without GQA)."""
    head_dim: int
    """Features per head (Megatron ``kv_channels``)."""

    @classmethod
    def from_megatron_config(cls, config: Any) -> AttentionLayout:
        """Read the layout from a Megatron ``TransformerConfig``."""
        heads = int(config.num_attention_heads)
        groups = int(config.num_query_groups or heads)
        head_dim = int(config.kv_channels or config.hidden_size // heads)
        return cls(heads, groups, head_dim)

    @classmethod
    def from_hf_config(cls, config: Any) -> AttentionLayout:
        """Read the layout from a HF Qwen2/Llama config."""
        heads = int(config.num_attention_heads)
        groups = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        return cls(heads, groups, head_dim)

    @property
    def heads_per_group(self) -> int:
        """Query heads sharing one key/value head (count)."""
        if self.num_attention_heads % self.num_query_groups:
            raise BackendError(
                f"{self.num_attention_heads} attention heads do not divide into "
                f"{self.num_query_groups} query groups; fix the model config"
            )
        return self.num_attention_heads // self.num_query_groups


def split_qkv(fused: Any, layout: AttentionLayout) -> tuple[Any, Any, Any]:
    """Split Megatron's grouped QKV weight ``[G*(H/G+2)*d, ...]`` (or bias) into HF q, k, v."""
    g, hpg, d = layout.num_query_groups, layout.heads_per_group, layout.head_dim
    rest = tuple(fused.shape[1:])
    grouped = fused.reshape(g, (hpg + 2) * d, *rest)
    q = grouped[:, : hpg * d].reshape(g * hpg * d, *rest)
    k = grouped[:, hpg * d : (hpg + 1) * d].reshape(g * d, *rest)
    v = grouped[:, (hpg + 1) * d :].reshape(g * d, *rest)
    return q.contiguous(), k.contiguous(), v.contiguous()


def fuse_qkv(q: Any, k: Any, v: Any, layout: AttentionLayout) -> Any:
    """Inverse of :func:`split_qkv`: HF q, k, v weight (or bias) -> Megatron's grouped layout."""
    torch = _torch()
    g, hpg, d = layout.num_query_groups, layout.heads_per_group, layout.head_dim
    rest = tuple(q.shape[1:])
    grouped = torch.cat([q.reshape(g, hpg * d, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)], dim=1)
    return grouped.reshape(g * (hpg + 2) * d, *rest).contiguous()


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")

# Per-layer one-to-one renames (Megatron suffix -> HF suffix).
_LAYER_RENAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.linear_proj.bias": "self_attn.o_proj.bias",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.linear_fc2.bias": "mlp.down_proj.bias",
}
_TOP_RENAMES = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}


def megatron_to_hf(
    state: Mapping[str, Any] | Iterable[tuple[str, Any]],
    layout: AttentionLayout,
    *,
    gated_mlp: bool = True,
    layer_offset: int = 0,
) -> Iterator[tuple[str, Any]]:
    """Yield ``(HF name, tensor)`` for a Megatron GPT state dict (``_extra_state`` entries skipped).

    ``layer_offset`` shifts layer numbers (for a pipeline stage that starts mid-model).
    """
    items = state.items() if isinstance(state, Mapping) else state
    for name, t in items:
        if name.endswith("_extra_state") or t is None:
            continue
        if name in _TOP_RENAMES:
            yield _TOP_RENAMES[name], t
            continue
        m = _LAYER.match(name)
        if m is None:
            raise BackendError(
                f"no HF name for Megatron parameter {name!r}; extend "
                "dynres.runtime.backends.megatron's mapping for this architecture"
            )
        layer, suffix = int(m.group(1)) + layer_offset, m.group(2)
        prefix = f"model.layers.{layer}."
        if suffix in _LAYER_RENAMES:
            yield prefix + _LAYER_RENAMES[suffix], t
        elif suffix in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
            kind = suffix.rsplit(".", 1)[1]
            q, k, v = split_qkv(t, layout)
            yield prefix + f"self_attn.q_proj.{kind}", q
            yield prefix + f"self_attn.k_proj.{kind}", k
            yield prefix + f"self_attn.v_proj.{kind}", v
        elif suffix == "mlp.linear_fc1.weight":
            if gated_mlp:
                gate, up = t.chunk(2, dim=0)
                yield prefix + "mlp.gate_proj.weight", gate.contiguous()
                yield prefix + "mlp.up_proj.weight", up.contiguous()
            else:
                yield prefix + "mlp.up_proj.weight", t
        else:
            raise BackendError(
                f"no HF name for Megatron parameter {name!r}; extend "
                "dynres.runtime.backends.megatron's mapping for this architecture"
            )


def hf_to_megatron(
    hf_state: Mapping[str, Any], layout: AttentionLayout, *, fused_layernorm: bool = False, gated_mlp: bool = True
) -> dict[str, Any]:
    """Megatron GPT state dict from a HF Qwen2/Llama state dict (inverse of :func:`megatron_to_hf`).

    ``fused_layernorm`` selects the Transformer-Engine names (norm weights inside linear_qkv/fc1).
    """
    out: dict[str, Any] = {}
    top = {v: k for k, v in _TOP_RENAMES.items()}
    ln_in = "self_attention.linear_qkv.layer_norm_weight" if fused_layernorm else "input_layernorm.weight"
    ln_mlp = "mlp.linear_fc1.layer_norm_weight" if fused_layernorm else "pre_mlp_layernorm.weight"
    per_layer = {
        "input_layernorm.weight": ln_in,
        "post_attention_layernorm.weight": ln_mlp,
        "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
        "self_attn.o_proj.bias": "self_attention.linear_proj.bias",
        "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
        "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
        "mlp.down_proj.weight": "mlp.linear_fc2.weight",
        "mlp.down_proj.bias": "mlp.linear_fc2.bias",
    }
    torch = _torch()
    layer_re = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
    for name, t in hf_state.items():
        if name in top:
            out[top[name]] = t
            continue
        m = layer_re.match(name)
        if m is None:
            raise BackendError(f"no Megatron name for HF parameter {name!r}")
        i, suffix = m.group(1), m.group(2)
        prefix = f"decoder.layers.{i}."
        if suffix in per_layer:
            out[prefix + per_layer[suffix]] = t
        elif suffix.startswith("self_attn.q_proj."):
            kind = suffix.rsplit(".", 1)[1]
            base = f"model.layers.{i}.self_attn."
            out[prefix + f"self_attention.linear_qkv.{kind}"] = fuse_qkv(
                hf_state[base + f"q_proj.{kind}"],
                hf_state[base + f"k_proj.{kind}"],
                hf_state[base + f"v_proj.{kind}"],
                layout,
            )
        elif suffix.startswith(("self_attn.k_proj.", "self_attn.v_proj.")):
            continue  # fused together with q_proj above
        elif suffix == "mlp.gate_proj.weight":
            out[prefix + "mlp.linear_fc1.weight"] = (
                torch.cat([t, hf_state[f"model.layers.{i}.mlp.up_proj.weight"]], dim=0) if gated_mlp else t
            )
        elif suffix == "mlp.up_proj.weight":
            if not gated_mlp:
                out[prefix + "mlp.linear_fc1.weight"] = t
        else:
            raise BackendError(f"no Megatron name for HF parameter {name!r}")
    return out


def unwrap_model(model: Any) -> Any:
    """Strip DDP/Float16 wrappers (``.module`` chains) off a Megatron model chunk."""
    while hasattr(model, "module"):
        model = model.module
    return model


class MegatronTrainEngine:
    """A :class:`TrainEngine` around a Megatron-core ``GPTModel``: offload/onload and HF export.

    The fit step itself is the caller's (``step_fn(model, optimizer, batch) -> TrainStepResult``,
    run in a worker thread): Megatron training loops (pipeline schedules, distributed optimizer)
    are project-specific, while memory hand-over and weight export are what dynres needs.
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any = None,
        *,
        step_fn: Callable[[Any, Any, Sequence[Any]], TrainStepResult] | None = None,
        export_bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        export_dtype: str | None = None,
        tie_word_embeddings: bool | None = None,
    ) -> None:
        """Wrap ``model`` (a GPTModel, possibly DDP-wrapped) and its optimizer (any or None)."""
        self.torch = _torch()
        self.model = model
        self.optimizer = optimizer
        self.step_fn = step_fn
        self.export_bucket_bytes = export_bucket_bytes
        self.export_dtype = export_dtype
        core = unwrap_model(model)
        self.layout = AttentionLayout.from_megatron_config(core.config)
        self.gated_mlp = bool(getattr(core.config, "gated_linear_unit", True))
        self.tie_word_embeddings = (
            bool(getattr(core, "share_embeddings_and_output_weights", False))
            if tie_word_embeddings is None
            else tie_word_embeddings
        )
        self.version = 0
        self._offloader = TensorOffloader()
        self._lock = asyncio.Lock()
        self._times: dict[str, list[float]] = {
            op: [] for op in ("offload", "onload", "export_weights", "save_state", "load_state")
        }

    # ------------------------------------------------------------------ fit step
    async def train_step(self, batch: Sequence[Any]) -> TrainStepResult:
        """Run ``step_fn`` in a worker thread and bump the weight version."""
        if self._offloader.offloaded:
            raise BackendError("train_step called while the trainer is offloaded; await onload() first")
        if self.step_fn is None:
            raise BackendError(
                "MegatronTrainEngine has no step_fn; pass step_fn=(model, optimizer, batch) -> "
                "TrainStepResult (Megatron's forward needs CUDA)"
            )
        async with self._lock:
            result = await asyncio.to_thread(self.step_fn, self.model, self.optimizer, batch)
            self.version += 1
            return result

    # ------------------------------------------------------------------ memory hand-over
    def _tensors(self) -> list[Any]:
        """Parameters, grads (``.grad`` and Megatron's ``main_grad``) and optimizer state, one per storage."""
        return offloadable_tensors(self.model, self.optimizer)

    def resident_bytes(self) -> int:
        """Bytes held by those storages (0 after offload)."""
        return self._offloader.resident_bytes(self._tensors())

    def offload_sync(self) -> int:
        """Free every storage into host copies; return bytes freed (blocking)."""
        return self._offloader.offload(self._tensors())

    def onload_sync(self) -> int:
        """Restore every storage bit-exact; return bytes restored (blocking)."""
        return self._offloader.onload()

    @property
    def offloaded(self) -> bool:
        """True between offload and onload."""
        return self._offloader.offloaded

    async def _run(self, op: str, fn: Callable[[], Any]) -> Any:
        """Run a blocking op in a thread under the engine lock and record its duration (seconds)."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            result = await asyncio.to_thread(fn)
            self._times[op].append(loop.time() - t0)
            return result

    async def offload(self) -> None:
        """Free parameter, gradient and optimizer-state memory (host copies kept)."""
        await self._run("offload", self.offload_sync)

    async def onload(self) -> None:
        """Restore what :meth:`offload` freed, bit-exact."""
        await self._run("onload", self.onload_sync)

    # ------------------------------------------------------------------ export
    def _check_single_model_parallel_rank(self) -> None:
        """Raise unless this rank holds the whole model (TP = PP = 1)."""
        try:
            from megatron.core import parallel_state as ps
        except ImportError:
            return
        if not ps.model_parallel_is_initialized():
            return
        tp, pp = ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()
        if tp != 1 or pp != 1:
            raise BackendError(
                f"Megatron export supports tensor/pipeline parallel size 1 only (got TP={tp}, "
                f"PP={pp}); gather the shards first or run export on a TP=PP=1 copy"
            )

    def hf_state(self) -> Iterator[tuple[str, Any]]:
        """``(HF name, tensor)`` of the model's current weights (no copy; see :meth:`export_weights`)."""
        torch = self.torch
        self._check_single_model_parallel_rank()
        core = unwrap_model(self.model)
        dtype = getattr(torch, self.export_dtype) if self.export_dtype else None
        state = ((n, t) for n, t in core.state_dict().items() if torch.is_tensor(t))
        for name, t in megatron_to_hf(state, self.layout, gated_mlp=self.gated_mlp):
            if self.tie_word_embeddings and name == "lm_head.weight":
                continue
            yield name, (t.to(dtype) if dtype is not None else t)

    def export_weights_sync(self) -> WeightUpdate:
        """HF-named weights in bounded CPU buckets (blocking; onloads temporarily if offloaded)."""
        was_offloaded = self._offloader.offloaded
        if was_offloaded:
            self._offloader.onload()
        try:
            buckets = bucketize(self.hf_state(), self.export_bucket_bytes)
        finally:
            if was_offloaded:
                self._offloader.offload(self._tensors())
        return WeightUpdate(version=self.version, payload=buckets, nbytes=buckets.nbytes)

    async def export_weights(self) -> WeightUpdate:
        """Export the weights in HF Qwen2/Llama layout as :class:`WeightBuckets`."""
        return await self._run("export_weights", self.export_weights_sync)

    def load_hf_state(self, hf_state: Mapping[str, Any]) -> None:
        """Copy HF-layout weights into the Megatron model in place (e.g. to start from a HF checkpoint)."""
        torch = self.torch
        core = unwrap_model(self.model)
        fused = any(k.endswith("linear_qkv.layer_norm_weight") for k in core.state_dict())
        mstate = hf_to_megatron(hf_state, self.layout, fused_layernorm=fused, gated_mlp=self.gated_mlp)
        if self.tie_word_embeddings:
            mstate.pop("output_layer.weight", None)
        params = dict(core.named_parameters())
        missing = [n for n in params if n not in mstate]
        if missing:
            raise BackendError(f"HF weights lack Megatron parameters {missing[:4]}...; check the model configs match")
        with torch.no_grad():
            for name, p in params.items():
                src = mstate[name]
                if tuple(src.shape) != tuple(p.shape):
                    raise BackendError(
                        f"shape mismatch for {name}: HF gives {tuple(src.shape)}, "
                        f"Megatron has {tuple(p.shape)}; check the model configs match"
                    )
                p.copy_(src)

    def _whole_state(self, op: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the onloaded model of a TP = PP = 1 rank with a whole-state optimizer."""
        self._check_single_model_parallel_rank()
        if self.optimizer is not None and "Distributed" in type(self.optimizer).__name__:
            raise BackendError(
                f"MegatronTrainEngine.{op}: {type(self.optimizer).__name__} shards its state across ranks; "
                "checkpoint it with megatron.core.dist_checkpointing, or use a non-distributed optimizer"
            )
        was_offloaded = self._offloader.offloaded
        if was_offloaded:
            self._offloader.onload()
        try:
            return fn()
        finally:
            if was_offloaded:
                self._offloader.offload(self._tensors())

    async def save_state(self, path: str) -> None:
        """Write the model's tensors, the optimizer's state and the version into folder ``path``."""

        def save() -> None:
            state = unwrap_model(self.model).state_dict()
            counters = {"version": self.version}
            save_torch_state(self.torch, path, model_state=state, optimizer=self.optimizer, counters=counters)

        await self._run("save_state", lambda: self._whole_state("save_state", save))

    async def load_state(self, path: str) -> None:
        """Load what :meth:`save_state` wrote (same model shape); BackendError otherwise."""
        core = unwrap_model(self.model)
        load = functools.partial(load_torch_state, self.torch, path, model=core, optimizer=self.optimizer)
        counters = await self._run("load_state", lambda: self._whole_state("load_state", load))
        self.version = counters.get("version", self.version)

    def costs(self) -> OperationCosts:
        """Measured mean offload / onload / export durations (seconds; None before the first)."""

        def mean(xs: list[float]) -> float | None:
            return sum(xs) / len(xs) if xs else None

        return OperationCosts(
            offload_s=mean(self._times["offload"]),
            onload_s=mean(self._times["onload"]),
            export_weights_s=mean(self._times["export_weights"]),
        )

    async def shutdown(self) -> None:
        """Drop host copies and references to the model and optimizer."""
        self._offloader.discard()
        self.model = None
        self.optimizer = None


def tiny_gpt_model(hf_config: Any, *, seed: int = 0) -> Any:
    """Build a Megatron ``GPTModel`` (local spec, CPU init) matching a HF Qwen2 config.

    Needs ``torch.distributed`` and Megatron's model-parallel state initialised (TP = PP = 1).
    """
    torch = _torch()
    import_megatron_core()
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    layout = AttentionLayout.from_hf_config(hf_config)
    cfg = TransformerConfig(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        num_attention_heads=layout.num_attention_heads,
        num_query_groups=layout.num_query_groups,
        kv_channels=layout.head_dim,
        ffn_hidden_size=hf_config.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=True,  # Qwen2 has q/k/v biases
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        perform_initialization=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPTModel(
            config=cfg,
            transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
            vocab_size=hf_config.vocab_size,
            max_sequence_length=hf_config.max_position_embeddings,
            position_embedding_type="rope",
            rotary_base=int(getattr(hf_config, "rope_theta", None) or 10000),
            share_embeddings_and_output_weights=bool(hf_config.tie_word_embeddings),
        )
    return model


__all__ = [
    "AttentionLayout",
    "MegatronTrainEngine",
    "fuse_qkv",
    "hf_to_megatron",
    "import_megatron_core",
    "megatron_to_hf",
    "split_qkv",
    "tiny_gpt_model",
    "unwrap_model",
]
