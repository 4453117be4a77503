#!/usr/bin/env bash
# Session 7's one-GPU call (~8 minutes; no 2-GPU machine was lent): the whole suite on CUDA (the new
# tied-embedding tests, the README block with NCCL in a world of one), then what tied_embedding_ddp costs
# on its own: DDP in a world of one (NCCL, no other rank: the all-reduces are copies), regional + CUDA
# graphs, 100 MB buckets, without and with --tied-embedding-ddp. The difference is the hooks, the rows'
# exchange and its host syncs at the end of the backward, not communication.
# Usage from the repo root: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s7-one.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
print_versions
SECONDS=0
run_suite 300
shape=(--size reference --batch 4 --seq 1024 --steps 15)
one=(python3 -m torch.distributed.run --standalone --nproc_per_node 1 examples/train_distributed.py "${shape[@]}"
     --parallel ddp --backend twinkle --regional --cudagraphs --bucket-cap-mb 100)
deadline=${DEADLINE:-560}
RUN_CAP=120
run ddp1-regional-cg-b100 "${one[@]}"
run ddp1-regional-cg-b100-tied "${one[@]}" --tied-embedding-ddp --profile /tmp/prof-tied1
sed -n '/profiled step/,/Chrome trace/p' "$out/ddp1-regional-cg-b100-tied.log" | head -30
echo "done in $SECONDS s"
