"""Every twinkle_triton kernel compiles for an H100 (sm_90) with the launch options its ops choose on a GPU,
on any machine: ``hopper_compile.py`` runs the ops on CPU tensors through Triton's own launch path, compiling
each call for sm_90 and launching nothing. The interpreter tests check the numbers; this checks what only the
GPU compiler sees: that each kernel compiles, fits the H100's shared memory, and that the GEMM kernels keep the
tensor-core instructions and asynchronous loads their speed depends on, without spilling registers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SHARED_MEMORY = 232448  # bytes a program may use on an H100 / H200 (227 KiB)
# kernels whose time is their matrix products: wgmma (Hopper's tensor-core instruction) and cp.async loads
GEMMS = ("_gate_up_kernel", "_rows_to_pairs_kernel", "_gathered_gemm_kernel", "_weight_grad_kernel",
         "_padded_weight_grad_kernel", "_padded_weight_grad_gluon_kernel", "_flce_tiled_fwd_kernel",
         "_flce_tiled_bwd_kernel")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    backends = pytest.importorskip("triton.backends")
    if "nvidia" not in getattr(backends, "backends", {}):
        pytest.skip("this Triton has no NVIDIA backend to compile with")
    out = tmp_path_factory.mktemp("hopper") / "compiled.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    run = subprocess.run([sys.executable, str(HERE / "hopper_compile.py"), str(out)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(out.read_text())


def test_every_kernel_compiles_for_hopper(compiled):
    failures = compiled["failures"]
    assert not failures, "\n\n".join(f"{f['case']}: {f['traceback']}" for f in failures)
    reached = {c["kernel"] for c in compiled["compiled"]}
    missing = sorted(set(compiled["defined"]) - reached)
    assert not missing, f"no case of hopper_compile.py launches {missing}: add one"


def test_every_launch_fits_the_shared_memory_of_an_h100(compiled):
    over = [c for c in compiled["compiled"] if c["shared"] > SHARED_MEMORY]
    assert not over, over


def test_the_gemm_kernels_use_tensor_cores_and_asynchronous_loads_without_spilling(compiled):
    for kernel in GEMMS:
        # fp32 operands take IEEE dots (no tensor cores); that case checks that the launch fits the shared memory
        launches = [c for c in compiled["compiled"] if c["kernel"] == kernel and not c["case"].endswith(" fp32")]
        assert launches, kernel
        for c in launches:
            assert c["wgmma"] > 0 and c["async_copies"] > 0, c
            # a GEMM whose accumulators spill to local memory runs at a fraction of its speed
            assert c["resources"] is None or c["resources"]["local"] == 0, c


def test_float_arguments_typed_fp64_leave_the_arithmetic_fp32(compiled):
    # Inductor launches a kernel from a compiled graph with its Python-float arguments typed fp64; a kernel that
    # mixed one into fp32 blocks would compute them in fp64 (the norm backward ran 1.6x-20x slower on an H200)
    fp64 = {c["kernel"]: c["fp64_arithmetic"][:3] for c in compiled["compiled"] if c["fp64_arithmetic"]}
    assert not fp64, fp64


def test_the_decode_kernels_compile_as_programmatic_dependents(compiled):
    # launched with launch_pdl on an H100, they wait in griddepcontrol for the kernel before them
    for kernel in ("_gemv_kernel", "_gemv_swiglu_kernel", "_rotary_cache_attention_kernel", "_gqa_combine_kernel"):
        assert any(c["dependent_launch"] for c in compiled["compiled"] if c["kernel"] == kernel), kernel


# Cases whose ops are opaque custom ops (``inline_kernels=False``): a compiled graph calls the op, and torch never
# analyses their launches
OPAQUE_CASES = ("fused_linear_cross_entropy", "gqa_attention", "apply_rotary_pos_emb_to_cache",
                "rotary_cache_attention", "gemv", "embedding_grad_sums", "add_embedding_grad", "moe_swiglu_experts",
                "scale_in_place", "topk")
# What each kernel launched from an inlined op (torch.library.triton_op) writes; the partial-sum buffers are
# outputs too, summed by a second launch
WRITES = {
    "_sum_partials_kernel": {"out_ptr"},
    "_add_gelu_fwd_kernel": {"out_ptr"}, "_add_gelu_bwd_kernel": {"grad_x_ptr"},
    "_mul_add_fwd_kernel": {"out_ptr"}, "_mul_add_bwd_kernel": {"grad_a_ptr", "grad_b_ptr"},
    "_gated_act_fwd_kernel": {"out_ptr"}, "_gated_act_bwd_kernel": {"grad_gate_ptr", "grad_up_ptr", "value_ptr"},
    "_rms_norm_fwd_kernel": {"out_ptr", "sum_ptr"}, "_rms_norm_bwd_kernel": {"grad_x_ptr", "grad_weight_partial_ptr"},
    "_fp32_norm_fwd_kernel": {"out_ptr"},
    "_fp32_norm_bwd_kernel": {"grad_x_ptr", "grad_weight_partial_ptr", "grad_bias_partial_ptr"},
    "_apply_rotary_pos_emb_kernel": {"q_out_ptr", "k_out_ptr"},
}


def test_torch_counts_only_the_outputs_of_an_inlined_launch_as_written(compiled):
    # torch's analysis follows a stored-to pointer back through every argument of a jit helper that computed it,
    # so a helper that loads a kernel's index tables makes them written: AOTAutograd then copies the tables before
    # each launch, and takes a saved input of the backward for one of its outputs (opcheck fails)
    inlined = [c for c in compiled["compiled"] if not c["case"].startswith(OPAQUE_CASES)]
    assert inlined
    unknown = sorted({c["kernel"] for c in inlined} - set(WRITES))
    assert not unknown, f"add what {unknown} write to WRITES"
    wrong = [(c["case"], c["kernel"], c["written"]) for c in inlined
             if not c["written"] or not set(c["written"]) <= WRITES[c["kernel"]]]
    assert not wrong, wrong
