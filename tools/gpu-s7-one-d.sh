#!/usr/bin/env bash
# Session 7's fourth one-GPU call (~4 minutes): DDP's own cost, interleaved. The earlier calls of the day put
# DDP in a world of one at 50 to 70 ms against 48 to 50 ms unwrapped, in separate processes on a noisy host;
# here one process runs unwrapped, DDP, and DDP with --tied-embedding-ddp in turn, three rounds (each run
# compiles again; the Inductor cache makes that short), regional + CUDA graphs, 12 steps each.
# ROUNDS=N (default 3); TESTS=1 then runs the tied-embedding tests and the README blocks (at most 120 s).
# Usage from the repo root: COMMIT=<sha> bash tools/gpu-s7-one-d.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
print_versions
SECONDS=0
c="--size reference --batch 4 --seq 1024 --steps 12 --backend twinkle --regional --cudagraphs"
runs=()
for round in $(seq "${ROUNDS:-3}"); do
  runs+=("none$round=$c --parallel none" "ddp$round=$c --parallel ddp --bucket-cap-mb 100"
         "tied$round=$c --parallel ddp --bucket-cap-mb 100 --tied-embedding-ddp")
done
timeout 400 python3 -m torch.distributed.run --standalone --nproc_per_node 1 tests/distributed/gloo_runs.py \
  "$out/interleaved.json" "${runs[@]}" > "$out/interleaved.log" 2>&1; echo "exit $? at $SECONDS s"
python3 tools/interleaved_summary.py "$out/interleaved.json"
if [ -n "${TESTS:-}" ]; then
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/distributed/test_tied_embedding.py tests/readme 2>&1 | tail -2
fi
echo "done in $SECONDS s"
