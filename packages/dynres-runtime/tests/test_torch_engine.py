"""TorchTrainEngine on a random tiny Qwen2 (CPU): real gradients, offload/onload, bucketed export."""

from __future__ import annotations

import asyncio
import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dynres.core.errors import BackendError  # noqa: E402  # imported after importorskip: needs the extra
from dynres.core.metrics import TRAIN_COMPUTE_PHASES  # noqa: E402  # imported after importorskip: needs the extra
from dynres.runtime.backends.torch_engine import TorchTrainConfig, TorchTrainEngine, TrainSample  # noqa: E402  # imported after importorskip: needs the extra
from dynres.runtime.backends.weights import WeightBuckets  # noqa: E402  # imported after importorskip: needs the extra
from dynres.runtime.protocols import GenerationResult, TrainEngine  # noqa: E402  # imported after importorskip: needs the extra
from dynres.runtime.realrun.tiny_task import TinyModelSpec, build_tiny_model, make_prompts, parity_reward  # noqa: E402  # imported after importorskip: needs the extra

pytestmark = pytest.mark.slow


def _batch(n_samples: int = 4, n: int = 4, length: int = 12, seed: int = 0) -> list[TrainSample]:
    """Fixed random responses for toy prompts (rewards filled in by the engine's reward_fn)."""
    g = torch.Generator().manual_seed(seed)
    return [
        TrainSample(p, [torch.randint(3, 512, (length,), generator=g).tolist() for _ in range(n)], sample_id=f"s{i}")
        for i, p in enumerate(make_prompts(n_samples, seed=seed))
    ]


def _engine(**cfg) -> TorchTrainEngine:
    """A fresh engine on a fresh tiny model."""
    return TorchTrainEngine(build_tiny_model(seed=0), TorchTrainConfig(**cfg), reward_fn=parity_reward)


def test_implements_protocol():
    assert isinstance(_engine(), TrainEngine)


def test_train_step_changes_weights_and_lowers_loss_on_fixed_batch():
    eng = _engine(lr=1e-3)
    batch = _batch()
    pb = eng.prepare(batch)
    before = {k: v.clone() for k, v in eng.model.state_dict().items()}
    loss0 = eng.loss_on(pb)
    res = asyncio.run(eng.train_step(batch))
    loss1 = eng.loss_on(pb)
    assert loss1 < loss0 - 1e-3
    assert any(not torch.equal(before[k], v) for k, v in eng.model.state_dict().items())
    assert set(res.phase_times) <= set(TRAIN_COMPUTE_PHASES)
    assert {"reward", "old_log_prob", "adv", "update_actor"} <= set(res.phase_times)
    assert all(t >= 0 for t in res.phase_times.values())
    assert 0.0 <= res.metrics["reward/mean"] <= 1.0 and "loss" in res.metrics and "grad_norm" in res.metrics
    assert eng.version == 1


def test_repeated_steps_raise_reward_weighted_log_prob():
    # Several steps on one batch push probability mass toward the better responses.
    eng = _engine(lr=1e-3)
    batch = _batch()
    pb = eng.prepare(batch)
    losses = [eng.loss_on(pb)]
    for _ in range(3):
        asyncio.run(eng.train_step(batch))
        losses.append(eng.loss_on(pb))
    assert losses[-1] < losses[0]


def test_group_normalised_advantages():
    eng = _engine()
    pb = eng.prepare(_batch(n_samples=3, n=4))
    adv = pb.advantages.view(3, 4)
    assert torch.allclose(adv.mean(dim=1), torch.zeros(3), atol=1e-5)
    rewards = torch.tensor(pb.rewards).view(3, 4)
    for g in range(3):
        if rewards[g].std() > 0:
            assert torch.allclose(adv[g].std(unbiased=False), torch.tensor(1.0), atol=1e-3)
    # Response tokens only: prompt positions carry no loss.
    assert int(pb.loss_mask.sum()) == 3 * 4 * 12


def test_offload_frees_memory_and_onload_restores_bit_exact():
    eng = _engine(lr=1e-3)
    batch = _batch()
    asyncio.run(eng.train_step(batch))  # creates AdamW state (exp_avg, exp_avg_sq)
    params = {k: v.clone() for k, v in eng.model.state_dict().items()}
    opt = copy.deepcopy(eng.optimizer.state_dict()["state"])
    resident = eng.resident_bytes()
    n_params = sum(p.numel() * p.element_size() for p in eng.model.parameters())
    assert resident >= 3 * n_params  # weights + two Adam moments

    asyncio.run(eng.offload())
    assert eng.offloaded and eng.resident_bytes() == 0
    assert all(p.untyped_storage().nbytes() == 0 for p in eng.model.parameters())
    with pytest.raises(BackendError, match="onload"):
        asyncio.run(eng.train_step(batch))
    asyncio.run(eng.offload())  # idempotent

    asyncio.run(eng.onload())
    assert not eng.offloaded and eng.resident_bytes() == resident
    assert all(torch.equal(params[k], v) for k, v in eng.model.state_dict().items())
    state = eng.optimizer.state_dict()["state"]
    assert all(torch.equal(opt[i][k], state[i][k]) for i in opt for k in opt[i])
    # Training continues from the restored state exactly like an engine that never offloaded.
    twin = _engine(lr=1e-3)
    asyncio.run(twin.train_step(batch))
    asyncio.run(twin.train_step(batch))
    asyncio.run(eng.train_step(batch))
    assert all(
        torch.equal(a, b)
        for a, b in zip(eng.model.state_dict().values(), twin.model.state_dict().values(), strict=False)
    )
    costs = eng.costs()
    assert costs.offload_s is not None and costs.onload_s is not None


def test_export_in_bounded_buckets_is_a_private_copy():
    eng = _engine(lr=1e-3, export_bucket_bytes=64 * 1024)
    upd = asyncio.run(eng.export_weights())
    payload = upd.payload
    assert isinstance(payload, WeightBuckets) and payload.num_buckets > 1
    sd = eng.model.state_dict()
    assert list(payload.names) == list(sd)
    assert upd.nbytes == payload.nbytes == sum(v.numel() * v.element_size() for v in sd.values())
    for bucket in payload.buckets:
        size = sum(t.numel() * t.element_size() for t in bucket.values())
        assert size <= 64 * 1024 or len(bucket) == 1
    exported = dict(payload.iter_tensors())
    asyncio.run(eng.train_step(_batch()))
    changed = [k for k, v in eng.model.state_dict().items() if not torch.equal(v, exported[k])]
    assert changed  # training after export does not alter the export
    assert asyncio.run(eng.export_weights()).version == 1


def test_export_while_offloaded_keeps_the_engine_offloaded():
    eng = _engine()
    sd = {k: v.clone() for k, v in eng.model.state_dict().items()}
    asyncio.run(eng.offload())
    upd = asyncio.run(eng.export_weights())
    assert eng.offloaded and eng.resident_bytes() == 0
    assert all(torch.equal(sd[k], v) for k, v in upd.payload.iter_tensors())


def test_export_dtype_cast():
    eng = _engine(export_dtype="bfloat16")
    upd = asyncio.run(eng.export_weights())
    assert all(t.dtype == torch.bfloat16 for _, t in upd.payload.iter_tensors())


def test_rollout_log_probs_and_explicit_rewards():
    eng = _engine(recompute_old_log_prob=False)
    prompt = make_prompts(1)[0]
    resps = [GenerationResult(f"r{i}", [4 + i, 6, 8], [-1.0, -2.0, -3.0], "length", "rep") for i in range(2)]
    pb = eng.prepare([TrainSample(prompt, resps, rewards=[1.0, 0.0])])
    assert pb.rewards == [1.0, 0.0]
    assert float(pb.old_log_probs.sum()) == pytest.approx(-12.0)
    with pytest.raises(BackendError, match="one reward per response"):
        eng.prepare([TrainSample(prompt, resps, rewards=[1.0])])
    with pytest.raises(BackendError, match="rollout log-probs"):
        eng.prepare([TrainSample(prompt, [[4, 5]], rewards=[1.0])])


def test_rollout_logprob_gap_measures_how_far_the_rollout_is_from_the_trainer():
    eng = _engine(lr=1e-2)
    prompt = make_prompts(1)[0]
    toks = [[4, 6, 8, 10], [5, 7, 9, 11]]
    # The trainer's own log-probs of these tokens, as a rollout on the same weights would report them.
    pb = eng.prepare([TrainSample(prompt, toks, rewards=[1.0, 0.0])])
    own = [pb.old_log_probs[i, len(prompt) - 1 : len(prompt) - 1 + 4].tolist() for i in range(2)]

    def sample(shift: float) -> TrainSample:
        resps = [
            GenerationResult(f"r{i}", t, [lp + shift for lp in own[i]], "length", "rep") for i, t in enumerate(toks)
        ]
        return TrainSample(prompt, resps, rewards=[1.0, 0.0])

    assert eng.prepare([sample(0.0)]).rollout_gap == pytest.approx(0.0, abs=1e-5)
    assert eng.prepare([sample(-0.5)]).rollout_gap == pytest.approx(0.5, abs=1e-5)
    # After an update the rollout's log-probs (from the old weights) no longer match: staleness shows.
    assert asyncio.run(eng.train_step([sample(0.0)])).metrics["rollout_logprob_gap"] == pytest.approx(0.0, abs=1e-5)
    assert asyncio.run(eng.train_step([sample(0.0)])).metrics["rollout_logprob_gap"] > 1e-3
    # Without rollout log-probs there is nothing to compare.
    bare = asyncio.run(eng.train_step([TrainSample(prompt, toks, rewards=[1.0, 0.0])]))
    assert "rollout_logprob_gap" not in bare.metrics


def test_missing_reward_fn_and_empty_batch():
    eng = TorchTrainEngine(build_tiny_model(seed=0))
    with pytest.raises(BackendError, match="reward_fn"):
        eng.prepare(_batch(1))
    with pytest.raises(BackendError, match="empty batch"):
        eng.prepare([])


def test_from_pretrained_with_config_fields_and_reward_path(tmp_path):
    from dynres.core.errors import ConfigError
    from dynres.runtime.realrun.tiny_task import save_tiny_model

    path = save_tiny_model(tmp_path / "m", seed=0)
    eng = TorchTrainEngine.from_pretrained(
        str(path), lr=5e-4, seed=3, reward_fn="dynres.runtime.realrun.tiny_task:parity_reward"
    )
    assert eng.config.lr == 5e-4 and eng.config.seed == 3 and eng.reward_fn is parity_reward
    with pytest.raises(ConfigError, match="did you mean 'lr'"):
        TorchTrainEngine.from_pretrained(str(path), lrr=1.0)
    with pytest.raises(ConfigError, match="not an import path"):
        TorchTrainEngine.from_pretrained(str(path), reward_fn="no_colon")


def test_offload_after_from_pretrained(tmp_path):
    """Weights loaded from safetensors may be memory-mapped; offload must still free and restore them."""
    import asyncio

    from dynres.runtime.realrun.tiny_task import save_tiny_model

    path = save_tiny_model(tmp_path / "m", seed=0)
    eng = TorchTrainEngine.from_pretrained(str(path), reward_fn="dynres.runtime.realrun.tiny_task:parity_reward")
    before = {k: v.detach().clone() for k, v in eng.model.state_dict().items()}
    asyncio.run(eng.offload())
    assert eng.resident_bytes() == 0
    asyncio.run(eng.onload())
    after = eng.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_accepts_runtime_samples():
    samples = pytest.importorskip("dynres.runtime.samples")
    eng = _engine(lr=1e-3)
    prompt = make_prompts(1)[0]
    resps = tuple(GenerationResult(f"r{i}", [3 + i, 5, 7 + 2 * i], [-1.0] * 3, "length", "rep") for i in range(3))
    sample = samples.Sample(
        group=samples.PromptGroup(sample_id="s0", prompt_token_ids=prompt, n=3),
        responses=resps,
        start_version=0,
        finish_version=0,
        started_s=0.0,
        finished_s=1.0,
    )
    res = asyncio.run(eng.train_step([sample]))
    assert res.metrics["response_length/mean"] == 3.0


def test_saved_state_resumes_training_bit_exact(tmp_path):
    # A resumed engine must take the same next step as one that never stopped: same weights AND
    # the same AdamW moments (without them the step after a resume has another size).
    batch, other = _batch(), _batch(seed=1)
    eng = _engine(lr=1e-3)
    for _ in range(2):
        asyncio.run(eng.train_step(batch))
    asyncio.run(eng.offload())  # saved while offloaded: stays offloaded
    asyncio.run(eng.save_state(str(tmp_path)))
    assert eng.offloaded
    asyncio.run(eng.onload())
    fresh = TorchTrainEngine(build_tiny_model(seed=5), TorchTrainConfig(lr=1e-3), reward_fn=parity_reward)
    asyncio.run(fresh.load_state(str(tmp_path)))
    assert fresh.version == eng.version == 2
    # the loaded optimizer state can be offloaded like any other (torch.load's storages cannot)
    asyncio.run(fresh.offload())
    assert fresh.resident_bytes() == 0
    asyncio.run(fresh.onload())
    asyncio.run(eng.train_step(other))
    asyncio.run(fresh.train_step(other))
    assert all(
        torch.equal(a, b)
        for a, b in zip(eng.model.state_dict().values(), fresh.model.state_dict().values(), strict=True)
    )


def test_loading_a_state_of_another_model_is_an_error(tmp_path):
    eng = _engine()
    asyncio.run(eng.save_state(str(tmp_path)))
    other = TorchTrainEngine(build_tiny_model(TinyModelSpec(hidden_size=64, num_hidden_layers=1), seed=0))
    with pytest.raises(BackendError, match="does not fit this model"):
        asyncio.run(other.load_state(str(tmp_path)))
    with pytest.raises(BackendError, match="cannot read the train state"):
        asyncio.run(other.load_state(str(tmp_path / "missing")))
