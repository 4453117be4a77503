"""apply_rotary_pos_emb (twinkle::apply_rotary_pos_emb): q and k in one launch, strided, GQA."""

import pytest
import torch
from kernel_test_utils import DTYPES, assert_close, check_forward_backward

import twinkle_triton as tt


def _qkv(batch, seq, n_q, n_k, dim, dtype, unsqueeze_dim, *, repeated_halves=True):
    """q/k as transformers builds them: a projection's output viewed per head (and transposed to
    [B, H, S, D] for unsqueeze_dim=1), so they are not contiguous. cos/sin as transformers builds them,
    cat(freqs, freqs) (``repeated_halves``), or with every column at its own angle: the kernel must read
    each column's own entry, and with repeated halves reading the other half's gives the same numbers."""
    q = torch.randn(batch, seq, n_q * dim, dtype=dtype).view(batch, seq, n_q, dim)
    k = torch.randn(batch, seq, n_k * dim, dtype=dtype).view(batch, seq, n_k, dim)
    if unsqueeze_dim == 1:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    angles = torch.randn(batch, seq, dim // 2, dtype=torch.float32)
    emb = torch.cat((angles, angles if repeated_halves else torch.randn_like(angles)), dim=-1)
    return q, k, emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("sizes", [(2, 5, 6, 2, 16), (1, 1, 3, 3, 8), (2, 3, 7, 1, 10), (0, 4, 2, 2, 8)])
def test_matches_reference(sizes, unsqueeze_dim, dtype):
    """Outputs and the gradients w.r.t. q and k (the transposed rotation), each column at its own angle."""
    q, k, cos, sin = _qkv(*sizes, dtype, unsqueeze_dim, repeated_halves=False)
    check_forward_backward(
        lambda q, k: tt.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim),
        lambda q, k: tt.apply_rotary_pos_emb_reference(q, k, cos, sin, unsqueeze_dim),
        (q, k), dtype, f"rotary unsqueeze_dim={unsqueeze_dim}",
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference_with_transformers_cos_sin(dtype):
    """The tables a model passes (Qwen2RotaryEmbedding's cat(freqs, freqs)), gradients included."""
    q, k, cos, sin = _qkv(2, 5, 6, 2, 16, dtype, 1)
    check_forward_backward(lambda q, k: tt.apply_rotary_pos_emb(q, k, cos, sin),
                           lambda q, k: tt.apply_rotary_pos_emb_reference(q, k, cos, sin), (q, k), dtype,
                           "rotary, repeated halves")


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_outputs_keep_layout_of_q_and_k(unsqueeze_dim):
    q, k, cos, sin = _qkv(2, 5, 4, 2, 8, torch.float32, unsqueeze_dim)
    q_out, k_out = tt.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
    q_ref, k_ref = tt.apply_rotary_pos_emb_reference(q, k, cos, sin, unsqueeze_dim)
    assert q_out.stride() == q_ref.stride() == q.stride()
    assert k_out.stride() == k_ref.stride() == k.stride()


def test_general_cos_sin_halves_and_batch_broadcast():
    """cos/sin whose halves differ and a [1, S, D] cos shared by the batch."""
    q, k, _, _ = _qkv(3, 4, 2, 1, 8, torch.float32, 1)
    cos, sin = torch.randn(1, 4, 8), torch.randn(1, 4, 8)
    check_forward_backward(
        lambda q, k: tt.apply_rotary_pos_emb(q, k, cos, sin),
        lambda q, k: tt.apply_rotary_pos_emb_reference(q, k, cos, sin),
        (q, k), torch.float32, "rotary general cos/sin",
    )


@pytest.mark.parametrize("batch_rows", [1, 2])
def test_one_angle_per_position_is_refused_and_its_expansion_is_right(batch_rows):
    """A last dimension of 1 broadcasts in the reference; the kernel reads a row of head-dim angles."""
    q, k, _, _ = _qkv(2, 3, 2, 1, 8, torch.float32, 1)
    cos, sin = torch.randn(batch_rows, 3, 1), torch.randn(batch_rows, 3, 1)
    with pytest.raises(ValueError, match=r"cos of shape .* has 1 angle\(s\) per position for heads of 8.*expand"):
        tt.apply_rotary_pos_emb(q, k, cos, sin)
    cos, sin = cos.expand(batch_rows, 3, 8), sin.expand(batch_rows, 3, 8)
    check_forward_backward(
        lambda q, k: tt.apply_rotary_pos_emb(q, k, cos, sin),
        lambda q, k: tt.apply_rotary_pos_emb_reference(q, k, cos, sin),
        (q, k), torch.float32, "rotary expanded cos/sin",
    )


def test_gradcheck_fp64():
    q, k, cos, sin = _qkv(1, 3, 2, 1, 4, torch.float64, 1)
    q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda q, k: tt.apply_rotary_pos_emb(q, k, cos, sin), (q, k))


def test_opcheck():
    q, k, cos, sin = _qkv(2, 3, 4, 2, 8, torch.float32, 1)
    torch.library.opcheck(torch.ops.twinkle.apply_rotary_pos_emb.default,
                          (q.requires_grad_(), k.requires_grad_(), cos, sin, 1))
    torch.library.opcheck(torch.ops.twinkle.apply_rotary_pos_emb_backward.default,
                          (torch.randn(q.shape), torch.randn(k.shape), cos, sin, 1))


def test_compiles_with_aot_eager_forward_and_backward():
    q, k, cos, sin = _qkv(2, 3, 4, 2, 8, torch.float32, 1)
    q, k = q.detach().requires_grad_(), k.detach().requires_grad_()

    def fn(rope, q, k):
        q_embed, k_embed = rope(q, k, cos, sin)
        return (q_embed @ k_embed.repeat_interleave(2, dim=1).transpose(-1, -2)).sum()

    got = torch.compile(fn, backend="aot_eager", fullgraph=True)(tt.apply_rotary_pos_emb, q, k)
    want = fn(tt.apply_rotary_pos_emb_reference, q, k)
    assert_close(got, want, torch.float32, "output")
    for g, w in zip(torch.autograd.grad(got, (q, k)), torch.autograd.grad(want, (q, k))):
        assert_close(g, w, torch.float32, "grad")


def test_rejects_bad_inputs_with_a_useful_message():
    q, k, cos, sin = _qkv(1, 3, 2, 1, 8, torch.float32, 1)
    with pytest.raises(ValueError, match="unsqueeze_dim"):
        tt.apply_rotary_pos_emb(q, k, cos, sin, 3)
    with pytest.raises(ValueError, match="requires grad"):
        tt.apply_rotary_pos_emb(q, k, cos.requires_grad_(), sin)
    with pytest.raises(ValueError, match="broadcast"):
        tt.apply_rotary_pos_emb(q, k, torch.randn(1, 5, 8), sin)
