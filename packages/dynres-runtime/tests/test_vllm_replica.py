"""VllmReplica against a real vLLM engine on CPU (tiny random Qwen2); one engine for the module."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dynres.runtime.backends.vllm import VllmReplica, VllmReplicaConfig  # noqa: E402  # imported after importorskip: needs the extra
from dynres.runtime.backends.weights import bucketize, materialize, remove_bucket_files  # noqa: E402  # imported after importorskip: needs the extra
from dynres.runtime.protocols import GenerationRequest, ReplicaKind, WeightUpdate  # noqa: E402  # imported after importorskip: needs the extra
from dynres.runtime.realrun.tiny_task import hf_greedy, save_tiny_model  # noqa: E402  # imported after importorskip: needs the extra

pytestmark = pytest.mark.slow

PROMPT = [1, 17, 33, 250, 9, 77, 402, 5]


@pytest.fixture(scope="module")
def loop():
    """One event loop for the module: the engine's output handler lives on it."""
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two random tiny Qwen2 checkpoints (seeds 0 and 1) and their HF models."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("tiny")
    paths = [save_tiny_model(root / f"m{s}", seed=s) for s in (0, 1)]
    hf = [AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval() for p in paths]
    return paths, hf


@pytest.fixture(scope="module")
def replica(loop, models):
    """One VllmReplica (CPU, float32, eager) shared by every test of this module."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    paths, _ = models
    cfg = VllmReplicaConfig(
        model=str(paths[0]), dtype="float32", max_model_len=256, enforce_eager=True, ignore_eos=True, seed=0
    )
    rep = loop.run_until_complete(VllmReplica.create("vllm-0", cfg, ReplicaKind.HYBRID))
    yield rep
    loop.run_until_complete(rep.shutdown())


def _req(rid: str, max_tokens: int, prompt=PROMPT) -> GenerationRequest:
    """A greedy request."""
    return GenerationRequest(
        request_id=rid, sample_id="s", prompt_token_ids=prompt, max_tokens=max_tokens, temperature=0.0
    )


async def _wait_tokens(rep: VllmReplica, rid: str, n: int, timeout: float = 30.0) -> None:
    """Wait until request ``rid`` has produced at least ``n`` tokens on ``rep``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        run = rep._running.get(rid)
        if run is not None and len(run.token_ids) >= n:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{rid} produced fewer than {n} tokens in {timeout} s")
        await asyncio.sleep(0.005)


def test_greedy_matches_hf_and_reports_logprobs(loop, replica, models):
    _, hf = models
    res = loop.run_until_complete(replica.generate(_req("g0", 16)))
    assert res.finish_reason == "length" and len(res.token_ids) == 16
    assert len(res.logprobs) == 16 and all(lp <= 0.0 for lp in res.logprobs)
    assert list(res.token_ids) == hf_greedy(hf[0], PROMPT, 16)
    assert res.replica_id == "vllm-0"


def test_abort_mid_stream_returns_partial_and_resumes_to_completion(loop, replica):
    counted_before = replica.generated_tokens
    full = loop.run_until_complete(replica.generate(_req("full", 120)))

    async def scenario():
        req = _req("ab", 120)
        task = asyncio.create_task(replica.generate(req))
        await _wait_tokens(replica, "ab", 5)
        aborted_ids = await replica.abort(["ab", "not-running"])
        part = await task
        assert aborted_ids == ["ab"]
        assert part.aborted and 5 <= len(part.token_ids) < 120
        assert len(part.logprobs) == len(part.token_ids)
        # Resume: the replica re-prefills prompt + partial and generates only what is left.
        done = await replica.generate(req.resumed(part.token_ids, part.logprobs))
        return part, done

    part, done = loop.run_until_complete(scenario())
    assert done.finish_reason == "length" and len(done.token_ids) == 120
    assert list(done.token_ids[: len(part.token_ids)]) == list(part.token_ids)
    assert list(done.token_ids) == list(full.token_ids)
    assert replica.in_flight == 0
    # The token counter holds what this replica generated: 120, then the partial output, then
    # only the rest of the resumed request (not the partial output it carried in again).
    assert replica.generated_tokens - counted_before == 240


def test_abort_all_and_resumed_request_with_no_budget_left(loop, replica):
    async def scenario():
        tasks = [asyncio.create_task(replica.generate(_req(f"all{i}", 200))) for i in range(2)]
        for i in range(2):
            await _wait_tokens(replica, f"all{i}", 2)
        ids = await replica.abort()
        results = await asyncio.gather(*tasks)
        return ids, results

    ids, results = loop.run_until_complete(scenario())
    assert sorted(ids) == ["all0", "all1"]
    assert all(r.aborted for r in results)
    req = _req("spent", 3).resumed([5, 6, 7], [-1.0, -1.0, -1.0])
    res = loop.run_until_complete(replica.generate(req))
    assert res.finish_reason == "length" and list(res.token_ids) == [5, 6, 7]


def test_pause_keeps_request_alive_until_resume(loop, replica):
    async def scenario():
        task = asyncio.create_task(replica.generate(_req("pz", 80)))
        await _wait_tokens(replica, "pz", 3)
        await replica.pause()
        await asyncio.sleep(0.1)  # let outputs already in flight arrive
        n_paused = len(replica._running["pz"].token_ids)
        await asyncio.sleep(0.5)
        still = len(replica._running["pz"].token_ids)
        alive = not task.done()
        await replica.resume()
        return n_paused, still, alive, await task

    n_paused, still, alive, res = loop.run_until_complete(scenario())
    assert alive and still == n_paused < 80
    assert res.finish_reason == "length" and len(res.token_ids) == 80


def test_sleep_wake_round_trip_keeps_greedy_output(loop, replica, caplog):
    before = loop.run_until_complete(replica.generate(_req("sw0", 24)))
    loop.run_until_complete(replica.sleep(1))
    assert loop.run_until_complete(replica.health()).sleeping
    loop.run_until_complete(replica.wake_up())
    health = loop.run_until_complete(replica.health())
    assert health.healthy and not health.sleeping
    after = loop.run_until_complete(replica.generate(_req("sw1", 24)))
    assert list(after.token_ids) == list(before.token_ids)
    costs = replica.costs()
    assert costs.sleep_s is not None and costs.wake_up_s is not None


def test_weight_update_changes_greedy_output(loop, replica, models):
    _, hf = models
    before = loop.run_until_complete(replica.generate(_req("w0", 16)))
    assert list(before.token_ids) == hf_greedy(hf[0], PROMPT, 16)

    # In-memory buckets (the replica writes them to /dev/shm and deletes them afterwards).
    upd = bucketize(hf[1].state_dict().items(), bucket_bytes=64 * 1024)
    assert upd.num_buckets > 1
    t0 = time.perf_counter()
    loop.run_until_complete(replica.update_weights(WeightUpdate(version=1, payload=upd, nbytes=upd.nbytes)))
    print(f"update_weights ({upd.nbytes} B in {upd.num_buckets} buckets): {time.perf_counter() - t0:.3f} s")
    after = loop.run_until_complete(replica.generate(_req("w1", 16)))
    assert list(after.token_ids) == hf_greedy(hf[1], PROMPT, 16)
    assert list(after.token_ids) != list(before.token_ids)
    assert after.weight_version == 1 and replica.weight_version == 1

    # Shared files (written once, e.g. for all replicas of a node) bring the first weights back.
    files = materialize(bucketize(hf[0].state_dict().items()))
    try:
        loop.run_until_complete(replica.update_weights(WeightUpdate(version=2, payload=files)))
    finally:
        remove_bucket_files(files.files)
    back = loop.run_until_complete(replica.generate(_req("w2", 16)))
    assert list(back.token_ids) == list(before.token_ids)
    assert replica.costs().update_weights_s is not None


def test_health_and_bad_payload(loop, replica):
    from dynres.core.errors import BackendError

    h = loop.run_until_complete(replica.health())
    assert h.healthy and h.in_flight == 0
    with pytest.raises(BackendError, match="WeightBuckets"):
        loop.run_until_complete(replica.update_weights(WeightUpdate(version=9, payload={"x": 1})))


def test_torch_trainer_export_reproduces_trainer_greedy_output(loop, replica, models):
    """Train on the replica's own weights, export, load: vLLM greedy == the trained HF model's."""
    from dynres.runtime.backends.torch_engine import TorchTrainConfig, TorchTrainEngine, TrainSample
    from dynres.runtime.realrun.tiny_task import make_prompts, parity_reward

    paths, hf = models
    eng = TorchTrainEngine.from_pretrained(
        str(paths[0]), TorchTrainConfig(lr=2e-2, export_bucket_bytes=128 * 1024), reward_fn=parity_reward
    )
    # Start both sides from the same weights.
    loop.run_until_complete(replica.update_weights(loop.run_until_complete(eng.export_weights())))
    assert list(loop.run_until_complete(replica.generate(_req("t0", 16))).token_ids) == hf_greedy(hf[0], PROMPT, 16)

    async def rollout_and_train(step: int) -> None:
        prompts = make_prompts(4, seed=step)
        reqs = [
            GenerationRequest(
                request_id=f"tr{step}-{i}-{j}",
                sample_id=f"{i}",
                prompt_token_ids=p,
                max_tokens=12,
                temperature=1.0,
                seed=100 * i + j,
            )
            for i, p in enumerate(prompts)
            for j in range(4)
        ]
        results = await asyncio.gather(*(replica.generate(r) for r in reqs))
        batch = [TrainSample(p, results[4 * i : 4 * i + 4]) for i, p in enumerate(prompts)]
        await eng.train_step(batch)
        await replica.update_weights(await eng.export_weights())

    for step in range(3):
        loop.run_until_complete(rollout_and_train(step))
    eng.model.eval()
    trained = hf_greedy(eng.model, PROMPT, 16)
    got = loop.run_until_complete(replica.generate(_req("t1", 16)))
    assert trained != hf_greedy(hf[0], PROMPT, 16)  # the update really changed greedy output
    assert list(got.token_ids) == trained
    assert got.weight_version == eng.version == 3


def test_a_recreated_replica_serves_the_published_weights(loop, models):
    # A replica whose process died is rebuilt from its spec (the model on disk: seed 0's weights);
    # the controller must load the run's latest weights (seed 1's) before routing to it again.
    from dynres.runtime.backends.fake import FakeReplica, FakeTrainEngine
    from dynres.runtime.loop.controller import Controller
    from dynres.runtime.loop.ops import OpRunner
    from dynres.runtime.loop.routing import LoadBalancer

    paths, hf = models
    cfg = VllmReplicaConfig(
        model=str(paths[0]), dtype="float32", max_model_len=256, enforce_eager=True, ignore_eos=True, seed=0
    )
    built: list[VllmReplica] = []

    async def restart(old):
        new = await VllmReplica.create(old.replica_id, cfg, ReplicaKind.STANDALONE)
        built.append(new)
        return new

    async def main():
        now = asyncio.get_running_loop().time
        gone = FakeReplica("s0")
        balancer = LoadBalancer(sticky_capacity=0)
        ctl = Controller(
            balancer=balancer,
            train_engine=FakeTrainEngine(),
            hybrid=[],
            standalone=[gone],
            ops=OpRunner(timeout_s=300.0, now=now),
            now=now,
            restart=restart,
            max_restarts=1,
            probation_backoff_s=0.01,
        )
        balancer.add_replica(gone)
        published = bucketize(hf[1].state_dict().items(), bucket_bytes=64 * 1024)
        ctl.last_update = WeightUpdate(version=5, payload=published, nbytes=published.nbytes)
        gone.lose()
        ctl.retire(gone, "its process was killed")
        await ctl._restarting["s0"]
        [new] = built
        assert balancer.has_replica("s0") and not ctl.quarantined
        return new, await new.generate(_req("r0", 16))

    new, out = loop.run_until_complete(main())
    try:
        assert list(out.token_ids) == hf_greedy(hf[1], PROMPT, 16)  # the published weights, not the disk's
        assert list(out.token_ids) != hf_greedy(hf[0], PROMPT, 16)
        assert new.weight_version == 5 and out.weight_version == 5
    finally:
        loop.run_until_complete(new.shutdown())
