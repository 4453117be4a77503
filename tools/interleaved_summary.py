"""One line per run of a ``tests/distributed/gloo_runs.py`` JSON (the interleaved GPU calls, tools/gpu-s*-one*.sh):
the median step of steps 3+ with the fastest and slowest, rank 0's peak memory, the compiled graphs, the
first and last loss; under it, for --cudagraphs runs, rank 0's CUDA-graph trees (recorded, re-recorded).

    python tools/interleaved_summary.py gpu-out/interleaved.json
"""

import json
import statistics
import sys


def main() -> None:
    runs = json.load(open(sys.argv[1]))
    for name, r in runs.items():
        steady = r["step_ms"][2:] or r["step_ms"]
        print(f"{name:14s} median {statistics.median(steady):6.1f} ms  min {min(steady):6.1f}  max {max(steady):6.1f}  "
              f"peak {r['peak_gib'][0] or 0:.2f} GiB  graphs {r['swaps'][0]['graphs']}  "
              f"losses {r['losses'][0]:.4f} .. {r['losses'][-1]:.4f}")
        for graphs in r.get("cudagraphs", [])[:1]:
            print(f"{'':14s} {graphs}")


if __name__ == "__main__":
    main()
