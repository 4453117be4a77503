#!/usr/bin/env bash
# Session 5, second call (~420 s on an H100): the test files the first call failed on, then the compiled
# inference rows of the harness (issue 15) and the twinkle row with fused projections.
# Usage on the GPU machine: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s5-a2.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
SECONDS=0
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 tests/compile/test_gqa_attention_rewrite.py \
  tests/compile/test_compile_transformers.py tests/test_packaging.py tests/readme tests/kernels/test_triton_gqa_attention.py \
  > "$out/gpu-pytest-part.log" 2>&1
echo "tests exit $? at ${SECONDS} s"; grep -E "^(FAILED|ERROR)" "$out/gpu-pytest-part.log" | head; tail -1 "$out/gpu-pytest-part.log"
timeout 300 python3 -m twinkle_fx bench --inference --backends inductor,inductor+cudagraphs,twinkle,twinkle+cudagraphs \
  --steps 20 --warmup 3 --out "$out/inf" > "$out/inf.txt" 2>&1; echo "inference bench exit $? at ${SECONDS} s"
grep -v "UserWarning\|warn" "$out/inf.txt" | sed -n '/^backend/,$p' | head -30
left=$(( 570 - SECONDS ))
[ $left -gt 60 ] && timeout $left python3 -m twinkle_fx bench --inference --backends twinkle+cudagraphs --steps 20 \
  --warmup 3 --twinkle-options '{"fuse_projections": true}' --out "$out/inf-fused" > "$out/inf-fused.txt" 2>&1
echo "fused inference bench exit $? at ${SECONDS} s"; grep -v "UserWarning\|warn" "$out/inf-fused.txt" | sed -n '/^backend/,$p' | head -12
