#!/usr/bin/env bash
# The GPU half of CI, run by hand on the lent GPU machine (CI has no GPU):
#   the whole test suite on CUDA (no Triton interpreter), then whatever harness commands are given.
# Usage (from the repo root on the GPU machine, with the wheels of ../shared/tools/device-wheels.sh in .whl/):
#   bash tools/gpu-suite.sh [--no-tests] ["twinkle-fx bench ..." ...]
# Writes the pytest log and the harness output under $OUT (or ./gpu-out).
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
status=0
if [ "${1:-}" != "--no-tests" ]; then
  python3 -m pytest -q -p no:cacheprovider --durations=10 2>&1 | tee "$out/gpu-pytest.log" | tail -40
  status=${PIPESTATUS[0]}
else
  shift
fi
for cmd in "$@"; do
  echo "### $cmd"
  bash -c "$cmd" 2>&1 | tee -a "$out/gpu-harness.log" | tail -60
done
exit $status
