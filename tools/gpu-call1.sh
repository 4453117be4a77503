#!/usr/bin/env bash
# One GPU call: the suite on CUDA (stopped with SIGINT at a time limit so pytest still prints its summary),
# then `twinkle-fx check` over the built-in kernels and the per-family reference-size check.
# Usage on the GPU machine: bash tools/gpu-call1.sh SUITE_SECONDS CHECK_SECONDS FAMILIES_SECONDS
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD:$PWD/kernels" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
timeout -s INT "${1:-400}" python3 -m pytest -q -p no:cacheprovider --durations=15 -rfE > "$out/gpu-pytest.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$out/gpu-pytest.log" | tail -40
timeout "${2:-90}" python3 -m twinkle_fx check --out "$out/check.json" > "$out/check.txt" 2>&1; echo "check exit $?"
tail -45 "$out/check.txt"
timeout "${3:-90}" python3 examples/families_gpu_check.py --out "$out/families.jsonl" > "$out/families.txt" 2>&1; echo "families exit $?"
tail -30 "$out/families.txt"
