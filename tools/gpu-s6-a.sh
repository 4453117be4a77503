#!/usr/bin/env bash
# Session 6's first H100 call (~560 s): where twinkle's first compiled training step spends the time
# Inductor's does not (tools/compile_time_probe.py), whether Triton compiles in parallel from threads,
# and the compiled inference rows with fused projections and with Inductor's freezing (issue 15).
# Usage on the GPU machine: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s6-a.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
SECONDS=0
timeout 60 python3 tools/triton_compile_threads_probe.py 2>&1 | tail -2; echo "threads probe at ${SECONDS} s"
timeout 240 python3 tools/compile_time_probe.py --backends inductor+cudagraphs,twinkle+cudagraphs \
  --json "$out/compile-time.json" > "$out/compile-time.txt" 2>&1; echo "compile probe exit $? at ${SECONDS} s"
grep -v "Warn\|warn" "$out/compile-time.txt" | grep -A60 "^== " | head -90
for run in "plain:inductor+cudagraphs,twinkle+cudagraphs:{}" "fused:twinkle+cudagraphs:{\"fuse_projections\": true}" \
           "freezing:twinkle+cudagraphs:{\"inductor\": {\"freezing\": true}}"; do
  name=${run%%:*}; rest=${run#*:}; backends=${rest%%:*}; opts=${rest#*:}
  left=$(( 580 - SECONDS )); [ "$left" -lt 40 ] && { echo "no time left for $name"; break; }
  timeout $left python3 -m twinkle_fx bench --inference --backends "$backends" --twinkle-options "$opts" \
    --steps 20 --warmup 3 --out "$out/inf-$name" > "$out/inf-$name.txt" 2>&1; echo "inference $name exit $? at ${SECONDS} s"
  grep -v "UserWarning\|warn" "$out/inf-$name.txt" | sed -n '/^backend/,$p' | head -6
done
