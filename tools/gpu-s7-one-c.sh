#!/usr/bin/env bash
# Session 7's third one-GPU call (~5 minutes): where DDP's host time goes with no communication.
# Profiles (3 steps each) of the unwrapped regional CUDA-graph run and of DDP in a world of one, plain
# and with static graph + bucket views; tools/profile_summary.py compares each DDP trace with the unwrapped one.
# Usage from the repo root: COMMIT=<sha> bash tools/gpu-s7-one-c.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
print_versions
SECONDS=0
shape=(--size reference --batch 4 --seq 1024 --steps 8)
ex=examples/train_distributed.py
one=(python3 -m torch.distributed.run --standalone --nproc_per_node 1 "$ex" "${shape[@]}"
     --parallel ddp --backend twinkle --regional --cudagraphs --bucket-cap-mb 100)
deadline=${DEADLINE:-500}
RUN_CAP=110
run single python3 "$ex" "${shape[@]}" --parallel none --backend twinkle --regional --cudagraphs --profile /tmp/p-single
run ddp1 "${one[@]}" --profile /tmp/p-ddp1
run ddp1-static-view "${one[@]}" --ddp-static-graph --grad-as-bucket-view --profile /tmp/p-ddp1sv
for t in ddp1 ddp1sv; do
  echo "### profile_summary single vs $t"
  timeout 120 python3 tools/profile_summary.py /tmp/p-single/rank0/profile_trace.json /tmp/p-$t/rank0/profile_trace.json \
    2>&1 | tee "$out/summary-single-vs-$t.txt" | head -80
done
echo "done in $SECONDS s"
