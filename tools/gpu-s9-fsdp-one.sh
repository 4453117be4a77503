#!/usr/bin/env bash
# The next one-GPU call (~8 minutes) while no 2-GPU machine is lent: FSDP2's own cost in a world of one over
# NCCL (no communication that takes time), as tools/gpu-s8-one.sh measured DDP's. FSDP2 cannot replay CUDA
# graphs (it re-gathers the parameters into new memory every step), so the baseline is the unwrapped regional
# run without them. Interleaved in one process, reference workload, bf16, 4 x 1024, STEPS steps a run:
#   none        one device, regional (no CUDA graphs), default AdamW
#   none-fused  the same with AdamW(fused=True)
#   fsdp        fully_shard per layer and the root, regional, default AdamW (multi-tensor over DTensors)
#   fused       + --fused-adamw (on the CPU, 2 x 4-layer tiny runs: 475 DTensor dispatches a step become 76)
#   keep        + --no-reshard-after-forward
#   ddp         DDP's recipe without CUDA graphs, for the same comparison
# then 3 profiled steps of `none-fused` and of `keep` (tools/profile_summary.py compares them).
# Usage from the repo root: COMMIT=<sha> bash tools/gpu-s9-fsdp-one.sh    (RUNS="none fsdp ..." to choose)
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
print_versions
SECONDS=0
c="--size reference --batch 4 --seq 1024 --steps ${STEPS:-20} --backend twinkle --regional"
f="$c --parallel fsdp2"
declare -A flags=(
  [none]="$c --parallel none" [none-fused]="$c --parallel none --fused-adamw"
  [fsdp]="$f" [fused]="$f --fused-adamw" [keep]="$f --fused-adamw --no-reshard-after-forward"
  [ddp]="$c --parallel ddp --bucket-cap-mb 100 --grad-as-bucket-view --ddp-comm-hook allreduce --no-broadcast-buffers --ddp-static-graph --fused-adamw"
)
runs=()
for name in ${RUNS:-none-fused fsdp fused keep ddp none none-fused keep}; do
  runs+=("$name-$(( ${#runs[@]} + 1 ))=${flags[$name]}")
done
interleaved "none-prof=${flags[none-fused]}" "keep-prof=${flags[keep]}" "${runs[@]}"
if [ -n "${SUITE:-}" ]; then run_suite "$SUITE"; fi
echo "done in $SECONDS s"
