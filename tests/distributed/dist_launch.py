"""What the gloo tests share: launching a torchrun target on 2 CPU processes, and, inside it, running
named cases and writing rank 0's results."""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
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


# The launched processes run on the CPU, also on a GPU machine (no GPU visible), one thread each on a shared
# machine; they inherit the run's TRITON_INTERPRET (a test whose processes run twinkle_triton kernels on the CPU
# needs the interpreter and is marked so: the GPU image's numpy is too new for triton 3.6's interpreter).
CPU_PROCESSES = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def launch(target: list[str], *, timeout: int, env: dict[str, str] | None = None,
           nproc_per_node: int = 2) -> subprocess.CompletedProcess:
    """``torchrun TARGET...`` on 2 processes with no GPU visible (gloo on the CPU; ``env`` may show GPUs). Fails
    the test with what the processes printed when they exit non-zero or outlive ``timeout`` seconds."""
    env = {**os.environ, **CPU_PROCESSES, **(env or {})}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc_per_node),
               "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), *target]
    # a session of its own: on a time-out the workers go with the launcher instead of living on as orphans
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()  # what they printed says where they were
            raise AssertionError(f"{' '.join(target)} ran past {timeout} s\n{stdout[-3000:]}\n{stderr[-6000:]}") \
                from None
    assert process.returncode == 0, stdout[-3000:] + stderr[-6000:]
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def launch_nodes(target: list[str], *, nodes: int, nproc_per_node: int, timeout: int,
                 env: dict[str, str] | None = None) -> list[str]:
    """``torchrun --nnodes NODES ... TARGET...`` started NODES times on this machine, each launch a "node" of
    ``nproc_per_node`` CPU processes (gloo), joined by a c10d rendezvous on a free localhost port. Returns each
    launch's stdout. Fails the test with every launch's output when one exits non-zero (the others are
    stopped at once instead of waiting on the rendezvous) or when they outlive ``timeout`` seconds."""
    import tempfile
    import time

    env = {**os.environ, **CPU_PROCESSES, **(env or {})}
    endpoint = f"127.0.0.1:{free_port()}"
    logs = Path(tempfile.mkdtemp(prefix="nodes-"))
    processes = []
    try:
        for node in range(nodes):
            # c10d numbers the nodes in the order they join (it ignores --node-rank and says so); the agent's
            # own address is given, so its workers never depend on what this host's name resolves to
            command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node",
                       str(nproc_per_node), "--node-rank", str(node), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                       endpoint, "--rdzv-id", "nodes-test", "--local-addr", "127.0.0.1", *target]
            # output to files (a full pipe would stall a launch nobody reads yet); a session of its own each,
            # so a launch stopped here takes its workers with it
            out, err = open(logs / f"{node}.out", "w"), open(logs / f"{node}.err", "w")
            processes.append(subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                              text=True, start_new_session=True))
            out.close(), err.close()
        deadline = time.monotonic() + timeout
        failure = ""
        while any(p.poll() is None for p in processes):
            failed = [n for n, p in enumerate(processes) if p.returncode not in (None, 0)]
            if failed:
                failure = f"node {failed[0]} exited with {processes[failed[0]].returncode}"
                break
            if time.monotonic() > deadline:
                failure = f"the {nodes} launches ran past {timeout} s"
                break
            time.sleep(0.2)
        failed = [n for n, p in enumerate(processes) if p.returncode not in (None, 0)]
        if failed and not failure:
            failure = f"node {failed[0]} exited with {processes[failed[0]].returncode}"
    finally:
        for p in processes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    outputs = [(logs / f"{n}.out").read_text() for n in range(len(processes))]
    errors = [(logs / f"{n}.err").read_text() for n in range(len(processes))]
    shutil.rmtree(logs, ignore_errors=True)
    if failure:
        tails = "\n".join(f"--- node {n} stdout\n{outputs[n][-2000:]}\n--- node {n} stderr\n{errors[n][-4000:]}"
                          for n in range(len(processes)))
        raise AssertionError(f"{' '.join(target)}: {failure}\n{tails}")
    return outputs


def torchrun(script: Path, out: Path, *args: str, timeout: int, env: dict[str, str] | None = None) -> dict:
    """``script OUT ARGS...`` through :func:`launch`; its JSON results."""
    launch([str(script), str(out), *args], timeout=timeout, env=env)
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
        # objects the cases left in reference cycles (a DDP reducer holds the group) go first: a DDP reducer
        # that dropped the group's last reference would wait for gloo's threads holding the GIL
        gc.collect()
        dist.destroy_process_group()
