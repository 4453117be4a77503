# Sourced by the GPU scripts (tools/gpu-*.sh) on the lent GPU machine: the wheels of
# ../shared/tools/device-wheels.sh from .whl/ (when there) and the environment every run needs.
out=${OUT:-gpu-out}; mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PWD:$PWD/kernels"
else
  export PYTHONPATH="$PWD:$PWD/kernels"
fi
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
# The copy's .git HEAD is not the tree that was sent: the caller names the commit (COMMIT=$(git rev-parse
# --short HEAD) in the command), and the harness writes it into every saved result.
export TWINKLE_FX_COMMIT="${COMMIT:-unknown}"
