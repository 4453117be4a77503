#!/usr/bin/env bash
# Session 4 GPU call: the host cost of the eager kernel path piece by piece (docs/perf/host_breakdown.py,
# issue 14), then `twinkle-fx check` over the built-in kernels with its defaults (issue 11's GPU table).
# Usage on the GPU machine: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s4-check.sh [check_s]
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
timeout 90 python3 docs/perf/host_breakdown.py 2>&1 | tee "$out/host_breakdown.txt" | tail -60
start=$(date +%s)
timeout "${1:-400}" python3 -m twinkle_fx check --out "$out/check.json" > "$out/check.txt" 2>&1; echo "check exit $? after $(( $(date +%s) - start )) s"
grep -v "UserWarning\|_warn_once\|warnings.warn" "$out/check.txt" | tail -120
