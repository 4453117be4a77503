#!/usr/bin/env bash
# Session 4, first GPU call: `twinkle-fx check` over the built-in kernels with its defaults (issue 11's GPU
# table), then `twinkle-fx bench --micro` of the ops on the eager hot path and the fused-loss head (host us per
# call for issue 14; the fused-loss rows with Liger and Cut Cross-Entropy beside them for issue 16).
# Usage on the GPU machine: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s4-check.sh [check_s] [micro_s]
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
start=$(date +%s)
timeout "${1:-400}" python3 -m twinkle_fx check --out "$out/check.json" > "$out/check.txt" 2>&1; echo "check exit $? after $(( $(date +%s) - start )) s"
grep -v "UserWarning\|_warn_once\|warnings.warn" "$out/check.txt" | tail -80
start=$(date +%s)
timeout "${2:-150}" python3 -m twinkle_fx bench --micro --ops rms_norm,add_rms_norm,silu_mul,apply_rotary_pos_emb,fused_linear_cross_entropy \
  --out "$out/micro" > "$out/micro.txt" 2>&1; echo "micro exit $? after $(( $(date +%s) - start )) s"
grep -v "UserWarning\|_warn_once\|warnings.warn" "$out/micro.txt" | tail -60
