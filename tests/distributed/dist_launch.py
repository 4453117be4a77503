"""What the gloo tests share: launching a torchrun target on 2 CPU processes, and, inside it, running
named cases and writing rank 0's results."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: Path, out: Path, *args: str, timeout: int, env: dict[str, str] | None = None) -> dict:
    """``script OUT ARGS...`` on 2 processes with no GPU visible (gloo on the CPU); its JSON results."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), str(script), str(out), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(out.read_text())


def run_cases(out: str, rank: int, cases: dict[str, Callable[[], Any]]) -> None:
    """Run each case on every rank (a barrier after each), then end the process group. Rank 0 writes
    ``{name: result}`` to ``out`` after every case, so a run stopped by a time limit keeps what finished."""
    results = {}
    try:
        for name, case in cases.items():
            results[name] = case()
            dist.barrier()
            if rank == 0:
                Path(out).write_text(json.dumps(results, indent=1))
    finally:
        dist.destroy_process_group()
