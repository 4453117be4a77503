"""torchrun target of test_gloo.py: several configurations of examples/train_distributed.py in one
process group (one launch: the imports and the gloo rendezvous are paid once).

Usage: python -m torch.distributed.run --nproc_per_node 2 gloo_runs.py OUT.json NAME='--flag ...' ...
Rank 0 writes ``{NAME: RunResult as a dict}``.
"""

import json
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import torch.distributed as dist  # noqa: E402
import train_distributed  # noqa: E402  (sets TRITON_INTERPRET before any kernel import)


def main() -> None:
    out, *runs = sys.argv[1:]
    rank, world, device = train_distributed.init_distributed()
    results = {}
    try:
        for run in runs:
            name, flags = run.split("=", 1)
            result = train_distributed.train(train_distributed.parse_args(shlex.split(flags)), rank, world, device)
            results[name] = asdict(result)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
