"""gemv and gemv_swiglu: linears on a few rows, one to three weights per launch, fused epilogues."""

import pytest
import torch
from kernel_test_utils import DTYPES, check_forward_backward

import twinkle_triton as tt


def _weights(widths, k, dtype, bias):
    weights = [torch.randn(n, k, dtype=dtype) / k**0.5 for n in widths]
    return weights, [torch.randn(n, dtype=dtype) for n in widths] if bias else None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [(1,), (1, 1), (3,), (2, 5)])
@pytest.mark.parametrize("widths,bias", [((37,), False), ((37,), True), ((29, 7, 7), True), ((40, 24), False)])
def test_gemv_matches_reference(rows, widths, bias, dtype, small_blocks):
    k = 53
    x = torch.randn(*rows, k, dtype=dtype)
    weights, biases = _weights(widths, k, dtype, bias)
    n_w = len(weights)

    def ours(x, *wb):
        return tt.gemv(x, wb[:n_w], list(wb[n_w:]) or None)

    def reference(x, *wb):
        return tt.gemv_reference(x, wb[:n_w], list(wb[n_w:]) or None)

    check_forward_backward(ours, reference, (x, *weights, *(biases or [])), dtype, f"gemv {rows} {widths}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_adds_the_residual_before_rounding(dtype, small_blocks):
    x, r = torch.randn(1, 2, 61, dtype=dtype), torch.randn(1, 2, 45, dtype=dtype)
    weights, biases = _weights((45,), 61, dtype, True)
    check_forward_backward(lambda x, w, b, r: tt.gemv(x, [w], [b], residual=r),
                           lambda x, w, b, r: tt.gemv_reference(x, [w], [b], residual=r),
                           (x, weights[0], biases[0], r), dtype, "gemv residual")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [(1,), (4,), (2, 3)])
def test_gemv_swiglu_matches_reference(rows, dtype, small_blocks):
    k = 45
    x = torch.randn(*rows, k, dtype=dtype)
    gate, up = (torch.randn(67, k, dtype=dtype) / k**0.5 for _ in range(2))
    check_forward_backward(tt.gemv_swiglu, tt.gemv_swiglu_reference, (x, gate, up), dtype, f"gemv_swiglu {rows}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [(1,), (2, 3)])
def test_gemv_normalizes_x_first(rows, dtype, small_blocks):
    """norm_weight: x RMS-normalized in the kernel, then the q/k/v product with biases and a residual; the
    gradients reach x through the norm, and the norm weight."""
    k = 53
    x, r = torch.randn(*rows, k, dtype=dtype) * 3, torch.randn(*rows, 45, dtype=dtype)
    g = torch.rand(2 * k, dtype=dtype)[::2] + 0.5  # strided
    weights, biases = _weights((29, 8, 8), k, dtype, True)

    def ours(x, g, r, *wb):
        return tt.gemv(x, wb[:3], wb[3:], residual=r, norm_weight=g, eps=1e-5)

    def reference(x, g, r, *wb):
        return tt.gemv_reference(x, wb[:3], wb[3:], residual=r, norm_weight=g, eps=1e-5)

    check_forward_backward(ours, reference, (x, g, r, *weights, *biases), dtype, f"gemv norm {rows}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_swiglu_normalizes_x_first(dtype, small_blocks):
    k = 45
    x, g = torch.randn(2, 1, k, dtype=dtype) * 3, torch.rand(k, dtype=dtype) + 0.5
    gate, up = (torch.randn(67, k, dtype=dtype) / k**0.5 for _ in range(2))
    check_forward_backward(lambda x, g, gate, up: tt.gemv_swiglu(x, gate, up, norm_weight=g, eps=1e-6),
                           lambda x, g, gate, up: tt.gemv_swiglu_reference(x, gate, up, norm_weight=g, eps=1e-6),
                           (x, g, gate, up), dtype, "gemv_swiglu norm")


def test_strided_inputs_and_transposed_weights():
    x = torch.randn(3, 80)[:, ::2]  # rows of 40 at a column stride of 2
    w = torch.randn(40, 33).t()  # [33, 40] read along its stride
    b = torch.randn(66)[::2]
    check_forward_backward(lambda x, w, b: tt.gemv(x, [w], [b]), lambda x, w, b: tt.gemv_reference(x, [w], [b]),
                           (x, w, b), torch.float32, "gemv strided")
    g, u = torch.randn(40, 21).t(), torch.randn(21, 40)
    check_forward_backward(tt.gemv_swiglu, tt.gemv_swiglu_reference, (x, g, u), torch.float32, "gemv_swiglu strided")


def test_a_realistic_projection_at_full_blocks():
    # Qwen2-0.5B's q, k and v of one token, with the blocks the GPU takes
    x = torch.randn(1, 1, 896)
    weights, biases = _weights((896, 128, 128), 896, torch.float32, True)
    check_forward_backward(lambda x, *wb: tt.gemv(x, wb[:3], wb[3:]), lambda x, *wb: tt.gemv_reference(x, wb[:3], wb[3:]),
                           (x, *weights, *biases), torch.float32, "gemv qkv")


@pytest.mark.parametrize("as_parameters", [False, True])
def test_a_chain_of_calls_reads_each_output_after_it_is_written(as_parameters, small_blocks):
    """Each call reads the one before's output (x, residual): on a device that launches the kernels as programmatic
    dependents they wait for it; model weights (nn.Parameter) are read before that wait, plain tensors after."""
    torch.manual_seed(0)
    k, inter = 96, 160

    def weight(n, kk):
        w = torch.randn(n, kk) / kk**0.5
        return torch.nn.Parameter(w, requires_grad=False) if as_parameters else w

    layers = [(weight(k, k), weight(inter, k), weight(inter, k), weight(k, inter), torch.rand(k) + 0.5)
              for _ in range(3)]
    ours = reference = torch.randn(1, k)
    for wo, wg, wu, wd, g in layers:
        h = tt.gemv(ours, [wo], residual=ours)
        ours = tt.gemv(tt.gemv_swiglu(h, wg, wu, norm_weight=g), [wd], residual=h)
        h = tt.gemv_reference(reference, [wo], residual=reference)
        reference = tt.gemv_reference(tt.gemv_swiglu_reference(h, wg, wu, norm_weight=g), [wd], residual=h)
    torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-4)


def test_zero_rows():
    x = torch.randn(0, 16)
    assert tt.gemv(x, [torch.randn(8, 16)]).shape == (0, 8)
    assert tt.gemv_swiglu(x, torch.randn(8, 16), torch.randn(8, 16)).shape == (0, 8)


def test_opcheck():
    x = torch.randn(2, 16, requires_grad=True)
    w0, w1 = torch.randn(8, 16, requires_grad=True), torch.randn(4, 16, requires_grad=True)
    b0, b1 = torch.randn(8, requires_grad=True), torch.randn(4, requires_grad=True)
    g = torch.rand(16, requires_grad=True)
    torch.library.opcheck(torch.ops.twinkle.gemv.default,
                          (x, w0, w1, None, b0, b1, None, torch.randn(2, 12), None, 1e-6))
    torch.library.opcheck(torch.ops.twinkle.gemv.default, (x, w0, None, None, None, None, None, None, g, 1e-5))
    up = torch.randn(8, 16, requires_grad=True)
    torch.library.opcheck(torch.ops.twinkle.gemv_swiglu.default, (x, w0, up, None, 1e-6))
    torch.library.opcheck(torch.ops.twinkle.gemv_swiglu.default, (x, w0, up, g, 1e-6))


def test_compiles_with_aot_eager():
    x, w = torch.randn(1, 16), torch.randn(8, 16)
    fn = lambda x, w: tt.gemv_swiglu(x, w, w * 2) + tt.gemv(x, [w, w], None)[:, :8]  # noqa: E731
    torch.testing.assert_close(torch.compile(fn, backend="aot_eager", fullgraph=True)(x, w),
                               tt.gemv_swiglu_reference(x, w, w * 2) + x @ w.T)


def test_rejects_bad_inputs_with_a_useful_message():
    x, w = torch.randn(2, 16), torch.randn(8, 16)
    with pytest.raises(ValueError, match="at most 16"):
        tt.gemv(torch.randn(17, 16), [w])
    with pytest.raises(ValueError, match="1 to 3 weights"):
        tt.gemv(x, [w] * 4)
    with pytest.raises(ValueError, match="for every weight or for none"):
        tt.gemv(x, [w, w], [torch.randn(8), None])
    with pytest.raises(ValueError, match=r"weights\[1\]"):
        tt.gemv(x, [w, torch.randn(8, 15)])
    with pytest.raises(ValueError, match="residual"):
        tt.gemv(x, [w], residual=torch.randn(2, 9))
    with pytest.raises(ValueError, match="one shape"):
        tt.gemv_swiglu(x, w, torch.randn(9, 16))
    with pytest.raises(TypeError, match="gate_weight"):
        tt.gemv_swiglu(x, w.int(), w)
    with pytest.raises(ValueError, match=r"norm_weight is \(15,\).*pass the \[16\] weight of x's RMSNorm"):
        tt.gemv(x, [w], norm_weight=torch.randn(15))
    with pytest.raises(TypeError, match="norm_weight"):
        tt.gemv_swiglu(x, w, w, norm_weight=torch.ones(16, dtype=torch.int32))
