#!/usr/bin/env bash
# Session 5's last H100 call (~580 s): the whole suite on CUDA, what the attention pass does with the reference
# workload's mask, then, alone on the GPU, the compiled inference rows (prefill and decode) and compiled
# training, each against Inductor with CUDA graphs in the same run (issue 15).
# Usage on the GPU machine: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s5-final.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
print_versions
SECONDS=0
run_suite 170
timeout 60 python3 tools/causal_mask_probe.py --inference 2>&1 | grep -v "Warn\|warn" | tail -3; echo "probe at ${SECONDS} s"
timeout 200 python3 -m twinkle_fx bench --inference --backends inductor+cudagraphs,twinkle+cudagraphs \
  --steps 20 --warmup 3 --out "$out/inf" > "$out/inf.txt" 2>&1; echo "inference bench exit $? at ${SECONDS} s"
grep -v "UserWarning\|warn" "$out/inf.txt" | sed -n '/^backend/,$p' | head -8
timeout $(( 580 - SECONDS )) python3 -m twinkle_fx bench --backends inductor+cudagraphs,twinkle+cudagraphs --steps 10 \
  --warmup 2 --out "$out/train" > "$out/train.txt" 2>&1; echo "train bench exit $? at ${SECONDS} s"
grep -v "UserWarning\|warn" "$out/train.txt" | sed -n '/^backend/,$p' | head -8
