"""A step's GPU time by kernel class: the classes of the kernel names real profiles record, and the split
and idle time of a timeline."""

from __future__ import annotations

import pytest
import torch

from twinkle_fx.bench.profile import ProfileSummary, format_profile
from twinkle_fx.measure.kernel_classes import (KernelClasses, format_kernel_classes, kernel_class, kernel_classes,
                                               launch_shapes)

# names as torch.profiler recorded them on an H200 (cuBLAS, cuDNN, NCCL, ATen, Inductor, twinkle_triton)
NAMES = {
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": "GEMM",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off": "GEMM",
    "triton_tem_fused_mm_0": "GEMM",
    "_gemv_swiglu_kernel": "GEMM",
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1_cga1x1x1_kernel0_0": "attention",
    "_gqa_fwd_kernel": "attention",
    "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "communication",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<c10::BFloat16, 4, "
    "(at::native::ADAM_MODE)1, false>>": "optimizer",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "TensorListMetadata<2>, at::native::(anonymous namespace)::CopyFunctor<c10::BFloat16, c10::BFloat16>>": "copy",
    "void at::native::detail::chunk_cat_cuda_kernel<float, c10::BFloat16>(c10::BFloat16**, float*)": "copy",
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0": "norm",
    "_rms_norm_bwd_kernel": "norm",
    "triton_red_fused__log_softmax__to_copy_nll_loss_forward_1": "loss",
    "_flce_tiled_bwd_kernel": "loss",
    "triton_poi_fused__unsafe_view_mul_silu_silu_backward_view_0": "pointwise",
    "_apply_rotary_pos_emb_kernel": "pointwise",
    "triton_red_fused_sum_3": "reduction",
    "some_kernel_nobody_knows": "other",
}


@pytest.mark.parametrize(("name", "kind"), NAMES.items())
def test_kernel_names_fall_in_their_class(name, kind):
    assert kernel_class(name) == kind


def test_split_counts_side_by_side_kernels_in_each_class_and_idle_once():
    """Two streams: a GEMM under an all-gather, then a gap the GPU waits in; two steps."""
    timeline = [(7, "nvjet_gemm", 0.0, 800.0), (22, "ncclDevKernel_AllGather", 200.0, 1200.0),
                (7, "triton_poi_fused_mul_0", 1200.0, 1400.0), (7, "nvjet_gemm", 1800.0, 2000.0)]
    split = kernel_classes(timeline, steps=2)
    assert split.ms == {"communication": 0.5, "GEMM": 0.5, "pointwise": 0.1}
    assert split.calls == {"communication": 0.5, "GEMM": 1.0, "pointwise": 0.5}
    assert (split.span_ms, split.idle_ms) == (1.0, 0.2)  # 2 ms of span, 0.4 ms with no kernel, over 2 steps
    assert kernel_classes([], steps=1) == KernelClasses(1)


def test_profile_report_prints_the_split_when_the_profile_has_one():
    split = kernel_classes([(7, "nvjet_gemm", 0.0, 3000.0), (7, "_rms_norm_fwd_kernel", 3000.0, 4000.0)], steps=1)
    summary = ProfileSummary(steps=1, host_ms_per_step=5.0, device_ms_per_step=4.0, launches_per_step=2.0,
                             kernels_per_step=2.0, classes=split.to_json())
    report = format_profile(summary, title="row", device=torch.device("cuda", 0))
    assert format_kernel_classes(split) in report
    assert "  GEMM              3.000 ms    75% of the span       1.0 kernels" in report
    assert "  idle              0.000 ms     0% of the span" in report
    assert "by kernel class" not in format_profile(ProfileSummary(1, 5.0, None, None), title="row",
                                                   device=torch.device("cpu"))


def test_the_gemms_of_a_profile_are_told_apart_by_launch_grid():
    # two layers' projections and the LM head share one cuBLAS kernel; their grids tell the shapes apart
    def kernel(name, grid, dur):
        return {"ph": "X", "cat": "kernel", "name": name, "dur": dur, "ts": 0.0, "args": {"grid": grid}}

    nvjet = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    trace = {"traceEvents": [kernel(nvjet, [16, 32, 1], 90.0)] * 6 + [kernel(nvjet, [16, 1002, 1], 2800.0)] * 3
             + [kernel("_rms_norm_fwd_kernel", [4096, 1, 1], 20.0)] * 3
             + [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 5.0, "ts": 0.0}]}
    shapes = launch_shapes(trace, steps=3)
    assert [(s["grid"], s["calls"], s["ms"], s["us_per_call"]) for s in shapes] == [
        ([16, 1002, 1], 1.0, 2.8, 2800.0), ([16, 32, 1], 2.0, 0.18, 90.0)]
    summary = ProfileSummary(steps=3, host_ms_per_step=5.0, device_ms_per_step=4.0, launches_per_step=2.0,
                             kernels_per_step=2.0, gemms=shapes)
    report = format_profile(summary, title="row", device=torch.device("cuda", 0))
    assert "GEMM kernels by launch grid" in report
    assert f"    2.800     1.0     2800.0  16x1002x1       {nvjet}" in report
