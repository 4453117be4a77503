#!/usr/bin/env bash
# Session 7's fifth one-GPU call (~4 minutes), run at 6320250: tied_embedding_ddp with its end-of-backward exchange
# made sync-free (counts on a gloo twin group, segment sums instead of torch.unique; reverted after, no better). As gpu-s7-one-d:
# one process, unwrapped / DDP / tied DDP in turn, two rounds, then the README block and the tied tests.
# Usage from the repo root: COMMIT=<sha> bash tools/gpu-s7-one-e.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
print_versions
SECONDS=0
c="--size reference --batch 4 --seq 1024 --steps 12 --backend twinkle --regional --cudagraphs"
runs=()
for round in 1 2; do
  runs+=("none$round=$c --parallel none" "ddp$round=$c --parallel ddp --bucket-cap-mb 100"
         "tied$round=$c --parallel ddp --bucket-cap-mb 100 --tied-embedding-ddp")
done
timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node 1 tests/distributed/gloo_runs.py \
  "$out/interleaved.json" "${runs[@]}" > "$out/interleaved.log" 2>&1; echo "exit $? at $SECONDS s"
python3 - "$out/interleaved.json" <<'PY'
import json, statistics, sys
runs = json.load(open(sys.argv[1]))
for name, r in runs.items():
    steady = r["step_ms"][2:]
    print(f"{name:6s} median {statistics.median(steady):6.1f} ms  min {min(steady):6.1f}  max {max(steady):6.1f}  "
          f"peak {r['peak_gib'][0]:.2f} GiB")
PY
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/distributed/test_tied_embedding.py tests/readme 2>&1 | tail -2
echo "done in $SECONDS s"
