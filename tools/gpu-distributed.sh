#!/usr/bin/env bash
# Issue 19's 2-GPU run (nvidia-h200-x2, NCCL_NVLS_ENABLE=0), about 6 minutes: examples/train_distributed.py on
# the reference workload (Qwen2-0.5B shape, bf16, 4 x 1024 per GPU, 10 steps), backend twinkle with the fused-loss head:
#   single    1 GPU, no wrapper, whole model, batch 4 (the speed baseline)
#   single-regional  1 GPU, decoder layers compiled: batch 4 and batch 8 (the 2-GPU global batch: the losses)
#   ddp       DDP x 2, whole model (DDPOptimizer splits it at the buckets)
#   ddp-regional         DDP x 2, each decoder layer compiled (compile_layers)
#   fsdp2-regional-mp    FSDP2 x 2 (fully_shard per layer), regional, MixedPrecisionPolicy bf16 / fp32 reduce
# then, while the time lasts (optional): DDP whole model with optimize_ddp no_optimization, DDP regional with
# no_optimization, FSDP2 regional mixed precision without the fused-loss head (the head's memory saving).
# Every 2-GPU table compares with the single runs (speed-up at the same per-GPU batch, losses at the global batch).
# Writes <name>.log, <name>.json and tables.md under $OUT (or ./gpu-out).
# Usage, from the repo root (wheels of ../shared/tools/device-wheels.sh in .whl/ when there):
#   bash tools/gpu-distributed.sh          # on the 2-GPU machine
#   bash tools/gpu-distributed.sh --tiny   # the dry run of the same sequence: tiny size, CPU processes (gloo), interpreter
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
export NCCL_NVLS_ENABLE=0
if [ "${1:-}" = "--tiny" ]; then
  shape=(--size tiny --batch 1 --seq 8 --steps 3 --compiler aot_eager)
  export TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1
  cap=300; deadline=100000; optional_until=0  # the dry run skips the optional runs
else
  shape=(--size reference --batch 4 --seq 1024 --steps 10)
  unset TRITON_INTERPRET
  # per run at most $cap s, all of it within $deadline s (the device allows 600 s a command); an optional
  # run starts only before $optional_until s
  cap=${CAP:-150}; deadline=${DEADLINE:-430}; optional_until=${OPTIONAL_UNTIL:-0}
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
fi
ex=examples/train_distributed.py
two=(python3 -m torch.distributed.run --standalone --nproc_per_node 2 "$ex")
status=0

run() {  # run NAME COMMAND...: its log and JSON under $out, the table on stdout
  local name=$1; shift
  local limit=$(( deadline - SECONDS < cap ? deadline - SECONDS : cap ))
  if [ "$limit" -lt 30 ]; then echo "### $name: skipped, ${SECONDS} s used"; status=1; return; fi
  echo "### $name ($SECONDS s, limit $limit s): $*"
  timeout "$limit" "$@" --out "$out/$name.json" > "$out/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then status=1; echo "$name: exit $rc"; grep -v "^step" "$out/$name.log" | tail -25; return; fi
  sed -n '/^| /,$p' "$out/$name.log"
  sed -n '/^host (wall) time per step/,/^Chrome trace/p' "$out/$name.log"
}

# the speed baseline of the issue: the undistributed whole-model compiled run at the per-GPU batch; the
# regional single runs (fast to compile) give the loss baseline at the global batch
run single python3 "$ex" "${shape[@]}" --parallel none --backend twinkle
run single-regional python3 "$ex" "${shape[@]}" --parallel none --backend twinkle --regional --compare-single 2
base=()
for f in single single-regional; do [ -f "$out/$f.json" ] && base+=(--baseline "$out/$f.json"); done
# PROFILE=1: every 2-GPU run profiles 3 steps after its timed ones; rank 0's report goes into its log
prof() { [ -n "${PROFILE:-}" ] && echo "--profile /tmp/prof-$1"; }
run ddp "${two[@]}" "${shape[@]}" --parallel ddp --backend twinkle "${base[@]}" $(prof ddp)
run ddp-regional "${two[@]}" "${shape[@]}" --parallel ddp --backend twinkle --regional "${base[@]}" $(prof ddp-regional)
run fsdp2-regional-mp "${two[@]}" "${shape[@]}" --parallel fsdp2 --backend twinkle --regional --mixed-precision \
  "${base[@]}" $(prof fsdp2-regional-mp)
optional() { if [ "$SECONDS" -lt "$optional_until" ]; then run "$@"; else echo "### $1: skipped (${SECONDS} s used)"; fi; }
optional ddp-noopt "${two[@]}" "${shape[@]}" --parallel ddp --backend twinkle --optimize-ddp no_optimization "${base[@]}"
optional ddp-regional-noopt "${two[@]}" "${shape[@]}" --parallel ddp --backend twinkle --regional \
  --optimize-ddp no_optimization "${base[@]}"
optional fsdp2-regional-mp-nohead "${two[@]}" "${shape[@]}" --parallel fsdp2 --backend twinkle --regional \
  --mixed-precision --no-fused-loss "${base[@]}"

python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
parts = []
for path in sorted(out.glob("*.json"), key=lambda p: p.stat().st_mtime):
    data = json.loads(path.read_text())
    parts.append(f"<!-- {path.name}: {data['versions']} -->\n" + "\n\n".join(data["tables"]))
(out / "tables.md").write_text("\n\n".join(parts) + "\n")
print(f"tables.md: {len(parts)} run(s)")
PY
echo "done in $SECONDS s, status $status"
exit $status
