#!/usr/bin/env bash
# Session 5, third call (~560 s on an H100): the test files earlier calls failed on, the compiled inference
# rows (issue 15: prefill with causal flash attention, decode with the GQA kernel) and compiled training
# (Inductor and Inductor + CUDA graphs as the baselines of the same run).
# Usage on the GPU machine: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s5-b.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
SECONDS=0
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 8 tests/compile/test_gqa_attention_rewrite.py \
  tests/compile/test_compile_transformers.py tests/readme tests/kernels/test_triton_gqa_attention.py \
  > "$out/gpu-pytest-part.log" 2>&1
echo "tests exit $? at ${SECONDS} s"; grep -E "^(FAILED|ERROR)" "$out/gpu-pytest-part.log" | head; tail -1 "$out/gpu-pytest-part.log"
timeout 200 python3 -m twinkle_fx bench --inference --backends inductor+cudagraphs,twinkle,twinkle+cudagraphs \
  --steps 20 --warmup 3 --out "$out/inf" > "$out/inf.txt" 2>&1; echo "inference bench exit $? at ${SECONDS} s"
grep -v "UserWarning\|warn" "$out/inf.txt" | sed -n '/^backend/,$p' | head -24
left=$(( 585 - SECONDS ))
timeout $left python3 -m twinkle_fx bench --backends inductor,inductor+cudagraphs,twinkle+cudagraphs --steps 10 \
  --warmup 2 --out "$out/train" > "$out/train.txt" 2>&1; echo "train bench exit $? at ${SECONDS} s"
grep -v "UserWarning\|warn" "$out/train.txt" | sed -n '/^backend/,$p' | head -30
