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

# What every GPU script prints first: the versions and the device(s).
print_versions() {
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])"
}

# run_suite SECONDS: the whole test suite on CUDA (12 workers) into $out/gpu-pytest.log; prints failures and the summary.
run_suite() {
  timeout "$1" python3 -m pytest -q -p no:cacheprovider -n 12 --durations=5 > "$out/gpu-pytest.log" 2>&1
  echo "suite exit $? at ${SECONDS} s"; grep -E "^(FAILED|ERROR)" "$out/gpu-pytest.log" | head -20; tail -1 "$out/gpu-pytest.log"
}

# run NAME COMMAND...: one examples/train_distributed.py run before $deadline (at most $RUN_CAP s, default 170),
# its log and JSON under $out, its table on stdout (the distributed scripts).
run() {
  local name=$1; shift
  local cap=${RUN_CAP:-170}
  local limit=$(( deadline - SECONDS < cap ? deadline - SECONDS : cap ))
  if [ "$limit" -lt 30 ]; then echo "### $name: skipped, ${SECONDS} s used"; return; fi
  echo "### $name ($SECONDS s, limit $limit s)"
  timeout "$limit" "$@" --out "$out/$name.json" > "$out/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then echo "$name: exit $rc"; grep -v "^step" "$out/$name.log" | tail -25; return; fi
  sed -n '/^| /,$p' "$out/$name.log" | head -40
}

# interleaved PROFILED_A PROFILED_B RUN...: every RUN ("NAME=FLAGS" of examples/train_distributed.py) in one process
# (tests/distributed/gloo_runs.py in a world of one), then PROFILED_A and PROFILED_B (also "NAME=FLAGS") with
# --profile; prints one line per run and what B's profile runs that A's does not. At most $CAP s (default 480).
interleaved() {
  local a=$1 b=$2; shift 2
  local an=${a%%=*} bn=${b%%=*}
  timeout "${CAP:-480}" python3 -m torch.distributed.run --standalone --nproc_per_node 1 tests/distributed/gloo_runs.py \
    "$out/interleaved.json" "$@" "$a --profile $out/prof-$an" "$b --profile $out/prof-$bn" > "$out/interleaved.log" 2>&1
  echo "exit $? at $SECONDS s"
  python3 tools/interleaved_summary.py "$out/interleaved.json"
  local ta="$out/prof-$an/rank0/profile_trace.json" tb="$out/prof-$bn/rank0/profile_trace.json"
  if [ -f "$ta" ] && [ -f "$tb" ]; then
    python3 tools/profile_summary.py "$ta" "$tb" > "$out/summary-$an-vs-$bn.txt" 2>&1
    grep -E "busy|kernels/step|runtime" "$out/summary-$an-vs-$bn.txt"; sed -n "/ against /,\$p" "$out/summary-$an-vs-$bn.txt"
    rm -f "$ta" "$tb"  # large; the summary keeps what is read from them
  fi
}
