"""TorchTrainEngine with FSDP2 on a 2-process gloo group (CPU): step, export, offload/onload."""

from __future__ import annotations

import os
import socket

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow


def _batch():
    """The same fixed batch on every rank."""
    from dynres.runtime.backends.torch_engine import TrainSample
    from dynres.runtime.realrun.tiny_task import make_prompts

    g = torch.Generator().manual_seed(0)
    return [
        TrainSample(p, [torch.randint(3, 512, (10,), generator=g).tolist() for _ in range(4)]) for p in make_prompts(2)
    ]


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    """One FSDP2 rank: build, step, export, offload/onload; rank 0 saves what the test checks."""
    import asyncio

    import torch.distributed as dist

    from dynres.runtime.backends.torch_engine import TorchTrainConfig, TorchTrainEngine
    from dynres.runtime.realrun.tiny_task import build_tiny_model, parity_reward

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        eng = TorchTrainEngine(build_tiny_model(seed=0), TorchTrainConfig(lr=1e-3, fsdp=True), reward_fn=parity_reward)
        asyncio.run(eng.train_step(_batch()))
        local = {n: p.to_local().clone() for n, p in eng.model.named_parameters()}
        resident = eng.resident_bytes()
        freed = eng.offload_sync()
        after = eng.resident_bytes()
        eng.onload_sync()
        exact = all(torch.equal(local[n], p.to_local()) for n, p in eng.model.named_parameters())
        upd = asyncio.run(eng.export_weights())  # all-gathers full tensors on every rank
        if rank == 0:
            torch.save(
                {
                    "weights": dict(upd.payload.iter_tensors()),
                    "resident": resident,
                    "freed": freed,
                    "after": after,
                    "exact": exact,
                },
                os.path.join(out_dir, "rank0.pt"),
            )
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_fsdp2_two_ranks_match_single_process(tmp_path):
    import torch.multiprocessing as mp

    from dynres.runtime.backends.torch_engine import TorchTrainConfig, TorchTrainEngine
    from dynres.runtime.realrun.tiny_task import build_tiny_model, parity_reward

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank_main, args=(2, port, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    got = torch.load(tmp_path / "rank0.pt")
    assert got["exact"] and got["after"] == 0 and got["freed"] == got["resident"] > 0

    # Same batch on both ranks: the averaged sharded gradients equal a single process's.
    import asyncio

    ref = TorchTrainEngine(build_tiny_model(seed=0), TorchTrainConfig(lr=1e-3), reward_fn=parity_reward)
    asyncio.run(ref.train_step(_batch()))
    sd = ref.model.state_dict()
    assert set(got["weights"]) == set(sd)
    for k, v in sd.items():
        assert torch.allclose(got["weights"][k], v, atol=1e-6), k
