#!/usr/bin/env bash
# Session 4, compiled training with CUDA graphs (issue 15, cgtrain). Run from the repository root on the
# GPU machine, with COMMIT=<the commit sent>:
#   A: the harness, one run: inductor, inductor+cudagraphs, twinkle+cudagraphs, twinkle (twinkle_fx.compile)
#      (qwen2 reference workload, 4 x 1024, bf16, fwd+bwd), JSON under $OUT/cgtrain (~5-6 min on an H100: ~55 s of compilation a row;
#      the JSON is written at the end, the "[i/4] row: ... tok/s" lines of cgtrain.txt as each row ends).
#   B: the GPU tests of CUDA graphs in compiled training (the former strict xfail, SGD vs eager with and
#      without accumulation), then the host cost per launch of our kernel from Inductor code with and
#      without the static launcher (tools/launch_host_cost.py), then the twinkle row again with the
#      static launcher for user-defined kernels (its own process: the setting is read from the
#      environment when Inductor's compile workers start) (~3-4 min).
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
if [ "${1:-A}" = "A" ]; then
  timeout "${2:-400}" python3 -m twinkle_fx bench --backends inductor,inductor+cudagraphs,twinkle+cudagraphs,twinkle \
    --steps 10 --warmup 2 --out "$out/cgtrain" > "$out/cgtrain.txt" 2>&1; echo "bench exit $?"
  grep "^\[" "$out/cgtrain.txt" | grep -v "fresh model"; grep -A6 "^backend" "$out/cgtrain.txt" | head -8
  python3 - "$out/cgtrain/bench-qwen2.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["backend"], r["status"], r.get("loss_check"), r.get("last_loss"), r["notes"].get("cudagraphs"),
          r["notes"].get("cudagraph_tree"), (r.get("error") or "")[:400])
PY
else
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/compile/test_compile_speed.py \
    -k "reduce_overhead or capturable" > "$out/cg-tests.log" 2>&1; echo "tests exit $?"
  grep -E "^(FAILED|ERROR)|passed|failed|Error" "$out/cg-tests.log" | tail -20
  timeout 100 python3 tools/launch_host_cost.py --out "$out/launch-host-cost.json"; echo "launch cost exit $?"
  TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=1 timeout "${2:-120}" python3 -m twinkle_fx bench \
    --backends twinkle --steps 10 --warmup 2 --out "$out/cgtrain-static" > "$out/cgtrain-static.txt" 2>&1; echo "static bench exit $?"
  grep "^\[" "$out/cgtrain-static.txt" | grep -v "fresh model"
fi
