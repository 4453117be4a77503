"""The kernels' multi-block paths at the tests' small shapes, on the CPU (interpreter) and the GPU.

A kernel that covers a row or a flat range in blocks takes the whole row in one block under the
interpreter, and the tests' rows (123 columns, a vocabulary of 123) fit one GPU block too: the loops
over several blocks (the online-softmax merge of the loss kernels, the last partial block, a row split
across programs) would then run at real sizes only. ``small_blocks`` (tests/kernels/conftest.py) caps
every such block at 16 elements through ``twinkle_triton._launch.BLOCK_LIMIT``; the RMSNorm backward
takes several rows per tile on every device. Each case keeps an fp32 and a bf16 dtype.
"""

import pytest
import torch
from kernel_test_utils import check_forward_backward

import twinkle_triton as tt
from twinkle_triton import fused_linear_cross_entropy_vocab_chunked as vocab_chunked

DTYPES = (torch.float32, torch.bfloat16)
VOCAB = 123  # 8 blocks of 16, the last one partial


def _flce_inputs(n, hidden, vocab, dtype):
    x = torch.randn(n, hidden, dtype=dtype)
    weight = (torch.randn(vocab, hidden) / hidden**0.5).to(dtype)
    bias = torch.randn(vocab, dtype=dtype)
    target = torch.randint(0, vocab, (n,))
    target[2::3] = -100
    return x, weight, bias, target


def _check_flce(x, weight, bias, target, dtype, what, **options):
    def ours(x, w, b):
        return tt.fused_linear_cross_entropy(x, w, target, b, **options)

    def reference(x, w, b):
        return tt.fused_linear_cross_entropy_reference(x, w, target, b, **options)

    check_forward_backward(ours, reference, (x, weight, bias), dtype, what)


@pytest.mark.parametrize("dtype", DTYPES)
def test_chunked_loss_merges_its_vocabulary_blocks(dtype, small_blocks):
    """The chunked strategy's row kernel keeps a running max and sum of exp per lane over the
    vocabulary blocks: each block rescales the sum by exp(old max - new max)."""
    x, weight, bias, target = _flce_inputs(13, 24, VOCAB, dtype)
    _check_flce(x, weight, bias, target, dtype, "chunked, 16-column blocks", chunk_size=5)


@pytest.mark.parametrize(("dtype", "forward"), [(torch.float32, "cublas"), (torch.bfloat16, "cublas"),
                                                (torch.bfloat16, "tiled")])
def test_vocab_chunked_rows_loop_over_blocks(dtype, forward, small_blocks, monkeypatch):
    """The vocab-chunked strategy's row kernels: the chunk statistics loop over blocks (cuBLAS
    forward), the gradient kernel spreads a chunk row over programs."""
    monkeypatch.setattr(vocab_chunked, "VOCAB_CHUNKED_FORWARD", forward)
    x, weight, bias, target = _flce_inputs(13, 24, VOCAB, dtype)
    _check_flce(x, weight, bias, target, dtype, f"vocab_chunked {forward}, 16-column blocks",
                strategy="vocab_chunked", chunk_size=50, label_smoothing=0.1, softcap=5.0, reduction="none")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("strategy", ["chunked", "vocab_chunked", "tiled"])
def test_loss_at_a_real_vocabulary(strategy, dtype):
    """A 50,257-word vocabulary (GPT-2's) at the GPU's own block sizes: the chunked kernel's 8192-column
    blocks, the vocab-chunked strategy's 1024-column row blocks and several vocabulary chunks, the
    tiled strategy's tiles. GPU only: interpreted, the six cases take over a minute on two cores and run
    the interpreter's whole-row blocks, not these (the small-block cases above stand in on the CPU)."""
    x, weight, bias, target = _flce_inputs(256, 64, 50257, dtype)
    options = {"strategy": strategy}
    if strategy == "vocab_chunked":
        options["chunk_size"] = 12288  # 5 chunks, the last partial
    elif strategy == "tiled":
        options["fp32_accumulation"] = True
    _check_flce(x, weight, bias, target, dtype, f"{strategy}, vocabulary 50257", **options)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_activations_split_rows_across_programs(dtype, small_blocks):
    """Packed halves, two tensors and GPT-OSS's interleaved columns, 123 columns in 8 programs a row."""
    packed, gate, up = torch.randn(5, 2 * 123, dtype=dtype), torch.randn(3, 123, dtype=dtype), torch.randn(3, 123, dtype=dtype)
    check_forward_backward(tt.silu_and_mul, tt.silu_and_mul_reference, (packed,), dtype, "silu_and_mul")
    check_forward_backward(lambda g, u: tt.gelu_mul(g, u, "tanh"), lambda g, u: tt.gelu_mul_reference(g, u, "tanh"),
                           (gate, up), dtype, "gelu_mul")
    interleaved = 4 * torch.randn(5, 2 * 123, dtype=dtype)
    check_forward_backward(lambda x: tt.clamped_swiglu(x, 1.702, 7.0),
                           lambda x: tt.clamped_swiglu_reference(x, 1.702, 7.0), (interleaved,), dtype,
                           "clamped_swiglu")


@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_kernels_span_several_programs(dtype, small_blocks):
    """Flat 16-element blocks that cut across rows: add_gelu's row bias is indexed per element."""
    x, bias = torch.randn(5, 123, dtype=dtype), torch.randn(123, dtype=dtype)
    check_forward_backward(tt.add_gelu, tt.add_gelu_reference, (x, bias), dtype, "add_gelu")
    a, b, c = (torch.randn(5, 123, dtype=dtype) for _ in range(3))
    check_forward_backward(tt.mul_add, tt.mul_add_reference, (a, b, c), dtype, "mul_add")


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_backward_walks_several_tiles_per_program(dtype):
    """123 columns: 8 rows a tile; 75 rows are 10 tiles (the last partial) over at most 4 programs under
    the interpreter (more on a GPU), so a program adds several tiles into its weight-gradient share."""
    x, residual, weight = torch.randn(75, 123, dtype=dtype), torch.randn(75, 123, dtype=dtype), torch.randn(123, dtype=dtype)
    check_forward_backward(tt.rms_norm, tt.rms_norm_reference, (x, weight, 1e-6), dtype, "rms_norm")
    check_forward_backward(tt.add_rms_norm, tt.add_rms_norm_reference, (x, residual, weight, 1e-6), dtype,
                           "add_rms_norm")
