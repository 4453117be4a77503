#!/usr/bin/env bash
# Session 5, second GPU call (~560 s on an H100): compiled training through the harness (issue 15:
# attention now causal flash on unrepeated K/V under the twinkle backend), Inductor and Inductor with
# CUDA graphs as the baselines of the same run, then the eager inference rows (issue 14).
# Usage on the GPU machine: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s5-b.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
SECONDS=0
timeout 330 python3 -m twinkle_fx bench --backends inductor,inductor+cudagraphs,twinkle+cudagraphs,twinkle --steps 10 \
  --warmup 2 --out "$out/train" > "$out/train.txt" 2>&1; echo "train bench exit $? at ${SECONDS} s"
grep "^\[" "$out/train.txt" | grep -v "fresh model"; sed -n '/^backend /,/^$/p' "$out/train.txt"
left=$(( 575 - SECONDS ))
[ $left -gt 60 ] && timeout $left python3 -m twinkle_fx bench --inference --backends eager,kernelize,kernelize+cudagraphs \
  --out "$out/inf-eager" > "$out/inf-eager.txt" 2>&1
echo "eager inference bench exit $? at ${SECONDS} s"; grep -v "UserWarning\|warn" "$out/inf-eager.txt" | tail -14
