#!/usr/bin/env bash
# Session 4 GPU call: issue 17's reference-size forward + backward of every family (tools/family_reference.py),
# then the GPU-only tests of this session's kernels, families and decode CUDA graphs.
# Usage on the GPU machine: COMMIT=$(git rev-parse --short HEAD) bash tools/gpu-s4-families.sh [families_s]
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
start=$(date +%s)
timeout "${1:-400}" python3 tools/family_reference.py --out "$out/families.json" > "$out/families.txt" 2>&1
echo "family_reference exit $? after $(( $(date +%s) - start )) s"
grep -v "UserWarning\|_warn_once\|warnings.warn" "$out/families.txt" | tail -70
python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels/test_triton_op_inductor.py tests/kernels/test_triton_family_kernels.py \
  tests/compile/test_dynamo_internals.py tests/eager/test_cuda_graphs.py tests/families/test_families.py \
  -k "starcoder2 or gpt_oss or experts or clamped or cuda_graphs or graph or dynamo_internals" 2>&1 | tee "$out/pytest.log" | tail -15
