#!/usr/bin/env bash
# Session 8's one-GPU call (~9 minutes): where DDP's own cost in a world of one goes, interleaved in one
# process (regional + CUDA graphs, reference workload, bf16, 4 x 1024, STEPS steps a run).
# Session 7 measured DDP at +9 ms (53 vs 44 ms) with no communication; its profile showed 291 zero_() and
# 291 add_() a step (one per parameter) on the unwrapped step's host, and DDPOptimizer cut every layer's
# graph in two under DDP. Runs (`twinkle` unless named `ind-`):
#   none      one device, the graphs' gradients handed over (no buffer, no add per parameter)
#   kept      one device, a zeroed .grad buffer per parameter (session 7's baseline, now zeroed by one foreach)
#   ddp       DDP, 100 MB buckets (compile_layers now keeps each layer one graph)
#   hook      + gradient_as_bucket_view + the built-in all-reduce comm hook (one division per bucket)
#   nobb      + broadcast_buffers=False
#   static    + static_graph
#   tied      + --tied-embedding-ddp
#   ind-split / ind-whole   Inductor's layers under DDP, with DDPOptimizer's split and without
# then 3 profiled steps of `none` and of `static` (tools/profile_summary.py compares them).
# Usage from the repo root: COMMIT=<sha> bash tools/gpu-s8-one.sh    (RUNS="none ddp ..." to choose)
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
print_versions
SECONDS=0
c="--size reference --batch 4 --seq 1024 --steps ${STEPS:-30} --regional --cudagraphs"
d="$c --backend twinkle --parallel ddp --bucket-cap-mb 100"
declare -A flags=(
  [none]="$c --backend twinkle --parallel none" [kept]="$c --backend twinkle --parallel none --persistent-grads"
  [ddp]="$d" [hook]="$d --grad-as-bucket-view --ddp-comm-hook allreduce"
  [nobb]="$d --grad-as-bucket-view --ddp-comm-hook allreduce --no-broadcast-buffers"
  [static]="$d --grad-as-bucket-view --ddp-comm-hook allreduce --no-broadcast-buffers --ddp-static-graph"
  [tied]="$d --grad-as-bucket-view --ddp-comm-hook allreduce --no-broadcast-buffers --ddp-static-graph --tied-embedding-ddp"
  [ind-split]="$c --backend inductor --parallel ddp --bucket-cap-mb 100 --optimize-ddp ddp_optimizer"
  [ind-whole]="$c --backend inductor --parallel ddp --bucket-cap-mb 100 --optimize-ddp no_optimization"
)
runs=()
for name in ${RUNS:-none kept ddp hook nobb static ind-split ind-whole none ddp static}; do
  runs+=("$name-$(( ${#runs[@]} + 1 ))=${flags[$name]}")
done
interleaved "none-prof=${flags[none]}" "static-prof=${flags[static]}" "${runs[@]}"
if [ -n "${SUITE:-}" ]; then run_suite "$SUITE"; fi
echo "done in $SECONDS s"
