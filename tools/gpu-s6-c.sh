#!/usr/bin/env bash
# Session 6's third H100 call (~300 s): why the TTIR memo misses (front-end runs per kernel and what differs
# between their keys), for the first compiled training step and the first compiled decode step, with
# Inductor's caches off so every row compiles from nothing (tools/compile_time_probe.py; issue 15).
# Usage on the GPU machine: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s6-c.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
export TORCHINDUCTOR_FORCE_DISABLE_CACHES=1
SECONDS=0
timeout 200 python3 tools/compile_time_probe.py --backends inductor+cudagraphs,twinkle+cudagraphs \
  --json "$out/compile-train.json" > "$out/compile-train.txt" 2>&1; echo "train probe exit $? at ${SECONDS} s"
grep -v "Warn\|warn" "$out/compile-train.txt" | grep "^== \|^compiler\|front-end\|differs\|dynamo" | grep -v "dynamo.*: 0\.\|dynamo.*: 1\." | head -70
timeout $(( 420 - SECONDS )) python3 tools/compile_time_probe.py --decode --batch 32 --seq 1024 \
  --backends inductor+cudagraphs,twinkle+cudagraphs --json "$out/compile-decode.json" > "$out/compile-decode.txt" 2>&1
echo "decode probe exit $? at ${SECONDS} s"
grep -v "Warn\|warn" "$out/compile-decode.txt" | grep "^== \|^compiler\|front-end\|differs\|dynamo\|pass " | grep -v "dynamo.*: 0\.\|dynamo.*: 1\." | head -60
