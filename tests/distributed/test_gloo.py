"""examples/train_distributed.py on 2 CPU processes (gloo), tiny Qwen2, fp32, Triton interpreter.

One torchrun launch runs four configurations (DDP and FSDP2, each compiled with backend="twinkle"
and its inner aot_eager, and eagerly kernelized); each must reproduce, step by step, the losses of
a single-process eager run over the same global batch, and every rank must report the swaps.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

# gloo runs CPU processes, so the kernels run through the Triton interpreter: not on a GPU run
pytestmark = pytest.mark.interpreter

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "examples"))
import train_distributed  # noqa: E402

STEPS = 3
COMMON = f"--size tiny --batch 1 --seq 8 --steps {STEPS} --dtype fp32"
RUNS = {
    # 1 MB buckets split the 4 MB model: DDPOptimizer hands the backend one subgraph per bucket
    "ddp_twinkle": f"{COMMON} --parallel ddp --backend twinkle --compiler aot_eager --bucket-cap-mb 1",
    "ddp_kernelize": f"{COMMON} --parallel ddp --backend kernelize",
    "fsdp2_kernelize": f"{COMMON} --parallel fsdp2 --backend kernelize",
    "fsdp2_twinkle": f"{COMMON} --parallel fsdp2 --backend twinkle --compiler aot_eager",
    "ddp_kernelize_twinkle": f"{COMMON} --parallel ddp --backend kernelize+twinkle --compiler aot_eager",
}
LAYERS = train_distributed.SIZES["tiny"]["num_hidden_layers"]
ROTARY = "function transformers.models.qwen2.modeling_qwen2.apply_rotary_pos_emb"
RMSNORM = "layer Qwen2RMSNorm -> RMSNorm"
MLP = "layer Qwen2MLP -> SwiGLUMLP"
EAGER_SWAPS = {"kernelized Qwen2RMSNorm -> RMSNorm": 2 * LAYERS + 1, "kernelized Qwen2MLP -> SwiGLUMLP": LAYERS,
               "patched transformers.models.qwen2.modeling_qwen2.apply_rotary_pos_emb": 1}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def distributed(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gloo") / "runs.json"
    # no GPU visible: train_distributed then takes gloo on the CPU even on a machine with one
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(_free_port()), str(HERE / "gloo_runs.py"), str(out),
               *(f"{name}={flags}" for name, flags in RUNS.items())]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def single_process() -> list[float]:
    """Eager, no kernels, one process over the global batch (2 rows): the reference losses."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        args = train_distributed.parse_args(f"{COMMON} --batch 2 --backend eager".split())
        return train_distributed.train(args, 0, 1, torch.device("cpu")).losses
    finally:
        dist.destroy_process_group()


def _swaps(result: dict) -> list[dict]:
    assert [s["rank"] for s in result["swaps"]] == [0, 1]
    return result["swaps"]


@pytest.mark.parametrize("name", list(RUNS))
def test_losses_equal_single_process(distributed, single_process, name):
    losses = distributed[name]["losses"]
    assert distributed[name]["world_size"] == 2 and len(losses) == STEPS
    assert len(set(single_process)) == STEPS  # the model trains: each step's loss differs
    assert losses == pytest.approx(single_process, abs=1e-4), (name, losses, single_process)


def test_ddp_twinkle_swaps_in_every_bucket_subgraph(distributed):
    """DDPOptimizer splits the graph at the 1 MB bucket boundaries; the rewrite still applies in each
    subgraph. A layer cut by a boundary cannot become one kernel call: it is kept, with the reason."""
    rank0, rank1 = _swaps(distributed["ddp_twinkle"])
    assert {k: v for k, v in rank0.items() if k != "rank"} == {k: v for k, v in rank1.items() if k != "rank"}
    assert rank0["graphs"] >= 3 and rank0["graph_breaks"] == rank0["graphs"]  # DDPOptimizer's splits
    assert rank0["graphs_with_swaps"] == rank0["graphs"]
    assert rank0["swapped"][RMSNORM] == 2 * LAYERS + 1
    assert rank0["swapped"][ROTARY] == LAYERS
    # one MLP is cut by a bucket boundary: its two halves land in two subgraphs, each kept
    assert rank0["swapped"][MLP] == LAYERS - 1
    kept_mlps = sum(n for what, n in rank0["kept"].items() if what.startswith(MLP))
    # the fused-loss head bound to the compiled module is reported, not silently dropped
    kept_head = sum(n for what, n in rank0["kept"].items() if "CausalLMFusedLoss: the module being compiled" in what)
    assert kept_mlps == 2 and kept_head >= 1, rank0["kept"]
    assert sum(rank0["kept"].values()) == kept_mlps + kept_head, rank0["kept"]


@pytest.mark.parametrize("name", ["ddp_kernelize", "fsdp2_kernelize"])
def test_kernelize_swaps_on_every_rank(distributed, name):
    head = "Qwen2ForCausalLM" if name.startswith("ddp") else "FSDPQwen2ForCausalLM"  # fully_shard's subclass
    for swaps in _swaps(distributed[name]):
        assert swaps["swapped"] == EAGER_SWAPS | {f"kernelized {head} -> CausalLMFusedLoss": 1}, swaps


def test_kernelize_then_twinkle_swaps_on_every_rank(distributed):
    """Eager swaps first (the fused-loss head among them); the backend finds those layers already
    kernelized (their kernels are in the graph) and swaps nothing twice."""
    for swaps in _swaps(distributed["ddp_kernelize_twinkle"]):
        assert swaps["swapped"] == EAGER_SWAPS | {"kernelized Qwen2ForCausalLM -> CausalLMFusedLoss": 1}, swaps
        assert all("already kernelized eagerly" in reason for reason in swaps["kept"]), swaps["kept"]


def test_fsdp2_twinkle_swaps_on_every_rank(distributed):
    """FSDP2's hooks end Dynamo's graphs at each fully_shard module; identical decoder layers share
    one compiled graph, so one decoder layer's swaps stand for all of them."""
    rank0, rank1 = _swaps(distributed["fsdp2_twinkle"])
    assert {k: v for k, v in rank0.items() if k != "rank"} == {k: v for k, v in rank1.items() if k != "rank"}
    assert rank0["graphs"] > 1
    assert rank0["swapped"] == {RMSNORM: 2, MLP: 1, ROTARY: 1}
