#!/usr/bin/env bash
# Session 7's second one-GPU call (~6 minutes): where DDP's time goes with no communication at all. The
# single-GPU regional CUDA-graph run (no wrapper) against DDP in a world of one (NCCL, 100 MB buckets):
# plain, with --tied-embedding-ddp, and with DDP's static graph and bucket views on top; the last two profiled.
# Usage from the repo root: COMMIT=<sha> bash tools/gpu-s7-one-b.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
print_versions
SECONDS=0
shape=(--size reference --batch 4 --seq 1024 --steps 15)
ex=examples/train_distributed.py
one=(python3 -m torch.distributed.run --standalone --nproc_per_node 1 "$ex" "${shape[@]}"
     --parallel ddp --backend twinkle --regional --cudagraphs --bucket-cap-mb 100)
deadline=${DEADLINE:-560}
RUN_CAP=110
run single-regional-cg python3 "$ex" "${shape[@]}" --parallel none --backend twinkle --regional --cudagraphs \
  --profile /tmp/prof-single
sed -n '/profiled step/,/kernel launches/p' "$out/single-regional-cg.log"
base=(--baseline "$out/single-regional-cg.json")
run ddp1-regional-cg-b100 "${one[@]}" --profile /tmp/prof-plain1 "${base[@]}"
sed -n '/profiled step/,/kernel launches/p' "$out/ddp1-regional-cg-b100.log"
run ddp1-regional-cg-b100-tied "${one[@]}" --tied-embedding-ddp "${base[@]}"
run ddp1-regional-cg-b100-tied-static-view "${one[@]}" --tied-embedding-ddp --ddp-static-graph --grad-as-bucket-view \
  --profile /tmp/prof-static1 "${base[@]}"
sed -n '/profiled step/,/Chrome trace/p' "$out/ddp1-regional-cg-b100-tied-static-view.log" | head -30
echo "done in $SECONDS s"
