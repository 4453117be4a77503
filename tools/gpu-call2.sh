#!/usr/bin/env bash
# Suite on CUDA (SIGINT at a time limit, so pytest prints its summary), the accuracy probe, the check.
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD:$PWD/kernels" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
timeout -s INT "${1:-400}" python3 -m pytest -q -p no:cacheprovider --durations=15 -rfE > "$out/gpu-pytest.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$out/gpu-pytest.log" | tail -40
for args in "--family qwen2" "--family qwen2 --fused-loss" "--family olmo2"; do
  timeout 60 python3 tools/accuracy_probe.py $args 2>&1 | grep -v Warning | tail -4
done
timeout "${2:-100}" python3 -m twinkle_fx check --kernels RMSNorm,SwiGLUMLP --dtypes bf16,fp16 --no-compile --out "$out/check.json" > "$out/check.txt" 2>&1; echo "check exit $?"
tail -30 "$out/check.txt"
