"""examples/train_distributed.py as a user runs it: torchrun, 2 CPU processes (gloo), the tiny Llama."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from dist_launch import launch

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
