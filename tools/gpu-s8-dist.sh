#!/usr/bin/env bash
# The next 2-GPU call (nvidia-h200-x2, NCCL_NVLS_ENABLE=0), ~9 minutes: issue 19. Was gpu-s7-dist.sh (never
# run: no 2-GPU machine was lent in sessions 6, 7 and 8); session 8 adds DDP's recipe measured in a world of
# one (bucket views, the built-in all-reduce hook, no buffer broadcast, static graph: +2 to 3 ms over the
# unwrapped step, was +9 ms).
# 1. tied_embedding_ddp against plain DDP on NCCL (tests/distributed/tied_runs.py cuda): the gradients
#    with the head's all-reduce asynchronous on NCCL's stream; CI checks the same cases on gloo only.
# 2. NCCL's all-reduce alone and beside GEMMs (tools/allreduce_probe.py): the link or the overlap.
# 3. The single-GPU regional CUDA-graph baselines, session 5's DDP run (1.42x; each layer now one graph),
#    the same with DDP's recipe, then with the tied embedding reduced early too, and FSDP2 in bf16 with
#    fused AdamW (its layers replayed as CUDA graphs and kept gathered until their backward, session 9's
#    fastest FSDP2 in a world of one; without graphs; without the fused-loss head), all against the
#    single-GPU runs of the same call.
# Reference workload, bf16, 4 x 1024 per GPU, 15 steps, backend twinkle, fused-loss head.
# Usage from the repo root: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s8-dist.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
export NCCL_NVLS_ENABLE=0
print_versions
nvidia-smi topo -m 2>/dev/null | head -4
shape=(--size reference --batch 4 --seq 1024 --steps 15)
ex=examples/train_distributed.py
two=(python3 -m torch.distributed.run --standalone --nproc_per_node 2)
deadline=${DEADLINE:-570}
RUN_CAP=120
SECONDS=0
timeout 90 "${two[@]}" tests/distributed/tied_runs.py "$out/tied-nccl.json" cuda > "$out/tied-nccl.log" 2>&1
echo "tied_runs on NCCL: exit $? at ${SECONDS} s"
python3 - "$out/tied-nccl.json" <<'PY' || tail -20 "$out/tied-nccl.log"
import json, sys
for case, r in json.load(open(sys.argv[1])).items():
    print(f"{case:28s}", {k: v for k, v in r.items() if k != "frames"})
PY
timeout 60 "${two[@]}" tools/allreduce_probe.py --sizes-mb 100,300,1000 --json "$out/allreduce.json" 2>&1 \
  | grep "all-reduce"; echo "probe at ${SECONDS} s"
run single-regional-cg python3 "$ex" "${shape[@]}" --parallel none --backend twinkle --regional --cudagraphs --compare-single 2
base=(--baseline "$out/single-regional-cg.json")
ddp=("${two[@]}" "$ex" "${shape[@]}" --parallel ddp --backend twinkle --regional --cudagraphs --bucket-cap-mb 100)
run ddp-regional-cg-b100 "${ddp[@]}" "${base[@]}"
recipe=(--grad-as-bucket-view --ddp-comm-hook allreduce --no-broadcast-buffers --ddp-static-graph)
run ddp-regional-cg-b100-recipe "${ddp[@]}" "${recipe[@]}" "${base[@]}"
# profiled (3 steps after the timed ones; rank 0's report, NCCL kernels included, goes into the log): where the
# all-reduce sits against the backward with the head's part sent early
run ddp-regional-cg-b100-recipe-tied "${ddp[@]}" "${recipe[@]}" --tied-embedding-ddp --profile /tmp/prof-tied \
  "${base[@]}"
sed -n '/profiled step/,/Chrome trace/p' "$out/ddp-regional-cg-b100-recipe-tied.log" | head -40
# FSDP2 in bf16 like the DDP runs (session 4 measured it with fp32 master weights: 0.54x), fused AdamW, against
# a single-GPU run with fused AdamW too. Session 9's world of one (one H100): each layer replayed as CUDA graphs
# with its gathered parameters kept until its backward was FSDP2's fastest (72 ms against 125 ms without graphs;
# the unwrapped step 36 ms)
run single-regional-cg-fused python3 "$ex" "${shape[@]}" --parallel none --backend twinkle --regional --cudagraphs \
  --fused-adamw --compare-single 2
fbase=(--baseline "$out/single-regional-cg-fused.json")
fsdp=("${two[@]}" "$ex" "${shape[@]}" --parallel fsdp2 --backend twinkle --regional --fused-adamw)
run fsdp2-regional-bf16-fused-adamw-cg-no-reshard "${fsdp[@]}" --cudagraphs --no-reshard-after-forward "${fbase[@]}"
run fsdp2-regional-bf16-fused-adamw "${fsdp[@]}" "${fbase[@]}"
# the fused-loss head's saving under FSDP2 (the issue asks the peak memory to show it): the same run without it
run fsdp2-regional-bf16-fused-adamw-cg-no-reshard-no-fused-loss "${fsdp[@]}" --cudagraphs --no-reshard-after-forward \
  --no-fused-loss "${fbase[@]}"
# while time is left: the whole model compiled (DDPOptimizer's pieces, each replayed as a CUDA graph), the
# single-GPU form that is fastest (twinkle+cudagraphs); never measured under DDP
run ddp-whole-cg-b100 "${two[@]}" "$ex" "${shape[@]}" --parallel ddp --backend twinkle --cudagraphs --bucket-cap-mb 100 \
  "${base[@]}"
echo "done in $SECONDS s"
