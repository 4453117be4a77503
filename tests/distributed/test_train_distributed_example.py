"""examples/train_distributed.py as a user runs it: torchrun, 2 CPU processes (gloo), the tiny Llama."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from dist_launch import launch, launch_nodes

# gloo runs CPU processes, so the kernels run through the Triton interpreter: not on a GPU run
pytestmark = pytest.mark.interpreter

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_distributed.py"


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["fsdp2", "ddp"])
def test_example_trains_on_two_processes(parallel):
    steps = 3
    done = launch([str(EXAMPLE), "--tiny", "--parallel", parallel, "--steps", str(steps)], timeout=300)
    # rank 0 alone prints one line a step
    found = re.findall(r"^step (\d+)  loss (\S+)  ([\d,]+) tokens/s$", done.stdout, re.MULTILINE)
    assert [int(step) for step, _, _ in found] == list(range(steps)), done.stdout
    losses = [float(loss) for _, loss, _ in found]
    assert all(math.isfinite(x) for x in losses) and losses[0] == pytest.approx(math.log(256), rel=0.1), losses
    assert all(int(rate.replace(",", "")) > 0 for _, _, rate in found)


@pytest.mark.slow
def test_example_runs_hsdp_on_two_nodes():
    """--replicate 2 on 2 "nodes" of 2 processes (two torchrun launches, c10d rendezvous on localhost): the
    example's HSDP mesh trains and rank 0 reports every step."""
    steps = 2
    outputs = launch_nodes([str(EXAMPLE), "--tiny", "--parallel", "fsdp2", "--replicate", "2", "--steps", str(steps)],
                           nodes=2, nproc_per_node=2, timeout=300)
    found = [re.findall(r"^step (\d+)  loss (\S+)  ([\d,]+) tokens/s$", text, re.MULTILINE) for text in outputs]
    rank0 = next(lines for lines in found if lines)
    assert [int(step) for step, _, _ in rank0] == list(range(steps)), outputs
    assert all(math.isfinite(float(loss)) for _, loss, _ in rank0)
