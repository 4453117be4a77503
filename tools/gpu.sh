#!/usr/bin/env bash
# The GPU half of CI and the measurements behind docs/performance.md, run by hand on a GPU machine
# (CI has none). One script, named jobs, run in the order given:
#
#   suite        the whole test suite on CUDA (no Triton interpreter)
#   train        training step, Qwen2-0.5B shape, 4 x 1024: eager, Inductor (+ CUDA graphs), twinkle + CUDA graphs,
#                kernelize (+ CUDA graphs)
#   inference    prefill 1 x 2048 and decode 32 x 1 on a static cache: the same backends
#   generate     model.generate() at B1/B8/B32, prompt 512, 128 new tokens: eager, transformers' static-cache recipe,
#                twinkle through CompileConfig, kernelize with CUDA graphs, and the decode loop with each forward
#                (python -m twinkle_fx.bench.generate; GENERATE_MODELS: space-separated shapes, default qwen2;
#                GENERATE_ARGS: more flags, e.g. "--rows hf-static,twinkle+decode --batches 1,8")
#   kernels      `twinkle-fx bench --micro`: every kernel and the fused loss against eager, Inductor, Liger, CCE
#   matrix       `twinkle-fx bench --matrix`: training across model shapes (MODELS, comma-separated, default the
#                command's seven; BACKENDS likewise, "twinkle+cudagraphs-embedding_grad" being twinkle+cudagraphs
#                without that graph rewrite; MATRIX_ARGS: more flags, e.g. "--repeat-first --profile DIR"), one
#                table; then, when MODELS is unset, tools/family_reference.py: every family at its published
#                dimensions against the unswapped model
#   distributed  2 GPUs (NCCL): single-GPU baselines, DDP with per-layer CUDA graphs (plain and with DDP's recipe,
#                then with the tied embedding reduced early), FSDP2 with and without graphs and the fused-loss head
#   fsdp         2 GPUs (NCCL), the Llama-3.2-3B shape: 1 GPU then FSDP2 on 2, each as torch.compile regional,
#                twinkle regional and twinkle regional + CUDA graphs, the FSDP2 runs with two decoder layers per
#                unit and otherwise FSDP2's own defaults (they measured fastest, docs/distributed.md) and one of
#                them profiled (exposed communication per rank); one JSON of all runs,
#                fsdp-llama3b-<B>x1024-<gpu>.json, for docs/performance/
#                (each FSDP2 run with the copy engines' collectives and with NCCL's, FSDP_COLLECTIVES to pick;
#                FSDP_BATCH sequences of 1024 per GPU, default 4; FSDP_EXTRA: more flags for the FSDP2 runs,
#                e.g. "--prefetch 1 --reduce-dtype fp32" or "--nccl-ctas 16 --sm-carveout 16"; FSDP_PROFILE: the
#                run profiled, default fsdp2-twinkle-copy-engine, "none" for none; FSDP_S: the job's time, default
#                520 s)
#   check        `twinkle-fx check`: the kernel checklist of every built-in kernel on the GPU
#   gemv         tools/gemv_sweep.py: the decode GEMV kernels against cuBLAS at three model shapes, 1-8 rows, weights
#                read from DRAM (copies that outgrow the L2 cache)
#                (GEMV_ARGS: more flags, e.g. "--rows 1 --projections layer --block-n 2,4 --tiles 4096,8192 --pdl off,prefetch")
#   attention    tools/gqa_attention_bench.py: the grouped-query decode attention against SDPA, its split and
#                key-block choices swept
#   moe          tools/moe_gemm_sweep.py: the fused MoE expert kernels against transformers' grouped_mm experts, forward
#                and forward + backward, Qwen3-30B-A3B and Mixtral-8x7B layer shapes, 4096 tokens, bf16
#                (MOE_ARGS: more flags, e.g. "--kernels gate_up --block-m 64,128 --block-n 64,128 --warps 4,8", or
#                "--per-kernel": each kernel tuned on its own profiled time over its own candidates, or over
#                the knobs given, e.g. "--per-kernel --shapes mixtral-8x7b --kernels grad_act --warps 4,8")
#   flce         tools/flce_chunked_sweep.py: the default (chunked) fused loss at the matrix's LM heads, rows per
#                logits chunk and the row kernel's settings, every setting checked (FLCE_ARGS: more flags, e.g.
#                "--shapes llama1b --chunk-mib 512,1024 --row-kernels default,2pass-2sm-32w-16k")
#   norm         tools/rms_norm_bwd_sweep.py: the RMSNorm backward's tiling at 4096 rows of hidden 896, 2048, 3072, with
#                and without the residual sum's gradient, every setting checked (NORM_ARGS: more flags, e.g.
#                "--launches": the kernel launched eagerly against Inductor's launch of it)
#
# Usage, from the repository root:
#   COMMIT=$(git rev-parse --short HEAD) bash tools/gpu.sh suite train inference
#   bash tools/gpu.sh distributed --tiny     # the distributed sequence as a dry run: CPU processes, gloo, tiny model
#   bash tools/gpu.sh fsdp --tiny            # likewise: the tiny Llama
# Results (harness JSON stamped with device, versions and $COMMIT, logs) go under $OUT (default ./gpu-out); a JSON
# that replaces one in docs/performance/ keeps that file's name. Wheels in .whl/ (git-ignored) are installed
# first, for packages the GPU image lacks (kernels, expecttest, pytest-xdist, liger-kernel, cut-cross-entropy).
# Each job is bounded by a timeout (seconds): SUITE_S, TRAIN_S, INFERENCE_S, GENERATE_S, KERNELS_S, MATRIX_S, DIST_S,
# CHECK_S, GEMV_S, ATTENTION_S, MOE_S, FLCE_S, NORM_S;
# each run of the distributed and fsdp jobs by RUN_S.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}; mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PWD:$PWD/kernels"
else
  export PYTHONPATH="$PWD:$PWD/kernels"
fi
# NVLink multicast stays off (NCCL's, symmetric memory's, NVSHMEM's): the lent machines keep it off
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# a copied tree has no reliable git HEAD: the caller names the commit and the harness stamps every result with it
export TWINKLE_FX_COMMIT="${COMMIT:-unknown}"
tiny=0
jobs=()
for arg in "$@"; do if [ "$arg" = "--tiny" ]; then tiny=1; else jobs+=("$arg"); fi; done
[ ${#jobs[@]} -gt 0 ] || { awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 2; }  # the header above
if [ "$tiny" = 1 ]; then export TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1; else unset TRITON_INTERPRET; fi
status=0

python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])"

bench() {  # bench NAME SECONDS ARGS...: one `twinkle-fx bench` run, its table on stdout
  local name=$1 limit=$2; shift 2
  echo "### $name: twinkle-fx bench $*"
  timeout "$limit" python3 -m twinkle_fx bench "$@" --out "$out/$name" > "$out/$name.txt" 2>&1
  local rc=$?; [ $rc -eq 0 ] || { status=1; echo "$name: exit $rc"; tail -20 "$out/$name.txt"; }
  sed -n '/^backend/,/^$/p' "$out/$name.txt"
}

distributed_run() {  # distributed_run NAME COMMAND...: one twinkle_fx.bench.distributed run, its table on stdout
  local name=$1; shift
  echo "### $name"
  timeout "${RUN_S:-150}" "$@" --out "$out/$name.json" > "$out/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then status=1; echo "$name: exit $rc"; grep -v "^step" "$out/$name.log" | tail -25; return; fi
  sed -n '/^| /,$p' "$out/$name.log" | head -40
}

job_suite() {
  # SIGINT first: pytest stops after the tests under way and prints its failures and summary; killed 30 s later if not.
  # On a fresh H200 machine (Inductor's and Triton's caches empty) the suite takes about 7 minutes
  timeout -s INT -k 30 "${SUITE_S:-540}" python3 -m pytest -q -p no:cacheprovider -n "${WORKERS:-12}" --durations=10 ${PYTEST_ARGS:-} \
    > "$out/gpu-pytest.log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)" "$out/gpu-pytest.log" | head -20; tail -1 "$out/gpu-pytest.log"
}

job_train() {
  bench training-compiled "${TRAIN_S:-300}" --backends inductor,inductor+cudagraphs,twinkle+cudagraphs --steps 10 --warmup 2
  bench training-eager "${TRAIN_S:-300}" --backends eager,kernelize,kernelize+cudagraphs --steps 10 --warmup 3
}

job_inference() {
  bench inference-compiled "${INFERENCE_S:-300}" --inference --backends inductor+cudagraphs,twinkle+cudagraphs \
    --steps 20 --warmup 3
  bench inference-eager "${INFERENCE_S:-300}" --inference --backends eager,kernelize,kernelize+cudagraphs --steps 20 --warmup 3
}

job_generate() {
  local model
  for model in ${GENERATE_MODELS:-qwen2}; do
    echo "### generate $model"
    timeout "${GENERATE_S:-500}" python3 -m twinkle_fx.bench.generate --model "$model" ${GENERATE_ARGS:-} \
      --out "$out/generate-$model.json" > "$out/generate-$model.txt" 2>&1 || { status=1; tail -20 "$out/generate-$model.txt"; }
    sed -n '/^| row/,$p' "$out/generate-$model.txt"
  done
}

job_kernels() {
  bench kernels "${KERNELS_S:-300}" --micro
  bench fused-loss "${KERNELS_S:-300}" --micro --ops fused_linear_cross_entropy --backends eager,inductor,twinkle,liger,cce
}

job_matrix() {
  echo "### matrix"
  timeout "${MATRIX_S:-1500}" python3 -m twinkle_fx bench --matrix ${MODELS:+--models "$MODELS"} \
    ${BACKENDS:+--backends "$BACKENDS"} --steps 10 --warmup 2 ${MATRIX_ARGS:-} --out "$out/matrix" \
    > "$out/matrix.txt" 2>&1 \
    || { status=1; tail -20 "$out/matrix.txt"; }
  sed -n '/^| model/,$p' "$out/matrix.txt"
  [ -z "${MODELS:-}" ] || return 0  # a run of chosen models measures them, not the families
  timeout "${MATRIX_S:-400}" python3 tools/family_reference.py --out "$out/families.json" > "$out/families.txt" 2>&1 \
    || status=1
  tail -70 "$out/families.txt"
}

job_distributed() {
  local ex=(-m twinkle_fx.bench.distributed) shape two=(python3 -m torch.distributed.run --standalone --nproc_per_node 2)
  if [ "$tiny" = 1 ]; then
    shape=(--size tiny --batch 1 --seq 8 --steps 3 --compiler aot_eager)
  else
    shape=(--size reference --batch 4 --seq 1024 --steps 15 --cudagraphs)
    nvidia-smi topo -m 2>/dev/null | head -4
    # the tied embedding's two-part reduction against plain DDP on NCCL (CI checks the same cases on gloo)
    timeout 90 "${two[@]}" tests/distributed/tied_runs.py "$out/tied-nccl.json" cuda > "$out/tied-nccl.log" 2>&1 \
      || { status=1; tail -20 "$out/tied-nccl.log"; }
    # NCCL's all-reduce alone and beside GEMMs: the link, and what overlap leaves of it
    timeout 60 "${two[@]}" tools/allreduce_probe.py --sizes-mb 100,300,1000 --json "$out/allreduce.json" 2>&1 \
      | grep "all-reduce"
  fi
  local regional=(--backend twinkle --regional "${shape[@]}")
  distributed_run single python3 "${ex[@]}" --parallel none "${regional[@]}" --compare-single 2
  local base=(--baseline "$out/single.json")
  local ddp=("${two[@]}" "${ex[@]}" --parallel ddp "${regional[@]}" --bucket-cap-mb 100)
  local recipe=(--grad-as-bucket-view --ddp-comm-hook allreduce --no-broadcast-buffers --ddp-static-graph)
  distributed_run ddp "${ddp[@]}" "${base[@]}"
  distributed_run ddp-recipe "${ddp[@]}" "${recipe[@]}" "${base[@]}"
  distributed_run ddp-recipe-tied "${ddp[@]}" "${recipe[@]}" --tied-embedding-ddp "${base[@]}"
  distributed_run single-fused-adamw python3 "${ex[@]}" --parallel none "${regional[@]}" --fused-adamw --compare-single 2
  local fbase=(--baseline "$out/single-fused-adamw.json")
  local fsdp=("${two[@]}" "${ex[@]}" --parallel fsdp2 "${regional[@]}" --fused-adamw)
  if [ "$tiny" = 1 ]; then
    distributed_run fsdp2 "${fsdp[@]}" "${fbase[@]}"
  else
    distributed_run fsdp2-no-reshard "${fsdp[@]}" --no-reshard-after-forward "${fbase[@]}"
    distributed_run fsdp2-no-reshard-no-fused-loss "${fsdp[@]}" --no-reshard-after-forward --no-fused-loss "${fbase[@]}"
  fi
}

job_fsdp() {
  # Memory per GPU, Llama-3.2-3B shape: 3.213 B parameters (28 layers of 100.7 M, 192 MiB each in bf16; the tied
  # embedding 394 M). Pure bf16 with AdamW keeps 8 bytes a parameter (weight, gradient, exp_avg, exp_avg_sq):
  # 23.9 GiB on one GPU, 12.0 GiB per GPU sharded over 2 (fp32 master weights, --mixed-precision, would double
  # both and leave one GPU nothing to compare with, so both run in bf16). Activations kept for the backward,
  # about 90 KB a token and layer in bf16 (3 x 8192 MLP + 6 x 3072 + 2048 k/v elements), 2.4 MiB a token over 28
  # layers: 9.6 GiB for 4 x 1024 tokens; torch.compile's loss adds up to 4 GiB of logits (4096 x 128256,
  # bf16, fp32 in the loss and its gradient), the fused-loss head about none. One GPU, 4 x 1024: 24 + 9.6 + 4 =
  # 38 GiB (8 x 1024: 52); FSDP2, 4 x 1024 per GPU: 12 + 9.6 + 4 + the gathered layers and root (~1.5 GiB) = 27 GiB;
  # with CUDA graphs each layer's forward and backward graph keeps its own copy of the gathered parameters
  # (56 x 192 MiB = 10.5 GiB): 38 GiB at most (8 x 1024: 52). The global-batch run (the losses' reference, twice
  # the per-GPU batch on one GPU: 62 GiB of activations at 8 x 1024 per GPU) checkpoints its activations: it is
  # timed by no ratio, and checkpointing recomputes the same values.
  # Time: a run is ~40-70 s (start, model, one layer's compile, 12 steps); the four 1-GPU runs go two at a time, one
  # per GPU (each GPU runs one process; they share only the host, half its cores each), then the three FSDP2 runs:
  # 3.6 min on 2 H200s at 4 x 1024.
  # The job stops starting runs FSDP_S seconds (default 520) after it began, so it ends inside a 10-minute call.
  local ex=(-m twinkle_fx.bench.distributed) shape two=(python3 -m torch.distributed.run --standalone --nproc_per_node 2)
  local cg=() batch=${FSDP_BATCH:-4} seq=1024 budget=${FSDP_S:-520} gpu=cpu
  local start=$SECONDS
  rm -rf "$out"/fsdp-*.json "$out"/fsdp2-*.json "$out/fsdp-profile"  # an earlier job's runs are no baseline of these
  if [ "$tiny" = 1 ]; then
    # the same sequence on CPU processes (gloo); no CUDA graphs there, so the "-cudagraphs" rows run without them.
    # Inductor's CPU compile of the torch.compile rows takes minutes on 2 shared cores
    shape=(--model llama3b --size tiny --batch 1 --seq 8 --steps 3)
    batch=1 seq=8 budget=${FSDP_S:-3000}
  else
    # lr 1e-4: at the tool's default 1e-3 the 3B model's pure-bf16 training diverges after five steps (the loss
    # climbs from 12.4 to 13) and runs that sum in different orders drift 5-7% apart, which hides whether the
    # FSDP2 run computes the global batch's step; at 1e-4 they agree within 3e-4
    shape=(--model llama3b --size reference --batch "$batch" --seq "$seq" --steps 12 --lr 1e-4)
    cg=(--cudagraphs)
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE '[a-z][0-9]{2,3}' | head -1 \
      | tr 'A-Z' 'a-z')
    nvidia-smi topo -m 2>/dev/null | head -4
  fi
  fsdp_run() {  # fsdp_run NAME COMMAND...: distributed_run within what is left of the job's time
    local left=$(( budget - (SECONDS - start) ))
    if [ "$left" -lt 45 ]; then echo "### $1: not run, ${left} s left of FSDP_S=$budget"; status=1; return; fi
    RUN_S=$(( left < ${RUN_S:-150} ? left : ${RUN_S:-150} )) distributed_run "$@"
  }
  local inductor=(--backend inductor --regional --fused-adamw "${shape[@]}")
  # twinkle's inner compiler: Inductor on the GPU, aot_eager on CPU processes (Inductor's C++ build takes minutes)
  local twinkle=(--backend twinkle --regional --fused-adamw "${shape[@]}")
  [ "$tiny" = 1 ] && twinkle+=(--compiler aot_eager)
  local single=(python3 "${ex[@]}" --parallel none)
  # the two lanes of 1-GPU runs, one per GPU (on CPU processes one after the other: two shared cores). Each lane
  # has half the host's cores, its Inductor compile workers included, so one lane compiling never takes the CPU
  # from the other's timed steps
  local half=$(( $(nproc) / 2 ))
  pin() {  # pin FIRST: this lane (a subshell) and what it starts on cores FIRST..FIRST+half-1
    command -v taskset >/dev/null && taskset -pc "$1-$(( $1 + half - 1 ))" "$BASHPID" >/dev/null
    export TORCHINDUCTOR_COMPILE_THREADS=$(( half > 2 ? half - 1 : 1 ))
  }
  lane0() {
    [ "$tiny" = 1 ] || pin 0
    fsdp_run fsdp-single-inductor "${single[@]}" "${inductor[@]}"
    fsdp_run fsdp-single-twinkle-cudagraphs "${single[@]}" "${twinkle[@]}" "${cg[@]}"
    return $status
  }
  lane1() {
    [ "$tiny" = 1 ] || pin "$half"
    fsdp_run fsdp-single-twinkle "${single[@]}" "${twinkle[@]}"
    # the 2-GPU global batch on one GPU: the losses every FSDP2 run is compared with
    fsdp_run fsdp-global "${single[@]}" "${twinkle[@]}" --batch $(( 2 * batch )) --checkpoint
    return $status
  }
  if [ "$tiny" = 1 ]; then
    lane0; lane1
  else
    CUDA_VISIBLE_DEVICES=0 lane0 > "$out/fsdp-lane0.txt" 2>&1 & local pid0=$!
    CUDA_VISIBLE_DEVICES=1 lane1 > "$out/fsdp-lane1.txt" 2>&1 & local pid1=$!
    wait $pid0 || status=1
    wait $pid1 || status=1
    cat "$out/fsdp-lane0.txt" "$out/fsdp-lane1.txt"
  fi
  # Two decoder layers per fully_shard unit: with one, the GPU waits for FSDP2's per-unit host work (its hooks,
  # copy-in and copy-out) at 4 x 1024 on 2 H200s; two halve it (1.70x against 1.59x with NCCL's collectives, 1.78x
  # against 1.62x with the copy engines'). Otherwise FSDP2's defaults: each unit resharded after its forward,
  # FSDP2's own all-gather order, gradients reduced in their own bf16. On 2 H200s they beat every other knob tried
  # (docs/distributed.md has the sweep): keeping the last layer gathered, explicit prefetching, no resharding, NCCL
  # on fewer CTAs, GEMMs leaving SMs to NCCL; fp32 reduction (twice the reduce-scatter bytes) was the slowest
  local fsdp=("${two[@]}" "${ex[@]}" --parallel fsdp2 --layers-per-unit 2 ${FSDP_EXTRA:-})
  # each FSDP2 run once per FSDP_COLLECTIVES entry (default both): FSDP2's NCCL collectives, and the copy engines'
  # (--collectives copy-engine, named -copy-engine), which leave the GEMMs every SM; the copy engines' first, so a
  # job that runs out of time has what it set out to compare
  local collectives=(${FSDP_COLLECTIVES:-copy-engine nccl}) runs=()
  [ "$tiny" = 1 ] && collectives=(nccl)  # copy engines move GPU memory only
  distributed_one() {  # distributed_one NAME TWIN COMMAND...: an FSDP2 run against its twin and the global batch (the
    # files that exist: a baseline that failed leaves its comparison out, not the run), profiled if FSDP_PROFILE's
    local name=$1 twin=$2 f extra=(); shift 2
    for f in "$out/$twin.json" "$out/fsdp-global.json"; do [ -f "$f" ] && extra+=(--baseline "$f"); done
    # 3 more steps under torch.profiler after the timed ones: a trace and report per rank
    [ "$name" = "${FSDP_PROFILE:-fsdp2-twinkle-copy-engine}" ] && extra+=(--profile "$out/fsdp-profile")
    runs+=("$name")
    fsdp_run "$name" "$@" "${extra[@]}"
  }
  local c suffix
  for c in "${collectives[@]}"; do
    suffix=$([ "$c" = nccl ] || echo "-$c")
    distributed_one "fsdp2-inductor$suffix" fsdp-single-inductor "${fsdp[@]}" "${inductor[@]}" --collectives "$c"
    distributed_one "fsdp2-twinkle$suffix" fsdp-single-twinkle "${fsdp[@]}" "${twinkle[@]}" --collectives "$c"
    distributed_one "fsdp2-twinkle-cudagraphs$suffix" fsdp-single-twinkle-cudagraphs "${fsdp[@]}" "${twinkle[@]}" \
      "${cg[@]}" --collectives "$c"
  done
  # one record of every run, named for docs/performance/
  local record="$out/fsdp-llama3b-${batch}x${seq}-${gpu:-gpu}.json" names=() name
  for name in fsdp-single-inductor fsdp-single-twinkle fsdp-single-twinkle-cudagraphs fsdp-global "${runs[@]}"; do
    names+=("$name=$out/$name.json")
  done
  echo "### $record (for docs/performance/)"
  python3 -m twinkle_fx.bench.distributed_results --out "$record" "${names[@]}" || status=1
  grep -h -A12 "^communication per step" "$out"/fsdp-profile/rank*/profile_report.txt 2>/dev/null
}

job_gemv() {
  timeout "${GEMV_S:-300}" python3 tools/gemv_sweep.py --out "$out/gemv.json" ${GEMV_ARGS:-} > "$out/gemv.txt" 2>&1 \
    || status=1
  cat "$out/gemv.txt"
}

job_attention() {
  timeout "${ATTENTION_S:-300}" python3 tools/gqa_attention_bench.py --out "$out/gqa-attention.json" \
    > "$out/gqa-attention.txt" 2>&1 || status=1
  cat "$out/gqa-attention.txt"
}

job_moe() {
  timeout "${MOE_S:-400}" python3 tools/moe_gemm_sweep.py --out "$out/moe.json" ${MOE_ARGS:-} > "$out/moe.txt" 2>&1 \
    || status=1
  cat "$out/moe.txt"
}

job_flce() {
  timeout "${FLCE_S:-300}" python3 tools/flce_chunked_sweep.py --out "$out/flce-chunked.json" ${FLCE_ARGS:-} \
    > "$out/flce-chunked.txt" 2>&1 || status=1
  sed -n '/^| head/,$p' "$out/flce-chunked.txt"; grep -E "Error|error" "$out/flce-chunked.txt" | tail -5
}

job_norm() {
  timeout "${NORM_S:-300}" python3 tools/rms_norm_bwd_sweep.py --out "$out/rms-norm-bwd.json" ${NORM_ARGS:-} \
    > "$out/rms-norm-bwd.txt" 2>&1 || status=1
  tail -60 "$out/rms-norm-bwd.txt"
}

job_check() {
  timeout "${CHECK_S:-400}" python3 -m twinkle_fx check --out "$out/check.json" > "$out/check.txt" 2>&1 || status=1
  tail -40 "$out/check.txt"
}

SECONDS=0
for job in "${jobs[@]}"; do
  if ! declare -F "job_$job" >/dev/null; then
    echo "unknown job '$job'; jobs:" $(compgen -A function job_ | sed 's/^job_//')
    exit 2
  fi
  echo "=== $job (${SECONDS} s)"
  "job_$job"
done
echo "done in ${SECONDS} s, status $status"
exit $status
