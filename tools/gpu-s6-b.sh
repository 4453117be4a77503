#!/usr/bin/env bash
# Session 6's second H100 call (~560 s): the TTIR memo (twinkle_fx.compile.ttir_memo) on the GPU — its
# tests and the compile tests beside it, the first compiled training step with and without it against
# Inductor with CUDA graphs (tools/compile_time_probe.py, process warmed first), and the compiled
# inference rows' first prefill and decode (issue 15).
# Usage on the GPU machine: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s6-b.sh
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
SECONDS=0
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 6 tests/compile/test_ttir_memo.py tests/compile/test_compile_speed.py \
  tests/compile/test_gqa_attention_rewrite.py > "$out/pytest-compile.log" 2>&1
echo "tests exit $? at ${SECONDS} s"; grep -E "^(FAILED|ERROR)" "$out/pytest-compile.log" | head; tail -1 "$out/pytest-compile.log"
timeout 260 python3 tools/compile_time_probe.py --backends inductor+cudagraphs,twinkle+cudagraphs,twinkle+cudagraphs/no-ttir-memo \
  --json "$out/compile-time.json" > "$out/compile-time.txt" 2>&1; echo "compile probe exit $? at ${SECONDS} s"
grep -v "Warn\|warn" "$out/compile-time.txt" | grep -A12 "^== \|^compiler" | head -60
timeout $(( 585 - SECONDS )) python3 -m twinkle_fx bench --inference --backends inductor+cudagraphs,twinkle+cudagraphs \
  --steps 20 --warmup 3 --out "$out/inf" > "$out/inf.txt" 2>&1; echo "inference exit $? at ${SECONDS} s"
grep -v "UserWarning\|warn" "$out/inf.txt" | grep -B2 -A4 "^backend\|compiler warmed" | head -12
