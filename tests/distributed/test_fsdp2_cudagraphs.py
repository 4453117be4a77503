"""FSDP2 with each decoder layer replayed as CUDA graphs (examples/train_distributed.py --parallel fsdp2
--regional --cudagraphs), in a world of one over NCCL."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import train_distributed  # noqa: E402

LAYERS = train_distributed.SIZES["tiny"]["num_hidden_layers"]


@pytest.mark.gpu
@pytest.mark.parametrize("reshard", ["", "--no-reshard-after-forward"])
def test_fsdp2_layers_replay_cuda_graphs_and_train_alike(reshard, world_of_one):
    """FSDP2 frees each layer's gathered parameters after its backward (and, by default, after its
    forward) and gathers them again: the graphs replay only if the parameters come back to the addresses
    they were recorded at. Every layer's forward and backward is recorded once, none is re-recorded, and
    the run trains to the losses of the same run without CUDA graphs."""
    common = f"--size tiny --batch 2 --seq 64 --steps 5 --dtype fp32 --parallel fsdp2 --backend twinkle --regional {reshard}"
    device = torch.device("cuda", torch.cuda.current_device())

    def run(flags: str) -> train_distributed.RunResult:
        return train_distributed.train(train_distributed.parse_args(f"{common} {flags}".split()), 0, 1, device)

    plain, graphs = run(""), run("--cudagraphs")
    assert len(set(plain.losses)) == len(plain.losses)
    assert graphs.losses == pytest.approx(plain.losses, abs=2e-3)
    (summary,) = graphs.cudagraphs
    recorded = re.search(r"(\d+) CUDA graph\(s\) recorded \((\d+) forward, (\d+) backward\)", summary)
    assert recorded, summary
    assert (int(recorded[2]), int(recorded[3])) == (LAYERS, LAYERS), summary
    assert "every compiled function recorded; 0 re-recording(s)" in summary, summary
