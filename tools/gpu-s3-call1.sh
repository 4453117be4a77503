#!/usr/bin/env bash
# Session 3, GPU call 1: the suite on CUDA in parallel (pytest-xdist), the built-in `twinkle-fx check` table,
# then the compile tests in ONE process (issue 12 item 11: a second compiled model in the same process).
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD:$PWD/kernels" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
timeout -s INT "${1:-300}" python3 -m pytest -q -n 6 -p no:cacheprovider -rfE > "$out/gpu-pytest.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$out/gpu-pytest.log" | tail -40
timeout "${2:-100}" python3 -m twinkle_fx check --out "$out/check.json" > "$out/check.txt" 2>&1; echo "check exit $?"
tail -45 "$out/check.txt"
timeout -s INT "${3:-150}" python3 -m pytest -q -p no:cacheprovider -p no:xdist tests/compile -rfE -x > "$out/compile-one-process.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|_grid" "$out/compile-one-process.log" | tail -20
