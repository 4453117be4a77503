"""torchrun target of test_distributed_bench.py: several configurations of twinkle_fx.bench.distributed in one
process group (one launch: the imports and the gloo rendezvous are paid once).

Usage: python -m torch.distributed.run --nproc_per_node 2 distributed_bench_runs.py OUT.json NAME='--flag ...' ...
Rank 0 writes ``{NAME: RunResult as a dict}``.
"""

import functools
import shlex
import sys
from dataclasses import asdict

import twinkle_fx.bench.distributed as distributed_bench
from dist_launch import run_cases  # this folder is the script's: first on sys.path


def main() -> None:
    out, *runs = sys.argv[1:]
    rank, world, device = distributed_bench.init_distributed()

    def one(flags: str) -> dict:
        return asdict(distributed_bench.train(distributed_bench.parse_args(shlex.split(flags)), rank, world, device))

    run_cases(out, rank, {name: functools.partial(one, flags) for name, flags in (r.split("=", 1) for r in runs)})


if __name__ == "__main__":
    main()
