#!/usr/bin/env bash
# Session 3, the last GPU calls. Part A: the suite on CUDA (xdist), the eager training rows (eager,
# kernelize, kernelize+cudagraphs) and the eager inference rows. Part B: the compiled training rows
# (inductor, twinkle = twinkle_fx.compile, twinkle-all-swaps), then `twinkle-fx check` streaming a
# verdict line per kernel for as long as the call lasts.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
if [ "${1:-A}" = "A" ]; then
  timeout -s INT "${2:-300}" python3 -m pytest -q -n 10 -p no:cacheprovider -rfE > "$out/gpu-pytest.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$out/gpu-pytest.log" | tail -40
  timeout 120 python3 -m twinkle_fx bench --backends eager,kernelize,kernelize+cudagraphs --steps 10 --warmup 3 --out "$out/eager" > "$out/eager.txt" 2>&1; echo "eager bench exit $?"
  grep -A12 "^backend" "$out/eager.txt"; grep -i "graph" "$out/eager.txt" | tail -5
  timeout 120 python3 -m twinkle_fx bench --inference --backends eager,kernelize,kernelize+cudagraphs --out "$out/inference" > "$out/inference.txt" 2>&1; echo "inference bench exit $?"
  tail -14 "$out/inference.txt"
else
  timeout 280 python3 -m twinkle_fx bench --backends inductor,twinkle,twinkle-all-swaps --steps 10 --warmup 2 --out "$out/compiled" > "$out/compiled.txt" 2>&1; echo "compiled bench exit $?"
  grep -A8 "^backend" "$out/compiled.txt"; echo "'Exception ignored' lines: $(grep -c 'Exception ignored' "$out/compiled.txt")"
  timeout "${2:-200}" python3 -m twinkle_fx check --dtypes bf16,fp32 --out "$out/check.json" > "$out/check.txt" 2>&1; echo "check exit $?"
  grep -v "Warning\|warn" "$out/check.txt" | tail -50
fi
