"""DeepSeek-V3's interleaved rotary (read interleaved, written in rotate_half layout) against its
reference and against transformers' own function, forward and backward, fp32/bf16/fp16, both layouts."""

import pytest
import torch
from kernel_test_utils import DTYPES, check_forward_backward

import twinkle_triton as tt


def _inputs(batch, seq, n_q, n_k, dim, dtype, unsqueeze_dim):
    # q a slice of a wider tensor (DeepSeek splits q_rot off q_states), k with its own head count
    q = torch.randn(batch, seq, n_q, dim + 5, dtype=dtype)[..., 5:]
    k = torch.randn(batch, seq, n_k * dim, dtype=dtype).view(batch, seq, n_k, dim)
    if unsqueeze_dim == 1:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    # general cos/sin (halves differ), so reading the wrong half shows
    return q, k, torch.randn(batch, seq, dim).to(dtype), torch.randn(batch, seq, dim).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("sizes", [(2, 5, 6, 1, 16), (1, 3, 3, 2, 12), (0, 4, 2, 1, 8)])
def test_deinterleave_matches_reference(sizes, unsqueeze_dim, dtype):
    q, k, cos, sin = _inputs(*sizes, dtype, unsqueeze_dim)
    check_forward_backward(lambda q, k: tt.apply_rotary_pos_emb_deinterleave(q, k, cos, sin, None, unsqueeze_dim),
                           lambda q, k: tt.apply_rotary_pos_emb_deinterleave_reference(q, k, cos, sin, None,
                                                                                      unsqueeze_dim),
                           (q, k), dtype, "rotary deinterleave")


def test_reference_is_transformers_deepseek_v3():
    modeling = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
    q, k, cos, sin = _inputs(2, 5, 4, 1, 8, torch.float32, 1)
    for got, want in zip(tt.apply_rotary_pos_emb_deinterleave(q, k, cos, sin),
                         modeling.apply_rotary_pos_emb_interleave(q, k, cos, sin)):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_gradcheck_opcheck_and_compile():
    q, k, cos, sin = _inputs(1, 3, 2, 1, 8, torch.float64, 1)
    q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda q, k: tt.apply_rotary_pos_emb_deinterleave(q, k, cos, sin), (q, k))
    torch.library.opcheck(torch.ops.twinkle.apply_rotary_pos_emb_deinterleave.default, (q, k, cos, sin, 1))
    got = torch.compile(tt.apply_rotary_pos_emb_deinterleave, backend="aot_eager", fullgraph=True)(q, k, cos, sin)
    for g, w in zip(got, tt.apply_rotary_pos_emb_deinterleave_reference(q, k, cos, sin)):
        torch.testing.assert_close(g, w)


def test_rejects_an_odd_head_dim_and_cos_with_grad():
    q, k, cos, sin = _inputs(1, 2, 2, 1, 8, torch.float32, 1)
    with pytest.raises(ValueError, match="odd"):
        tt.apply_rotary_pos_emb_deinterleave(q[..., :7], k[..., :7], cos[..., :7], sin[..., :7])
    with pytest.raises(ValueError, match="requires grad"):
        tt.apply_rotary_pos_emb_deinterleave(q, k, cos.requires_grad_(), sin)
