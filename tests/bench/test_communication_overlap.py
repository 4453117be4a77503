"""Exposed communication from a GPU's kernel intervals (twinkle_fx.measure.overlap), on synthetic timelines."""

from __future__ import annotations

import json

import pytest

from twinkle_fx.measure.overlap import communication_overlap, format_overlap, kernel_intervals

AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
RS = "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"


def test_collective_fully_under_compute_is_hidden():
    result = communication_overlap([(20, AG, 10, 20), (7, GEMM, 0, 30)])
    assert result.communication_ms == pytest.approx(0.010) and result.exposed_ms == 0.0
    assert result.hidden_fraction == 1.0


def test_exposed_is_collective_time_with_no_compute_on_any_stream():
    # all-gather 0-100 us; compute on two streams covers 10-30 and 20-50 (overlapping each other) and 80-90
    kernels = [(20, AG, 0, 100), (7, GEMM, 10, 30), (9, "triton_rmsnorm", 20, 50), (7, GEMM, 80, 90)]
    result = communication_overlap(kernels)
    assert result.exposed_ms == pytest.approx((100 - 40 - 10) / 1e3)
    assert result.compute_ms == pytest.approx(0.050)
    assert result.collectives["AllGather"]["exposed_ms"] == pytest.approx(0.050)
    assert result.streams == {"communication": [20], "compute": [7, 9]}


def test_concurrent_collectives_count_their_time_once():
    """An all-gather and a reduce-scatter running at once on two streams: the step loses their union once,
    each collective's own row still shows its exposed time."""
    kernels = [(20, AG, 0, 60), (24, RS, 40, 100), (7, GEMM, 50, 70)]
    result = communication_overlap(kernels)
    assert result.communication_ms == pytest.approx(0.100)
    assert result.exposed_ms == pytest.approx(0.080)
    assert result.collectives["AllGather"]["exposed_ms"] == pytest.approx(0.050)
    assert result.collectives["ReduceScatter"]["exposed_ms"] == pytest.approx(0.040)


def test_per_step_figures_divide_by_the_steps():
    kernels = [(20, AG, 0, 10), (20, AG, 100, 110), (7, GEMM, 20, 90)]
    result = communication_overlap(kernels, steps=2)
    assert result.exposed_ms == pytest.approx(0.010)  # 20 us over 2 steps
    assert result.collectives["AllGather"]["calls"] == 1.0
    assert result.span_ms == pytest.approx(0.055) and result.idle_ms == pytest.approx(0.010)  # 10-20, 90-100


def test_compute_slowed_under_communication():
    """The same GEMM takes 10 us alone and 15 us under an all-gather: 1.5x, 5 us extra per overlapped call;
    a GEMM only partly under communication (less than half) counts in neither group."""
    kernels = [(7, GEMM, 0, 10), (7, GEMM, 10, 20),  # alone
               (20, AG, 30, 60), (7, GEMM, 30, 45), (7, GEMM, 45, 60),  # under the all-gather
               (7, GEMM, 57, 69),  # 3 of 12 us under it: neither
               (7, "only_alone_kernel", 70, 75)]
    result = communication_overlap(kernels)
    assert result.slowdown == pytest.approx(1.5)
    assert result.slowdown_extra_ms == pytest.approx(0.010)
    assert [s["name"] for s in result.slowed] == [GEMM] and result.slowed[0]["calls"] == 2


def test_no_communication_no_slowdown():
    result = communication_overlap([(7, GEMM, 0, 10)])
    assert result.communication_ms == 0 and result.hidden_fraction is None and result.slowdown is None
    assert "compute under communication" not in format_overlap(result)


def test_kernels_read_from_a_chrome_trace(tmp_path):
    """Only kernel events of the GPU asked for; copies and CPU operators are not kernels."""
    events = [
        {"ph": "X", "cat": "kernel", "name": AG, "ts": 100.0, "dur": 50.0, "args": {"device": 0, "stream": 20}},
        {"ph": "X", "cat": "kernel", "name": GEMM, "ts": 110.0, "dur": 20.0, "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": GEMM, "ts": 110.0, "dur": 20.0, "args": {"device": 1, "stream": 7}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": 130.0, "dur": 20.0,
         "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 90.0, "dur": 5.0, "args": {}},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    kernels = kernel_intervals(path, device=0)
    assert [(k.stream, k.start, k.end) for k in kernels] == [(20, 100.0, 150.0), (7, 110.0, 130.0)]
    result = communication_overlap(kernels)
    assert result.exposed_ms == pytest.approx(0.030)
    text = format_overlap(result)
    assert "0.03 ms of it exposed" in text and "AllGather" in text and "40% hidden" in text


def test_steps_must_be_positive():
    with pytest.raises(ValueError, match="steps must be at least 1, got 0"):
        communication_overlap([], steps=0)
