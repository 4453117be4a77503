#!/usr/bin/env bash
# The last GPU call of a session: the suite on CUDA (SIGINT at a limit so pytest prints its summary),
# the training harness rows (eager vs kernelize; Inductor vs twinkle_fx.compile), the built-in check.
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD:$PWD/kernels" PYTHONUNBUFFERED=1 TWINKLE_FX_COMMIT="${COMMIT:-unknown}"
unset TRITON_INTERPRET
timeout -s INT "${1:-300}" python3 -m pytest -q -p no:cacheprovider -rfE > "$out/gpu-pytest.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$out/gpu-pytest.log" | tail -30
mkdir -p "$out/eager" "$out/compiled"
timeout "${2:-45}" python3 -m twinkle_fx bench --backends eager,kernelize --steps 10 --warmup 2 --out "$out/eager" 2>&1 | tail -12
timeout "${3:-180}" python3 -m twinkle_fx bench --backends inductor,twinkle --steps 5 --warmup 1 --out "$out/compiled" 2>&1 | tail -12
timeout "${4:-50}" python3 -m twinkle_fx check --kernels RMSNorm,SwiGLUMLP,CausalLMFusedLoss --dtypes bf16 --no-compile --out "$out/check.json" > "$out/check.txt" 2>&1; echo "check exit $?"
tail -40 "$out/check.txt"
