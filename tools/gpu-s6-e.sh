#!/usr/bin/env bash
# Session 6's eager call (~300 s on an H100): kernelize_model without and with CUDA graphs against HF eager,
# training (profiled: host us per kernel call) and inference (prefill, decode), each with its baseline in
# the same run (issue 14).
# Usage on the GPU machine: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s6-e.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
SECONDS=0
timeout 200 python3 -m twinkle_fx bench --backends eager,kernelize,kernelize+cudagraphs --steps 10 --warmup 3 \
  --profile /tmp/prof --out "$out/eager-train" > "$out/eager-train.txt" 2>&1; echo "train bench exit $? at ${SECONDS} s"
grep -v "UserWarning\|warn" "$out/eager-train.txt" | sed -n '/^backend/,$p' | head -16
timeout $(( 330 - SECONDS )) python3 -m twinkle_fx bench --inference --backends eager,kernelize,kernelize+cudagraphs --steps 20 \
  --warmup 3 --out "$out/eager-inf" > "$out/eager-inf.txt" 2>&1; echo "inference bench exit $? at ${SECONDS} s"
grep -v "UserWarning\|warn" "$out/eager-inf.txt" | sed -n '/^backend/,$p' | head -10
timeout $(( 390 - SECONDS )) python3 docs/perf/host_breakdown.py > "$out/host-breakdown.txt" 2>&1; echo "host breakdown exit $? at ${SECONDS} s"
head -40 "$out/host-breakdown.txt"
