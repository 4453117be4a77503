#!/usr/bin/env bash
# Session 6's closing H100 call (~590 s): the whole suite on CUDA, then compiled training (inductor,
# inductor+cudagraphs, twinkle+cudagraphs) and compiled inference (inductor+cudagraphs, twinkle+cudagraphs)
# through the harness, each with its baselines in the same run (issue 15: speed, memory, first step).
# Usage on the GPU machine: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s6-d.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
print_versions
SECONDS=0
run_suite 170
timeout 250 python3 -m twinkle_fx bench --backends inductor,inductor+cudagraphs,twinkle+cudagraphs --steps 10 \
  --warmup 2 --out "$out/train" > "$out/train.txt" 2>&1; echo "train bench exit $? at ${SECONDS} s"
grep -v "UserWarning\|warn" "$out/train.txt" | sed -n '/^backend/,/^$/p' | head -6
timeout $(( 590 - SECONDS )) python3 -m twinkle_fx bench --inference --backends inductor+cudagraphs,twinkle+cudagraphs \
  --steps 20 --warmup 3 --out "$out/inf" > "$out/inf.txt" 2>&1; echo "inference bench exit $? at ${SECONDS} s"
grep -v "UserWarning\|warn" "$out/inf.txt" | sed -n '/^backend/,$p' | head -8
