#!/usr/bin/env bash
# Session 5's profile call (~250 s on an H100): plain Inductor and twinkle+cudagraphs training in one run
# (first-step time against plain Inductor) with a profile of each, summarised by category
# (GEMM, attention, twinkle kernels, Inductor kernels, other; tools/profile_summary.py).
# Usage on the GPU machine: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s5-profile.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
SECONDS=0
timeout 270 python3 -m twinkle_fx bench --backends inductor,twinkle+cudagraphs --steps 5 --warmup 2 \
  --profile /tmp/prof --out "$out/train" > "$out/train.txt" 2>&1; echo "train bench exit $? at ${SECONDS} s"
grep -v "UserWarning\|warn" "$out/train.txt" | sed -n '/^backend/,/^$/p' | head -6
python3 tools/profile_summary.py /tmp/prof/inductor/profile_trace.json /tmp/prof/twinkle+cudagraphs/profile_trace.json \
  > "$out/profile-summary.txt" 2>&1; head -60 "$out/profile-summary.txt"
