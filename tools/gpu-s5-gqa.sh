#!/usr/bin/env bash
# Session 5 GPU call for gqa_attention (issues 14/15): the kernel tests compiled for the GPU (forward,
# backward, triton_op under aot_eager and dynamic shapes), then the benchmark against SDPA over
# repeat_kv / enable_gqa with its split sweep. Usage on the GPU machine (repository root):
#   COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s5-gqa.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_triton_gqa_attention.py 2>&1 | tail -25
timeout 240 python3 tools/gqa_attention_bench.py --out "$out/gqa-bench.json" 2>&1 | tee "$out/gqa-bench.txt"
