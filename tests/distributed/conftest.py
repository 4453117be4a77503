"""Fixtures of the distributed tests."""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist
from dist_launch import free_port


@pytest.fixture
def world_of_one(device):
    """A process group of this process alone: NCCL on a GPU run, gloo on the CPU."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
