"""Megatron-core adapter: HF <-> Megatron name/layout mapping, offload/onload, export (CPU + gloo)."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dynres.core.errors import BackendError  # noqa: E402  # imported after importorskip: needs the extra
from dynres.runtime.backends.megatron import (  # noqa: E402  # imported after importorskip: needs the extra
    AttentionLayout,
    fuse_qkv,
    hf_to_megatron,
    megatron_to_hf,
    split_qkv,
)
from dynres.runtime.realrun.tiny_task import TinyModelSpec, build_tiny_model  # noqa: E402  # imported after importorskip: needs the extra

GQA = TinyModelSpec(hidden_size=128, num_attention_heads=4, num_key_value_heads=2)
"""4 query heads in 2 groups of head_dim 32: exercises the grouped QKV interleave."""


@pytest.mark.parametrize(
    "spec", [TinyModelSpec(), GQA, TinyModelSpec(num_key_value_heads=2)], ids=["gqa-2:1", "gqa-4:2", "mha"]
)
def test_hf_megatron_round_trip_is_bit_exact(spec):
    hf = build_tiny_model(spec, seed=3)
    layout = AttentionLayout.from_hf_config(hf.config)
    sd = hf.state_dict()
    for fused in (False, True):
        mstate = hf_to_megatron(sd, layout, fused_layernorm=fused)
        assert not any(k.startswith("model.") for k in mstate)
        back = dict(megatron_to_hf(mstate, layout))
        assert set(back) == set(sd)
        assert all(torch.equal(back[k], sd[k]) for k in sd)


def test_qkv_split_follows_megatron_grouping():
    # Label every row with (group, slot): Megatron stores per group [q heads..., k, v].
    layout = AttentionLayout(num_attention_heads=4, num_query_groups=2, head_dim=1)
    fused = torch.tensor([[0.0], [1.0], [2.0], [3.0], [10.0], [11.0], [12.0], [13.0]])
    q, k, v = split_qkv(fused, layout)
    assert q.flatten().tolist() == [0.0, 1.0, 10.0, 11.0]
    assert k.flatten().tolist() == [2.0, 12.0]
    assert v.flatten().tolist() == [3.0, 13.0]
    assert torch.equal(fuse_qkv(q, k, v, layout), fused)


def test_unknown_names_are_errors():
    layout = AttentionLayout(2, 1, 32)
    with pytest.raises(BackendError, match="no HF name"):
        list(megatron_to_hf({"decoder.layers.0.mystery.weight": torch.zeros(1)}, layout))
    with pytest.raises(BackendError, match="no Megatron name"):
        hf_to_megatron({"model.layers.0.mystery.weight": torch.zeros(1)}, layout)
    # _extra_state entries (Transformer Engine/FP8 metadata) carry no weights and are skipped.
    assert list(megatron_to_hf({"output_layer._extra_state": None}, layout)) == []


# ---------------------------------------------------------------------- real megatron-core models
@pytest.fixture(scope="module")
def mcore():
    """A 1-rank gloo process group with Megatron's model-parallel state (TP = PP = 1)."""
    pytest.importorskip("megatron.core")
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    owned = not dist.is_initialized()
    if owned:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=0, world_size=1)
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(1, 1)
    yield ps
    ps.destroy_model_parallel()
    if owned:
        dist.destroy_process_group()


@pytest.fixture()
def pair(mcore):
    """A HF tiny Qwen2 and a Megatron GPTModel holding the same weights, in an engine."""
    from dynres.runtime.backends.megatron import MegatronTrainEngine, tiny_gpt_model

    hf = build_tiny_model(GQA, seed=1)
    model = tiny_gpt_model(hf.config, seed=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    eng = MegatronTrainEngine(model, opt, export_bucket_bytes=64 * 1024)
    eng.load_hf_state(hf.state_dict())
    return hf, model, eng


def test_export_names_and_shapes_match_hf_qwen2(pair):
    hf, _model, eng = pair
    upd = asyncio.run(eng.export_weights())
    exported = dict(upd.payload.iter_tensors())
    sd = hf.state_dict()
    assert set(exported) == set(sd)
    assert all(tuple(exported[k].shape) == tuple(sd[k].shape) for k in sd)
    assert all(torch.equal(exported[k], sd[k]) for k in sd)
    assert upd.payload.num_buckets > 1
    # The export loads strictly into a fresh HF model.
    fresh = build_tiny_model(GQA, seed=9)
    fresh.load_state_dict(exported, strict=True)


@pytest.mark.slow
def test_megatron_attention_and_mlp_agree_with_hf_on_cpu(pair):
    """Megatron's own QKV split and MLP (which run on CPU) agree with HF's after the mapping."""
    hf, model, _ = pair
    x = torch.randn(5, 1, GQA.hidden_size)
    layer, ref = model.decoder.layers[0], hf.model.layers[0]
    with torch.no_grad():
        q, k, v = layer.self_attention.get_query_key_value_tensors(x)[:3]
        d = 32
        assert torch.allclose(q[:, 0], ref.self_attn.q_proj(x[:, 0]).view(5, 4, d), atol=1e-5)
        assert torch.allclose(k[:, 0], ref.self_attn.k_proj(x[:, 0]).view(5, 2, d), atol=1e-5)
        assert torch.allclose(v[:, 0], ref.self_attn.v_proj(x[:, 0]).view(5, 2, d), atol=1e-5)
        mlp_out = layer.mlp(x)[0]
        assert torch.allclose(mlp_out[:, 0], ref.mlp(x[:, 0]), atol=1e-5)


def test_offload_frees_and_onload_restores_bit_exact(pair):
    _, model, eng = pair
    # Create optimizer state without a forward pass (Megatron's forward needs CUDA).
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    eng.optimizer.step()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in eng.optimizer.state.items()}
    resident = eng.resident_bytes()
    asyncio.run(eng.offload())
    assert eng.offloaded and eng.resident_bytes() == 0
    with pytest.raises(BackendError, match="onload"):
        asyncio.run(eng.train_step([]))
    # Export while offloaded reads the weights and leaves the memory free.
    upd = asyncio.run(eng.export_weights())
    assert eng.resident_bytes() == 0 and upd.nbytes > 0
    asyncio.run(eng.onload())
    assert eng.resident_bytes() == resident
    assert all(torch.equal(params[n], p) for n, p in model.named_parameters())
    for p, s in eng.optimizer.state.items():
        assert all(torch.equal(state[id(p)][k], v) for k, v in s.items())
    c = eng.costs()
    assert c.offload_s is not None and c.onload_s is not None and c.export_weights_s is not None


def test_train_step_needs_step_fn_and_counts_versions(pair):
    from dynres.runtime.backends.megatron import MegatronTrainEngine
    from dynres.runtime.protocols import TrainStepResult

    _, model, eng = pair
    with pytest.raises(BackendError, match="step_fn"):
        asyncio.run(eng.train_step([]))
    calls = []

    def step(m, o, batch):
        calls.append(len(batch))
        return TrainStepResult({"update_actor": 0.0})

    eng2 = MegatronTrainEngine(model, step_fn=step)
    res = asyncio.run(eng2.train_step([1, 2]))
    assert calls == [2] and eng2.version == 1 and res.phase_times == {"update_actor": 0.0}


def test_saved_state_loads_weights_and_optimizer_into_a_fresh_engine(pair, tmp_path):
    from dynres.runtime.backends.megatron import MegatronTrainEngine, tiny_gpt_model

    hf, model, eng = pair
    for p in model.parameters():  # optimizer state without a forward pass (needs CUDA)
        p.grad = torch.randn_like(p) * 1e-2
    eng.optimizer.step()
    eng.version = 3
    asyncio.run(eng.save_state(str(tmp_path)))
    other = tiny_gpt_model(hf.config, seed=7)
    fresh = MegatronTrainEngine(other, torch.optim.AdamW(other.parameters(), lr=1e-3))
    asyncio.run(fresh.load_state(str(tmp_path)))
    assert fresh.version == 3
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters(), strict=True))
    saved, loaded = eng.optimizer.state_dict()["state"], fresh.optimizer.state_dict()["state"]
    assert saved.keys() == loaded.keys()
    assert all(torch.equal(saved[i][k], loaded[i][k]) for i in saved for k in saved[i])


@pytest.mark.gpu
def test_megatron_forward_matches_hf_logits_on_gpu(pair):
    """Full forward (Megatron needs CUDA for it) gives the HF model's logits after the mapping."""
    hf, model, _ = pair
    model, hf = model.cuda(), hf.cuda()
    ids = torch.tensor([[1, 5, 6, 7, 8, 9]], device="cuda")
    with torch.no_grad():
        out = model(input_ids=ids, position_ids=torch.arange(6, device="cuda").unsqueeze(0), attention_mask=None)
        ref = hf(input_ids=ids).logits
    assert torch.allclose(out.float(), ref.float(), atol=1e-3)
