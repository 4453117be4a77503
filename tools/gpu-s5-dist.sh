#!/usr/bin/env bash
# Session 5's 2-GPU call (nvidia-h200-x2, NCCL_NVLS_ENABLE=0), ~8 minutes: issue 19 with per-layer CUDA graphs.
# Session 4 found DDP steps host-bound (51 ms of kernels in a 119 ms step); --cudagraphs replays each compiled
# decoder layer. Runs (reference workload, bf16, 4 x 1024 per GPU, 10 steps, backend twinkle, fused-loss head):
#   single             1 GPU, whole model (the issue's speed baseline)
#   single-regional-cg 1 GPU, decoder layers compiled and replayed as CUDA graphs (batch 4; and batch 8 for the losses)
#   ddp-regional-b100     DDP x 2, regional, 100 MB buckets (session 4's best: 1.36x)
#   ddp-regional-cg-b100  the same with CUDA graphs
# Usage from the repo root: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s5-dist.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
export NCCL_NVLS_ENABLE=0
print_versions
shape=(--size reference --batch 4 --seq 1024 --steps 10)
ex=examples/train_distributed.py
two=(python3 -m torch.distributed.run --standalone --nproc_per_node 2 "$ex")
deadline=${DEADLINE:-540}
SECONDS=0
run single-regional-cg python3 "$ex" "${shape[@]}" --parallel none --backend twinkle --regional --cudagraphs --compare-single 2
base=(--baseline "$out/single-regional-cg.json")
run ddp-regional-cg-b100 "${two[@]}" "${shape[@]}" --parallel ddp --backend twinkle --regional --cudagraphs \
  --bucket-cap-mb 100 "${base[@]}"
run ddp-regional-b100 "${two[@]}" "${shape[@]}" --parallel ddp --backend twinkle --regional --bucket-cap-mb 100 "${base[@]}"
run single python3 "$ex" "${shape[@]}" --parallel none --backend twinkle
echo "done in $SECONDS s"
