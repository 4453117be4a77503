#!/usr/bin/env bash
# Session 4's last GPU call (~590 s): the whole suite on CUDA with the MoE families' reference-size rows running
# beside it (correctness only), then, alone on the GPU, the compiled-training harness rows with CUDA graphs
# (issue 15) and the eager inference rows with graphed decode (issue 14).
# Usage on the GPU machine: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s4-final.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
SECONDS=0
timeout 200 python3 tools/family_reference.py --families mixtral,qwen3_moe,deepseek_v3,gpt_oss,ernie4_5_moe \
  --out "$out/families-moe.json" > "$out/families-moe.txt" 2>&1 &
fam=$!
timeout 210 python3 -m pytest -q -p no:cacheprovider -n 12 --durations=5 > "$out/gpu-pytest.log" 2>&1
echo "suite exit $? at ${SECONDS} s"; grep -E "^(FAILED|ERROR)" "$out/gpu-pytest.log" | head -20; tail -3 "$out/gpu-pytest.log"
wait $fam; echo "families exit $? at ${SECONDS} s"
grep -E "^[a-z0-9_]+ +(bf16|fp32) " "$out/families-moe.txt" | cut -c1-140; grep "rows pass" "$out/families-moe.txt"
timeout 230 python3 -m twinkle_fx bench --backends inductor,twinkle+cudagraphs,inductor+cudagraphs --steps 10 --warmup 2 \
  --out "$out/cgtrain" > "$out/cgtrain.txt" 2>&1; echo "train bench exit $? at ${SECONDS} s"
grep "^\[" "$out/cgtrain.txt" | grep -v "fresh model"
left=$(( 575 - SECONDS ))
timeout $left python3 -m twinkle_fx bench --inference --backends eager,kernelize,kernelize+cudagraphs --out "$out/inf" \
  > "$out/inf.txt" 2>&1; echo "inference bench exit $? at ${SECONDS} s"
grep -v "UserWarning\|warn" "$out/inf.txt" | tail -14
