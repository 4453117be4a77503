#!/usr/bin/env bash
# compilespeed GPU call 2, nothing running beside the timed bench: training rows inductor, twinkle,
# twinkle-all-swaps (every region swapped) with profiles (and where their time goes), the reduce-overhead tests, the exact-FLCE
# defaults against exact tiling, the vocab_chunked kernel tests on the GPU. Run from the repo root.
# About 9 minutes with the defaults (each compiled training row: ~75 s of first-step compilation on an H100 machine).
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
unset TRITON_INTERPRET
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
timeout "${1:-300}" python3 -m twinkle_fx bench --backends inductor,twinkle,twinkle-all-swaps --steps 10 --warmup 2 \
  --profile "$out/prof" --out "$out/train" > "$out/train.txt" 2>&1; echo "train exit $?"
grep -E "^\[|first step" "$out/train.txt" | cut -c1-250
timeout 20 python3 tools/profile_summary.py "$out"/prof/*/profile_trace.json > "$out/profile_summary.txt" 2>&1
grep -E "^==|device busy|by category" "$out/profile_summary.txt"
rm -f "$out"/prof/*/profile_trace.json
timeout "${2:-150}" python3 -m pytest -q -p no:cacheprovider tests/compile/test_compile_speed.py -k "reduce_overhead or capturable" -rfE > "$out/pytest-cg.txt" 2>&1; echo "pytest cudagraphs exit $?"
tail -25 "$out/pytest-cg.txt" | cut -c1-300
timeout "${3:-20}" python3 docs/perf/flce_vocab_sweep.py --quick --out "$out/flce_quick.jsonl" > "$out/flce_quick.txt" 2>&1; echo "flce exit $?"
grep "^{" "$out/flce_quick.txt" | cut -c1-300
timeout "${4:-120}" python3 -m pytest -q -p no:cacheprovider tests/kernels/test_triton_fused_linear_cross_entropy.py -k "vocab_chunked_matches_reference or default_to or cut_cross" -rfE > "$out/pytest-flce.txt" 2>&1; echo "pytest flce exit $?"
tail -6 "$out/pytest-flce.txt" | cut -c1-300
