#!/usr/bin/env bash
# Session 5, fourth call (~400 s on an H100): why the training harness row showed no causal-mask rewrite
# (tools/causal_mask_probe.py, training and prefill), then the compiled inference rows with CUDA graphs.
# Usage on the GPU machine: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s5-c.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
SECONDS=0
timeout 100 python3 tools/causal_mask_probe.py 2>&1 | grep -v "Warn\|warn" | tail -8; echo "probe (train) at ${SECONDS} s"
timeout 80 python3 tools/causal_mask_probe.py --inference 2>&1 | grep -v "Warn\|warn" | tail -6; echo "probe (prefill) at ${SECONDS} s"
timeout $(( 560 - SECONDS )) python3 -m twinkle_fx bench --inference --backends inductor+cudagraphs,twinkle+cudagraphs \
  --steps 20 --warmup 3 --out "$out/inf" > "$out/inf.txt" 2>&1; echo "inference bench exit $? at ${SECONDS} s"
grep -v "UserWarning\|warn" "$out/inf.txt" | sed -n '/^backend/,$p' | head -24
