#!/usr/bin/env bash
# Session 3's last GPU call: the tests that failed in the full GPU run (after their fixes), the eager rows
# with CUDA graphs, the compiled rows, then `twinkle-fx check` (eager timings) for the time left.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
timeout -s INT 100 python3 -m pytest -q -n 6 -p no:cacheprovider -rfE tests/eager/test_cuda_graphs.py \
  tests/compile/test_compile_speed.py tests/compile/test_models_in_one_process.py tests/test_doctests.py \
  "tests/families/test_families.py::test_compiled_swaps_match_the_model" > "$out/rerun.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|WARNING.*CUDA graphs" "$out/rerun.log" | tail -20
timeout 90 python3 -m twinkle_fx bench --backends eager,kernelize,kernelize+cudagraphs --steps 10 --warmup 3 --out "$out/eager" > "$out/eager.txt" 2>&1; echo "eager bench exit $?"
grep -A4 "^backend" "$out/eager.txt" | head -6; grep "CUDA graphs\|pass(es)" "$out/eager.txt" | tail -4
timeout 230 python3 -m twinkle_fx bench --backends inductor,twinkle,twinkle-all-swaps --steps 10 --warmup 2 --out "$out/compiled" > "$out/compiled.txt" 2>&1; echo "compiled bench exit $?"
grep -A5 "^backend" "$out/compiled.txt" | head -6; grep "^\[" "$out/compiled.txt" | grep "tok/s"; echo "'Exception ignored' lines: $(grep -c 'Exception ignored' "$out/compiled.txt")"
timeout "${1:-90}" python3 -m twinkle_fx check --no-compile --dtypes bf16,fp32 --out "$out/check.json" > "$out/check.txt" 2>&1; echo "check exit $?"
grep -v "Warning\|warn" "$out/check.txt" | tail -40
