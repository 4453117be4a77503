"""torchrun target of test_gloo.py: several configurations of examples/train_distributed.py in one
process group (one launch: the imports and the gloo rendezvous are paid once).

Usage: python -m torch.distributed.run --nproc_per_node 2 gloo_runs.py OUT.json NAME='--flag ...' ...
Rank 0 writes ``{NAME: RunResult as a dict}``.
"""

import functools
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import train_distributed  # noqa: E402  (sets TRITON_INTERPRET before any kernel import)
from dist_launch import run_cases  # noqa: E402  (this folder is the script's: first on sys.path)


def main() -> None:
    out, *runs = sys.argv[1:]
    rank, world, device = train_distributed.init_distributed()

    def one(flags: str) -> dict:
        return asdict(train_distributed.train(train_distributed.parse_args(shlex.split(flags)), rank, world, device))

    run_cases(out, rank, {name: functools.partial(one, flags) for name, flags in (r.split("=", 1) for r in runs)})


if __name__ == "__main__":
    main()
