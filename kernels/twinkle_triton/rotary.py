"""Rotary position embedding with transformers' ``rotate_half`` semantics, q and k in one launch.

``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` equals transformers'::

    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

with ``rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])``. The full ``cos``/``sin`` rows are used
(no assumption that their halves repeat). q is ``[B, Hq, S, D]`` (``unsqueeze_dim=1``) or
``[B, S, Hq, D]`` (``unsqueeze_dim=2``), k likewise with its own head count (GQA); cos/sin are
anything that broadcasts after the unsqueeze (``[B, S, D]``, ``[1, S, D]``). Inputs are read
through their strides, so the usual ``.view(...).transpose(1, 2)`` q and k cost no copy; outputs
keep q's and k's layout (``empty_like``), as PyTorch's elementwise ops do, unless that layout's
last dim is not unit-stride (the kernel writes head dims at unit stride): those outputs are contiguous.

One program handles one (batch, position): it loads that position's cos/sin row once and applies
it to every q and k head. Backward is the transpose of the rotation (same kernel shape, sin's
sign flipped between halves). cos and sin get no gradient: transformers computes them under
``torch.no_grad()``; ``apply_rotary_pos_emb`` raises if they require grad.

The kernel also serves the other families' layouts (:mod:`.rotary_variants`): where the two columns
of each rotated pair sit (``LAYOUT``), how many columns rotate (the rest are copied) and whether both
columns of a pair share one angle. The Llama layout is the case with no variant.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._checks import check_tensors
from ._dependent_launch import launch_options, wait_for_inputs
from ._launch import compute_dtype, next_power_of_2
from ._library import define_differentiable_op, wrap_triton

# Pair layouts (the kernel's LAYOUT): where the columns (a, b) of rotated pair i sit in a head.
ROTATE_HALF = 0  # i and i + rotary_dim / 2, read and written there (Llama, Phi3, GPT-OSS)
INTERLEAVED = 1  # 2i and 2i + 1, read and written there (Cohere, GLM4)
DEINTERLEAVE = 2  # read at 2i and 2i + 1, written at i and i + rotary_dim / 2 (DeepSeek-V3)
_REINTERLEAVE = 3  # DEINTERLEAVE's gradient: read at i and i + rotary_dim / 2, written at 2i and 2i + 1


@triton.jit
def _rotate_heads(
    src_ptr, dst_ptr, cos_a, cos_b, sin_a, sin_b, b, s, dst_s, n_heads,
    src_sb, src_sh, src_ss, dst_sb, dst_sh, dst_ss, half, head_dim, rotary_dim,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
    LAYOUT: tl.constexpr, COMPUTE_DTYPE: tl.constexpr, TRANSPOSE: tl.constexpr,
):
    heads = tl.arange(0, BLOCK_H)[:, None]
    pairs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < n_heads) & (pairs < half)
    if LAYOUT == 0:  # ROTATE_HALF
        src_a, src_b, dst_a, dst_b = pairs, pairs + half, pairs, pairs + half
    elif LAYOUT == 1:  # INTERLEAVED
        src_a, src_b, dst_a, dst_b = 2 * pairs, 2 * pairs + 1, 2 * pairs, 2 * pairs + 1
    elif LAYOUT == 2:  # DEINTERLEAVE
        src_a, src_b, dst_a, dst_b = 2 * pairs, 2 * pairs + 1, pairs, pairs + half
    else:  # _REINTERLEAVE
        src_a, src_b, dst_a, dst_b = pairs, pairs + half, 2 * pairs, 2 * pairs + 1
    src = src_ptr + b * src_sb + s * src_ss + heads * src_sh
    dst = dst_ptr + b * dst_sb + dst_s * dst_ss + heads * dst_sh
    xa = tl.load(src + src_a, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    xb = tl.load(src + src_b, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    if TRANSPOSE:
        # Rotation^T: grad_xa = ga * cos_a + gb * sin_b, grad_xb = gb * cos_b - ga * sin_a.
        out_a = xa * cos_a + xb * sin_b
        out_b = xb * cos_b - xa * sin_a
    else:
        out_a = xa * cos_a - xb * sin_a
        out_b = xb * cos_b + xa * sin_b
    tl.store(dst + dst_a, out_a.to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + dst_b, out_b.to(dst_ptr.dtype.element_ty), mask=mask)
    if BLOCK_PASS > 0:  # the columns past rotary_dim are copied (their gradient passes through too)
        cols = rotary_dim + tl.arange(0, BLOCK_PASS)[None, :]
        pass_mask = (heads < n_heads) & (cols < head_dim)
        tl.store(dst + cols, tl.load(src + cols, mask=pass_mask, other=0.0), mask=pass_mask)


@triton.jit
def _apply_rotary_pos_emb_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr, v_ptr, v_out_ptr, pos_ptr,
    seq_len, n_q_heads, n_k_heads, half, head_dim, rotary_dim,
    q_sb, q_sh, q_ss, k_sb, k_sh, k_ss,
    qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss,
    v_sb, v_sh, v_ss, vo_sb, vo_sh, vo_ss,
    cos_sb, cos_ss, sin_sb, sin_ss,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
    LAYOUT: tl.constexpr, SHARED_ANGLE: tl.constexpr, COMPUTE_DTYPE: tl.constexpr, TRANSPOSE: tl.constexpr,
    CACHE: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):
    # CACHE: k_out and v_out are a KV cache [B, Hkv, S_max, D]; position s of k (rotated) and of v (copied)
    # goes to the cache's row pos[s], q's to row s of q_out.
    # Pair (a, b) of each head rotates by the angles (cos_a, sin_a), (cos_b, sin_b): each column's own
    # entry of the cos/sin row, or entry i for both columns of pair i (SHARED_ANGLE).
    wait_for_inputs(PDL)
    pid = tl.program_id(0).to(tl.int64)
    b = pid // seq_len
    s = pid % seq_len
    pairs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = pairs < half
    cos_row = cos_ptr + b * cos_sb + s * cos_ss
    sin_row = sin_ptr + b * sin_sb + s * sin_ss
    if SHARED_ANGLE:
        cos_a = tl.load(cos_row + pairs, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        sin_a = tl.load(sin_row + pairs, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        cos_b = cos_a
        sin_b = sin_a
    else:
        if LAYOUT == 1:  # INTERLEAVED: columns 2i, 2i + 1
            angle_a = 2 * pairs
            angle_b = 2 * pairs + 1
        else:
            angle_a = pairs
            angle_b = pairs + half
        cos_a = tl.load(cos_row + angle_a, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        cos_b = tl.load(cos_row + angle_b, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        sin_a = tl.load(sin_row + angle_a, mask=mask, other=0.0).to(COMPUTE_DTYPE)
        sin_b = tl.load(sin_row + angle_b, mask=mask, other=0.0).to(COMPUTE_DTYPE)
    kv_s = tl.load(pos_ptr + s).to(tl.int64) if CACHE else s
    _rotate_heads(q_ptr, q_out_ptr, cos_a, cos_b, sin_a, sin_b, b, s, s, n_q_heads,
                  q_sb, q_sh, q_ss, qo_sb, qo_sh, qo_ss, half, head_dim, rotary_dim,
                  BLOCK_HQ, BLOCK_HALF, BLOCK_PASS, LAYOUT, COMPUTE_DTYPE, TRANSPOSE)
    _rotate_heads(k_ptr, k_out_ptr, cos_a, cos_b, sin_a, sin_b, b, s, kv_s, n_k_heads,
                  k_sb, k_sh, k_ss, ko_sb, ko_sh, ko_ss, half, head_dim, rotary_dim,
                  BLOCK_HK, BLOCK_HALF, BLOCK_PASS, LAYOUT, COMPUTE_DTYPE, TRANSPOSE)
    if CACHE:
        heads = tl.arange(0, BLOCK_HK)[:, None]
        cols = tl.arange(0, BLOCK_D)[None, :]
        vmask = (heads < n_k_heads) & (cols < head_dim)
        v = tl.load(v_ptr + b * v_sb + s * v_ss + heads * v_sh + cols, mask=vmask)
        tl.store(v_out_ptr + b * vo_sb + kv_s * vo_ss + heads * vo_sh + cols, v.to(v_out_ptr.dtype.element_ty),
                 mask=vmask)


def out_like(t: Tensor) -> Tensor:
    """An output for ``t``: its layout (``empty_like``) when the head dim is unit-stride there, the
    kernels' only way to write a head; else contiguous. The fakes use it too, so compiled graphs get
    the strides the kernels produce."""
    out = torch.empty_like(t)
    return out if out.stride(-1) == 1 else torch.empty(t.shape, dtype=t.dtype, device=t.device)


def _bhsd_strides(t: Tensor, unsqueeze_dim: int) -> tuple[int, int, int]:
    """(batch, head, seq) strides of a 4D q/k/out, whichever of the two layouts it has."""
    st = t.stride()
    return (st[0], st[1], st[2]) if unsqueeze_dim == 1 else (st[0], st[2], st[1])


def _cos_sin_rows(t: Tensor, unsqueeze_dim: int, batch: int, seq_len: int, dim: int) -> tuple[Tensor, int, int]:
    """``(t, batch stride, seq stride)`` for reading cos/sin rows by (batch, position); 0 on
    broadcast dims. The usual [B or 1, S, D] needs no view; other broadcastable ranks are expanded."""
    if t.dim() != 3:
        t4 = t.unsqueeze(unsqueeze_dim)
        t4 = (t4 if unsqueeze_dim == 1 else t4.transpose(1, 2)).expand(batch, 1, seq_len, dim)
        t = t4[:, 0]
    if t.stride(-1) != 1:
        t = t.contiguous()
    return t, (t.stride(0) if t.shape[0] != 1 else 0), (t.stride(1) if t.shape[1] != 1 else 0)


def launch(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int, transpose: bool, *,
           rotary_dim: int | None = None, layout: int = ROTATE_HALF, shared_angle: bool = False,
           cache: tuple[Tensor, Tensor, Tensor, Tensor] | None = None):
    """Rotate q and k (or, transposed, their gradients). ``rotary_dim`` (default: the head dim)
    columns rotate, the rest are copied; ``layout`` (:data:`ROTATE_HALF`, :data:`INTERLEAVED`,
    :data:`DEINTERLEAVE`) places each pair's columns; ``shared_angle`` uses entry i of cos/sin for
    both columns of pair i. ``cache=(v, key_cache, value_cache, cache_position)`` (``unsqueeze_dim=1``):
    the rotated k and v itself go to rows ``cache_position`` of the caches, and k's output is the key cache."""
    # Host cost matters here: the GPU work is ~25 us at Llama-8B shapes (B 4, S 1024), so the
    # wrapper reads strides as numbers instead of building views.
    q_out = out_like(q)
    if cache is None:
        k_out, v, v_out, positions = out_like(k), q, q_out, q  # v, v_out, positions unread
    else:
        v, k_out, v_out, positions = cache
        if v.stride(-1) != 1:
            v = v.contiguous()
    if q.numel() == 0 and k.numel() == 0:
        return q_out, k_out
    # Head dim must be unit-stride for the vector loads; a transposed last dim is rare enough to copy.
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    shape = q.shape
    batch, n_q_heads, seq_len, head_dim = (shape[0], shape[1], shape[2], shape[3]) if unsqueeze_dim == 1 else (
        shape[0], shape[2], shape[1], shape[3])
    n_k_heads = k.shape[unsqueeze_dim]
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    cos_width = cos.shape[-1]
    cos, cos_sb, cos_ss = _cos_sin_rows(cos, unsqueeze_dim, batch, seq_len, cos_width)
    sin, sin_sb, sin_ss = _cos_sin_rows(sin, unsqueeze_dim, batch, seq_len, cos_width)
    half = rotary_dim // 2
    block_pass = next_power_of_2(head_dim - rotary_dim) if head_dim > rotary_dim else 0
    block_hq = next_power_of_2(n_q_heads)
    block_hk = next_power_of_2(n_k_heads)
    block_half = next_power_of_2(half)
    # Per program: (Hq + Hk) x D elements; 4 warps up to 4K elements, 8 beyond.
    num_warps = 4 if (block_hq + block_hk) * block_half * 2 <= 4096 else 8
    wrap_triton(_apply_rotary_pos_emb_kernel)[(batch * seq_len,)](
        q, k, cos, sin, q_out, k_out, v, v_out, positions,
        seq_len, n_q_heads, n_k_heads, half, head_dim, rotary_dim,
        *_bhsd_strides(q, unsqueeze_dim), *_bhsd_strides(k, unsqueeze_dim),
        *_bhsd_strides(q_out, unsqueeze_dim), *_bhsd_strides(k_out, unsqueeze_dim),
        *_bhsd_strides(v, unsqueeze_dim), *_bhsd_strides(v_out, unsqueeze_dim),
        cos_sb, cos_ss, sin_sb, sin_ss,
        BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BLOCK_HALF=block_half, BLOCK_PASS=block_pass,
        LAYOUT=_REINTERLEAVE if layout == DEINTERLEAVE and transpose else layout, SHARED_ANGLE=shared_angle,
        COMPUTE_DTYPE=compute_dtype(q.dtype),
        TRANSPOSE=transpose, CACHE=cache is not None, BLOCK_D=next_power_of_2(head_dim), num_warps=num_warps,
        # the decode step's cache write: an opaque op (rotary_cache), launched by us; the other calls may be
        # traced into Inductor's launches, which take no programmatic dependent launch
        **(launch_options(q) if cache is not None else {"PDL": False}),
    )
    return q_out, k_out


def _apply_rotary_pos_emb_impl(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> tuple[Tensor, Tensor]:
    return launch(q, k, cos, sin, unsqueeze_dim, transpose=False)


def _apply_rotary_pos_emb_fake(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> tuple[Tensor, Tensor]:
    return out_like(q), out_like(k)


def _apply_rotary_pos_emb_backward_impl(
    grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int
) -> tuple[Tensor, Tensor]:
    return launch(grad_q, grad_k, cos, sin, unsqueeze_dim, transpose=True)


def _apply_rotary_pos_emb_backward_fake(
    grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int
) -> tuple[Tensor, Tensor]:
    return out_like(grad_q), out_like(grad_k)


_apply_rotary_pos_emb_op = define_differentiable_op(
    "apply_rotary_pos_emb", _apply_rotary_pos_emb_impl, fake=_apply_rotary_pos_emb_fake,
    backward=_apply_rotary_pos_emb_backward_impl, backward_fake=_apply_rotary_pos_emb_backward_fake,
    saved=("cos", "sin", "unsqueeze_dim"),
    gradients=lambda grads, _: (*grads, None, None, None),  # cos and sin get none (see the module docstring)
    reference=lambda *args: apply_rotary_pos_emb_reference(*args),  # defined below
)


# Shape signatures that passed _check_shapes: a layer calls with the same shapes every step, so
# the checks run once per shape (4-8 us of host time a call otherwise). Bounded like a cache.
_CHECKED: set[tuple] = set()
_MAX_CHECKED = 1024


def reset() -> None:
    """Forget the shapes already checked (the next call of each checks again); for test fixtures."""
    _CHECKED.clear()


def check_arguments(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> None:
    # Traced calls (Dynamo, fake or functional tensors; shapes may be symbolic) keep no global state;
    # nor do calls with anything but plain tensors (checked each time, refused if not tensors).
    if torch.compiler.is_compiling() or not type(q) is type(k) is type(cos) is type(sin) is torch.Tensor:
        _check_shapes(q, k, cos, sin, unsqueeze_dim)
        key = None
    else:
        key = (q.shape, k.shape, cos.shape, sin.shape, q.dtype, k.dtype, cos.dtype, sin.dtype,
               q.device, k.device, cos.device, sin.device, unsqueeze_dim)
    if key is not None and key not in _CHECKED:
        _check_shapes(q, k, cos, sin, unsqueeze_dim)
        if len(_CHECKED) >= _MAX_CHECKED:
            _CHECKED.clear()
        _CHECKED.add(key)
    if torch.is_grad_enabled():
        for name, t in (("cos", cos), ("sin", sin)):
            if t.requires_grad:
                raise ValueError(
                    f"apply_rotary_pos_emb: {name} requires grad, but the kernel gives no gradient to "
                    f"cos/sin (transformers computes them under no_grad).\nPass {name}.detach(), or use "
                    "apply_rotary_pos_emb_reference to differentiate through them."
                )


def _check_shapes(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> None:
    check_tensors("apply_rotary_pos_emb", q=q, k=k, cos=cos, sin=sin)
    if unsqueeze_dim not in (1, 2):
        raise ValueError(
            f"apply_rotary_pos_emb: unsqueeze_dim={unsqueeze_dim!r}; use 1 for q/k laid out "
            "[batch, heads, seq, dim] or 2 for [batch, seq, heads, dim]."
        )
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"apply_rotary_pos_emb: q is {tuple(q.shape)} and k is {tuple(k.shape)}; pass 4-D q and k "
            "(the head dimension may differ). Use apply_rotary_pos_emb_reference for other ranks."
        )
    head_dim = 1 if unsqueeze_dim == 1 else 2
    q_rest = q.shape[:head_dim] + q.shape[head_dim + 1:]
    k_rest = k.shape[:head_dim] + k.shape[head_dim + 1:]
    if q_rest != k_rest or q.dtype != k.dtype:
        raise ValueError(
            f"apply_rotary_pos_emb: q is {tuple(q.shape)} {q.dtype}, k is {tuple(k.shape)} {k.dtype}; "
            f"they must agree in every dimension but the head dimension ({head_dim}) and in dtype."
        )
    if q.shape[-1] % 2:
        raise ValueError(f"apply_rotary_pos_emb: head dim {q.shape[-1]} is odd; rotate_half needs an even one.")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() == 3:  # the usual [B or 1, S, D]: checked without building shapes
            fits = all(c == 1 or c == n for c, n in zip(t.shape, q_rest))
            broadcasts = fits or all(c == 1 or n == 1 or c == n for c, n in zip(t.shape, q_rest))
        else:
            try:
                fits = torch.broadcast_shapes(t.unsqueeze(unsqueeze_dim).shape, q.shape) == q.shape
                broadcasts = True
            except (RuntimeError, IndexError):
                fits = broadcasts = False
        if not broadcasts:
            raise ValueError(
                f"apply_rotary_pos_emb: {name} of shape {tuple(t.shape)} does not broadcast to q "
                f"{tuple(q.shape)} after unsqueeze({unsqueeze_dim}); pass [batch, seq, dim]."
            )
        if not fits:
            raise ValueError(
                f"apply_rotary_pos_emb: {name} of shape {tuple(t.shape)} would broadcast q "
                f"{tuple(q.shape)} to a larger shape; pass [batch, seq, dim] (or [1, seq, dim])."
            )
        if t.shape[-1] != q.shape[-1]:  # a last dimension of 1 broadcasts in PyTorch; the kernel reads whole rows
            raise ValueError(
                f"apply_rotary_pos_emb: {name} of shape {tuple(t.shape)} has {t.shape[-1]} angle(s) per position "
                f"for heads of {q.shape[-1]}; pass one per column ({name}.expand(*{name}.shape[:-1], {q.shape[-1]}))."
            )


def apply_rotary_pos_emb(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
) -> tuple[Tensor, Tensor]:
    """Rotary embedding of q and k in one launch (transformers' ``apply_rotary_pos_emb``).

    Args:
        q (`torch.Tensor`): ``[B, Hq, S, D]`` (``unsqueeze_dim=1``) or ``[B, S, Hq, D]`` (``=2``),
            any strides with a unit-stride last dim (others are copied).
        k (`torch.Tensor`): like q with its own head count.
        cos (`torch.Tensor`): ``[B, S, D]`` or ``[1, S, D]``; no gradient flows to it.
        sin (`torch.Tensor`): like cos.
        unsqueeze_dim (`int`, defaults to 1): the head dimension of q and k.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: ``(q_embed, k_embed)``, laid out like q and k.

    Raises:
        TypeError: q, k, cos or sin is not a floating-point tensor.
        ValueError: bad ranks/shapes/dtypes, odd head dim, cos/sin requiring grad, or tensors on two devices.

    Example:
        ```python
        q = q_proj(x).view(B, S, Hq, D).transpose(1, 2)
        k = k_proj(x).view(B, S, Hk, D).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        ```
    """
    check_arguments(q, k, cos, sin, unsqueeze_dim)
    return _apply_rotary_pos_emb_op(q, k, cos, sin, unsqueeze_dim)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb_reference(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
) -> tuple[Tensor, Tensor]:
    """Plain PyTorch ``apply_rotary_pos_emb`` (transformers' Qwen2 version)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
