#!/usr/bin/env bash
# Session 5, first GPU call (~560 s on an H100): the whole suite on CUDA, the grouped-query attention
# kernel against SDPA (tools/gqa_attention_bench.py), then the compiled inference rows of the harness
# (issue 15: prefill now runs causal flash attention, decode the GQA kernel) and the same twinkle row
# with fused projections.
# Usage on the GPU machine: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s5-a.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
print_versions
SECONDS=0
run_suite 230
timeout 90 python3 tools/gqa_attention_bench.py --out "$out/gqa-bench.json" > "$out/gqa-bench.txt" 2>&1; echo "gqa bench exit $? at ${SECONDS} s"
tail -40 "$out/gqa-bench.txt"
timeout 200 python3 -m twinkle_fx bench --inference --backends inductor+cudagraphs,twinkle+cudagraphs --steps 20 \
  --warmup 3 --out "$out/inf" > "$out/inf.txt" 2>&1; echo "inference bench exit $? at ${SECONDS} s"
grep -v "UserWarning\|warn" "$out/inf.txt" | tail -16
left=$(( 570 - SECONDS ))
[ $left -gt 60 ] && timeout $left python3 -m twinkle_fx bench --inference --backends twinkle+cudagraphs --steps 20 \
  --warmup 3 --twinkle-options '{"fuse_projections": true}' --out "$out/inf-fused" > "$out/inf-fused.txt" 2>&1
echo "fused inference bench exit $? at ${SECONDS} s"; grep -v "UserWarning\|warn" "$out/inf-fused.txt" | tail -8
