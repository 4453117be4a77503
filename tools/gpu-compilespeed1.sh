#!/usr/bin/env bash
# compilespeed GPU call 1: training rows (inductor, twinkle, kernelize+twinkle, with a
# profile), the exact-FLCE sweep, the --micro FLCE rows, and (in the background, during the first
# compilation) the reduce-overhead training probe. Run from the repo root.
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
unset TRITON_INTERPRET
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
(timeout 60 python3 tools/cudagraph_training_probe.py > "$out/probe.txt" 2>&1; echo "probe exit $?" >> "$out/probe.txt") &
probe=$!
timeout "${1:-300}" python3 -m twinkle_fx bench --backends inductor,twinkle,kernelize+twinkle --steps 10 --warmup 2 \
  --profile "$out/prof" --out "$out/train" > "$out/train.txt" 2>&1; echo "train exit $?"
tail -32 "$out/train.txt" | cut -c1-300
wait $probe
timeout "${2:-45}" python3 docs/perf/flce_vocab_sweep.py --out "$out/flce_vocab_sweep.jsonl" > "$out/sweep.txt" 2>&1; echo "sweep exit $?"
cut -c1-330 "$out/sweep.txt"
timeout "${3:-25}" python3 -m twinkle_fx bench --micro --ops fused_linear_cross_entropy --out "$out/micro" > "$out/micro.txt" 2>&1; echo "micro exit $?"
tail -12 "$out/micro.txt" | cut -c1-250
tail -60 "$out/probe.txt" | cut -c1-300
