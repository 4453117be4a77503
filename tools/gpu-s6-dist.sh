#!/usr/bin/env bash
# Session 6's 2-GPU call (nvidia-h200-x2, NCCL_NVLS_ENABLE=0), ~7 minutes: issue 19 (not run in session 6: no
# 2-GPU machine was lent). First what NCCL's
# all-reduce does on this host alone and beside GEMMs (tools/allreduce_probe.py), then the per-layer
# CUDA-graph DDP run of session 5 (1.42x) against the same with DDP's static graph and gradients as
# bucket views, and FSDP2 in bf16 without and with fused AdamW, each against the single-GPU regional
# CUDA-graph run of the same call.
# Reference workload, bf16, 4 x 1024 per GPU, 15 steps, backend twinkle, fused-loss head.
# Usage from the repo root: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s6-dist.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
export NCCL_NVLS_ENABLE=0
print_versions
nvidia-smi topo -m 2>/dev/null | head -4
shape=(--size reference --batch 4 --seq 1024 --steps 15)
ex=examples/train_distributed.py
two=(python3 -m torch.distributed.run --standalone --nproc_per_node 2 "$ex")
deadline=${DEADLINE:-450}
RUN_CAP=120
SECONDS=0
timeout 60 python3 -m torch.distributed.run --standalone --nproc_per_node 2 tools/allreduce_probe.py --sizes-mb 100,1000 \
  --json "$out/allreduce.json" 2>&1 | grep "all-reduce"; echo "probe at ${SECONDS} s"
run single-regional-cg python3 "$ex" "${shape[@]}" --parallel none --backend twinkle --regional --cudagraphs --compare-single 2
base=(--baseline "$out/single-regional-cg.json")
run ddp-regional-cg-b100 "${two[@]}" "${shape[@]}" --parallel ddp --backend twinkle --regional --cudagraphs \
  --bucket-cap-mb 100 "${base[@]}"
run ddp-regional-cg-b100-static-view "${two[@]}" "${shape[@]}" --parallel ddp --backend twinkle --regional --cudagraphs \
  --bucket-cap-mb 100 --ddp-static-graph --grad-as-bucket-view "${base[@]}"
run ddp-regional-cg-b25-static-view "${two[@]}" "${shape[@]}" --parallel ddp --backend twinkle --regional --cudagraphs \
  --bucket-cap-mb 25 --ddp-static-graph --grad-as-bucket-view "${base[@]}"
# FSDP2 in bf16 like the DDP runs (session 4 measured it with fp32 master weights: 0.54x), then with fused AdamW
run fsdp2-regional-bf16 "${two[@]}" "${shape[@]}" --parallel fsdp2 --backend twinkle --regional "${base[@]}"
run fsdp2-regional-bf16-fused-adamw "${two[@]}" "${shape[@]}" --parallel fsdp2 --backend twinkle --regional --fused-adamw \
  "${base[@]}"
echo "done in $SECONDS s"
