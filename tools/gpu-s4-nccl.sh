#!/usr/bin/env bash
# Issue 19, why DDP x 2 is 1.0-1.2x one GPU: the 2 x H200 profiles (docs/perf/session4/distributed) show
# every all-reduce as ncclDevKernel_AllReduce_Sum_bf16_RING_LL (the low-latency protocol, at 25 MB buckets)
# and 10-27 ms of all-reduce a step for 1 GB of gradients. This run prints NCCL's transport choice and times
# DDP regional with NCCL's default protocol choice against NCCL_PROTO=Simple and larger buckets.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
export NCCL_NVLS_ENABLE=0
ex=examples/train_distributed.py
two=(python3 -m torch.distributed.run --standalone --nproc_per_node 2 "$ex" --size reference --batch 4 --seq 1024
     --parallel ddp --backend twinkle --regional)
nvidia-smi topo -m 2>&1 | head -5
NCCL_DEBUG=INFO timeout 120 "${two[@]}" --steps 6 > "$out/nccl-info.log" 2>&1; echo "info run exit $?"
grep -E "via (P2P|SHM|NET)|NVLS|Using network|comm .* nRanks|P2P/|Channel 00" "$out/nccl-info.log" | sort | uniq -c | sort -rn | head -12
grep -E "^\| (tokens|ms/step)" "$out/nccl-info.log"
for cfg in "NCCL_PROTO=Simple" "NCCL_PROTO=Simple BUCKET=100"; do
  extra=(); [[ $cfg == *BUCKET* ]] && extra=(--bucket-cap-mb 100)
  echo "### $cfg"
  env NCCL_PROTO=Simple timeout 150 "${two[@]}" --steps 10 "${extra[@]}" --profile /tmp/prof-simple --out "$out/${cfg// /_}.json" \
    > "$out/${cfg// /_}.log" 2>&1; echo "exit $?"
  grep -E "^\| (tokens|ms/step|loss per)" "$out/${cfg// /_}.log"
  sed -n '/^host (wall) time per step/,/^Chrome trace/p' "$out/${cfg// /_}.log" | head -14
done
