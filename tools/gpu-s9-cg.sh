#!/usr/bin/env bash
# Session 9's second one-GPU call (~9 minutes): the GPU suite, then FSDP2 with each layer replayed as CUDA
# graphs, interleaved in one process (world of one over NCCL, reference workload, bf16, 4 x 1024, AdamW
# fused, regional twinkle, STEPS steps a run). The first call (tools/gpu-s9-fsdp-one.sh) found FSDP2 at about
# twice the unwrapped step without CUDA graphs, host-bound. Runs:
#   none-cg   one device, CUDA graphs (the single-GPU reference)
#   fsdp      fully_shard per layer and the root, no CUDA graphs (the first call's best kind of run)
#   fsdp-cg   + --cudagraphs (the gathered parameters must come back to their recorded addresses)
#   keep-cg   + --no-reshard-after-forward
# then 3 profiled steps of `none-cg` and of `fsdp-cg`.
# Usage from the repo root: COMMIT=<sha> bash tools/gpu-s9-cg.sh    (RUNS="..." to choose, SUITE=0 to skip it)
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
print_versions
SECONDS=0
if [ "${SUITE:-240}" != 0 ]; then run_suite "${SUITE:-240}"; fi
c="--size reference --batch 4 --seq 1024 --steps ${STEPS:-20} --backend twinkle --regional --fused-adamw"
f="$c --parallel fsdp2"
declare -A flags=(
  [none-cg]="$c --parallel none --cudagraphs" [fsdp]="$f" [fsdp-cg]="$f --cudagraphs"
  [keep-cg]="$f --cudagraphs --no-reshard-after-forward"
)
runs=()
for name in ${RUNS:-none-cg fsdp fsdp-cg keep-cg none-cg fsdp-cg}; do
  runs+=("$name-$(( ${#runs[@]} + 1 ))=${flags[$name]}")
done
CAP=${CAP:-330} interleaved "none-prof=${flags[none-cg]}" "fsdpcg-prof=${flags[fsdp-cg]}" "${runs[@]}"
echo "done in $SECONDS s"
