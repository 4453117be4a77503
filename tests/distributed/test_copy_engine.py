"""FSDP2's collectives as copy-engine transfers (twinkle_fx.distributed.copy_engine): the transfers' arithmetic
against every rank's buffers simulated in one process, what the entry point refuses, and on a machine with 2 GPUs
the FSDP2 benchmark trained through them against NCCL's collectives and one process over the global batch."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from dist_launch import launch
from torch import nn

import twinkle_fx.bench.distributed as distributed_bench
from twinkle_fx.distributed import use_copy_engine_collectives
from twinkle_fx.distributed.copy_engine import gather_shards, reduce_chunks


def _peers(buffers: list[torch.Tensor]):
    """What a rank reads of its peers' symmetric buffers: ``numel`` elements of rank ``peer``'s from ``offset``."""
    return lambda peer, numel, offset: buffers[peer][offset:offset + numel]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_gather_shards_pulls_every_peer_slice_into_place(world):
    torch.manual_seed(world)
    n = 7
    shards = [torch.randn(n) for _ in range(world)]
    # each rank's output holds its own shard in its slice and garbage elsewhere, as FSDP2's copy-in leaves it
    outputs = [torch.full((world * n,), float("nan")) for _ in range(world)]
    for rank, output in enumerate(outputs):
        output[rank * n:(rank + 1) * n] = shards[rank]
    before = [output.clone() for output in outputs]
    for rank in range(world):
        gather_shards(outputs[rank], rank, world, _peers(before))
        torch.testing.assert_close(outputs[rank], torch.cat(shards), rtol=0, atol=0)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("average", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reduce_chunks_sums_this_ranks_chunk_over_every_rank(world, average, dtype):
    torch.manual_seed(world)
    n = 64
    grads = [torch.randn(world * n).to(dtype) for _ in range(world)]
    for rank in range(world):
        out = torch.empty(n, dtype=dtype)
        reduce_chunks(out, grads[rank], rank, world, _peers(grads), average=average)
        chunks = torch.stack([g[rank * n:(rank + 1) * n].float() for g in grads])
        expected = (chunks.mean(0) if average else chunks.sum(0)).to(dtype)  # fp32 accumulation, one rounding
        # fp32 sums of 3 or 4 in another order than the reference's: the last bit
        torch.testing.assert_close(out, expected, rtol=2e-7 if dtype == torch.float32 and world > 2 else 0, atol=0)


def test_a_model_without_fsdp2_units_is_refused():
    with pytest.raises(ValueError, match="Sequential has no FSDP2 unit; call fully_shard on its layers"):
        use_copy_engine_collectives(nn.Sequential(nn.Linear(2, 2)))


@pytest.mark.parametrize("device", ["cpu"])  # the fixture's CPU value: a gloo group whatever the machine
def test_units_off_cuda_are_refused(world_of_one):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    mesh = init_device_mesh("cpu", (1,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    with pytest.raises(ValueError, match=r"the FSDP2 unit 0 \(FSDPLinear\) is on cpu; copy engines move GPU memory"):
        use_copy_engine_collectives(model)


def test_the_bench_takes_the_collectives():
    args = distributed_bench.parse_args("--parallel fsdp2 --collectives copy-engine".split())
    assert args.collectives == "copy-engine"  # test_distributed_bench checks it is refused without fsdp2


def test_a_group_of_one_takes_the_collectives_unchecked(world_of_one, device):
    """One rank: FSDP2 runs no collective, so there is nothing to check; the units still take the new ones."""
    if device != "cuda":
        pytest.skip("copy engines move CUDA memory")
    from torch.distributed.fsdp import fully_shard

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)).cuda()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    assert use_copy_engine_collectives(model) == 2  # the layers; the root holds no parameter of its own
    model(torch.randn(2, 4, device="cuda")).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


SHAPE = "--model llama3b --size tiny --seq 16 --steps 4 --dtype fp32 --backend eager --parallel fsdp2"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs of one host")
def test_fsdp2_through_the_copy_engines_trains_as_nccl_does(tmp_path):
    """Two GPUs train the tiny Llama through FSDP2 with NCCL's collectives and with the copy engines' (the check
    collectives at setup included), each to the losses of one process over the global batch."""
    single = tmp_path / "single.json"
    launch(["-m", "twinkle_fx.bench.distributed", *SHAPE.replace("fsdp2", "none").split(), "--batch", "4",
            "--out", str(single)], timeout=300, env={"CUDA_VISIBLE_DEVICES": "0"}, nproc_per_node=1)
    losses = {}
    for collectives in ("nccl", "copy-engine"):
        out = tmp_path / f"{collectives}.json"
        launch(["-m", "twinkle_fx.bench.distributed", *SHAPE.split(), "--batch", "2", "--collectives", collectives,
                "--baseline", str(single), "--out", str(out)], timeout=300, env={"CUDA_VISIBLE_DEVICES": "0,1"})
        run = json.loads(out.read_text())["runs"][0]
        assert run["world_size"] == 2 and run["args"]["collectives"] == collectives
        losses[collectives] = run["losses"]
    reference = json.loads(single.read_text())["runs"][0]["losses"]
    assert len(set(reference)) == 4  # the model trains: each step's loss differs
    assert losses["nccl"] == pytest.approx(reference, rel=1e-5)
    # the two ranks' mean of fp32 gradients: the same sums as NCCL's average
    assert losses["copy-engine"] == pytest.approx(losses["nccl"], rel=1e-6)
