"""Grouped-query attention that reads each KV head once: ``scaled_dot_product_attention`` over
transformers' ``repeat_kv(key)`` / ``repeat_kv(value)`` without materializing the repeat.

``gqa_attention(query, key, value, attn_mask, scale)`` equals::

    G = query.shape[1] // key.shape[1]          # query heads per KV head
    k = key[:, :, None].expand(B, Hkv, G, S, D).reshape(B, Hq, S, D)   # transformers' repeat_kv
    v = value[:, :, None].expand(B, Hkv, G, S, D).reshape(B, Hq, S, D)
    F.scaled_dot_product_attention(query, k, v, attn_mask=attn_mask, scale=scale)

except that a query row whose mask excludes every key always returns zeros: SDPA's own result for
such a row depends on its backend (zeros from the fused kernels in torch 2.13 on CPU, the mean of V
from its math path with a bool mask).

Why: transformers' ``sdpa_attention_forward`` calls ``repeat_kv`` whenever a mask is given, which is
always with a static cache, so each decoder layer of Qwen2-0.5B decoding 32 sequences over a
1024-token cache writes and reads K and V expanded from 2 to 14 heads (58.7 MB each, bf16) before
SDPA reads them again. These kernels hold all ``G * L`` query rows of a KV group in one program and
stream the group's K and V once.

Forward (flash-decoding): one program per (batch, KV head, block of the group's ``G * L`` rows,
split of the keys); it loops over its keys in blocks of ``BLOCK_S`` with an online softmax in fp32.
With several splits a second kernel combines the splits' partial results. Key blocks whose mask
excludes every row are skipped without reading K or V (a static cache's unwritten tail). The
softmax statistics are saved for the backward: the row max and the log of the row sum (natural
units) apart, their sum being the log-sum-exp (apart, a row max of finfo.min keeps the log sum).

Backward: the dQ kernel (one program per (batch, KV head, row block), looping over the keys) also
computes ``delta = rowsum(dO * O)``; the dK/dV kernel (one program per (batch, KV head, key block))
sums over all ``G * L`` rows of the group, so no atomics. The mask gets no gradient.
"""

import math

import torch
from torch import Tensor

from ._checks import ANY_DTYPE, check_tensors
from ._dependent_launch import launch_options
from ._gqa_attention_kernels import _gqa_bwd_dkdv_kernel, _gqa_bwd_dq_kernel, _gqa_combine_kernel, _gqa_fwd_kernel
from ._launch import cdiv, dot_options, interpreting, multiprocessor_count, next_power_of_2
from ._library import define_differentiable_op, wrap_triton

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256

# Flash-decoding split heuristic (forward). Decode (L = 1) gives one program per (batch, KV head):
# 64 programs for Qwen2-0.5B at batch 32 (2 KV heads), half the 132 SMs of an H100 idle and the rest
# hold one memory stream each. Splitting the keys gives ~PROGRAMS_PER_SM programs per SM, so
# enough loads are in flight to stream the cache at memory bandwidth; each split keeps at least
# MIN_SPLIT_KEYS keys so that its fp32 partial result (G * L * (D + 2) * 4 bytes: 1.8 KB for
# G = 7, D = 64) stays small next to the K/V bytes it reads (128 keys x 64 dims x 2 bytes x 2 =
# 32 KB) and the combine kernel's traffic stays a few percent. Untuned: at B = 32, Hkv = 2,
# S = 1024 this gives 8 splits of 128 keys (512 programs); tools/gqa_attention_bench.py sweeps the
# split count on the device.
PROGRAMS_PER_SM = 4
MIN_SPLIT_KEYS = 128
# Short caches at batch 1 are a latency problem, not a bandwidth one: when MIN_SPLIT_KEYS-key splits would
# leave fewer programs than half the SMs, each split takes one key block (BLOCK_S keys) so that every program
# makes one pass. generate()'s step at S = 640 on an H200 (tools/gqa_attention_bench.py): Qwen2-0.5B's heads
# 6.06 -> 4.82 us, Llama-3.2-1B's 6.21 -> 4.87 us; batch 32 and S = 8192 keep MIN_SPLIT_KEYS (more, shorter
# splits measured no faster there).


# With a symbolic (dynamic) batch or key length under torch.compile the split count cannot follow
# them without a recompile per value (it sizes the combine kernel's block), so it is fixed: 8 splits
# give the heuristic's 512 programs at the Qwen2 decode shape; splits past the keys are empty (they
# return no weight to the combine).
SYMBOLIC_SPLITS = 8


def _num_splits(programs, seq_k, block_s: int, device: torch.device) -> tuple[int, int]:
    """(splits, keys per split): splits of the keys so that ``programs * splits`` fills the GPU
    (see PROGRAMS_PER_SM), each at least MIN_SPLIT_KEYS keys (one ``block_s`` block where those would
    leave most SMs idle) and a multiple of ``block_s``.
    Under the interpreter the "GPU" is one SM: a few splits still happen (S = 300 gives 3), so the
    combine path runs in CPU tests too. ``programs`` and ``seq_k`` may be SymInts (see SYMBOLIC_SPLITS)."""
    if not (isinstance(programs, int) and isinstance(seq_k, int)):
        return _split_length(seq_k, SYMBOLIC_SPLITS, block_s)
    if device.type == "cuda" and not interpreting():
        sms = multiprocessor_count(device)
    else:
        sms = 1
    min_keys = MIN_SPLIT_KEYS if 2 * programs * cdiv(seq_k, MIN_SPLIT_KEYS) >= sms else block_s
    splits = max(1, min(cdiv(PROGRAMS_PER_SM * sms, max(programs, 1)), cdiv(seq_k, min_keys)))
    return _split_length(seq_k, splits, block_s)


def _split_length(seq_k, splits: int, block_s: int) -> tuple[int, int]:
    """(splits, keys per split) for about ``splits`` splits of whole ``block_s`` blocks; for an int
    ``seq_k`` the splits that would be empty are dropped, a SymInt keeps ``splits`` (no guard)."""
    split_len = block_s * torch.sym_max(1, cdiv(seq_k, splits * block_s))
    if isinstance(seq_k, int):
        return cdiv(max(seq_k, 1), split_len), split_len
    return splits, split_len


def _blocks(rows, head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_S, BLOCK_D, num_warps) of the forward. tl.dot needs every side >= 16, so the
    group's rows are padded to 16 (decode: G * L = 7 rows for Qwen2); more than 64 rows are tiled.
    Comparisons, not next_power_of_2, on ``rows``: it is a SymInt when L is dynamic."""
    block_d = max(16, next_power_of_2(head_dim))
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    block_s = 64 if block_d <= 128 else 32
    num_warps = 4 if block_m * block_d <= 64 * 128 else 8
    return block_m, block_s, block_d, num_warps


def _mask_layout(attn_mask: Tensor | None, shape: tuple[int, int, int, int], fallback: Tensor):
    """(tensor the kernel reads, its four strides broadcast to (B, Hq, L, S), has mask, is bool)."""
    if attn_mask is None:
        return fallback, (0, 0, 0, 0), False, False
    lead = 4 - attn_mask.dim()
    sizes = (1,) * lead + tuple(attn_mask.shape)
    strides = (0,) * lead + tuple(attn_mask.stride())
    strides = tuple(0 if size == 1 else stride for size, stride in zip(sizes, strides))
    is_bool = attn_mask.dtype == torch.bool
    # passed as it is (Triton reads a torch.bool tensor as *i1): a uint8 view would be aten.view.dtype
    # in the traced graph, which Inductor cannot lower for bool (torch 2.11, "torch.bool is not
    # supported by torch.iinfo")
    return attn_mask, strides, True, is_bool


def _gqa_forward(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, scale: float,
                 num_splits: int | None = None) -> tuple[Tensor, Tensor]:
    """(out, stats): ``stats[..., 0]`` the row max of the scaled, masked scores, ``stats[..., 1]``
    the log of the softmax denominator shifted by it (both 0 for a fully masked row).
    ``num_splits`` overrides the split heuristic (tests, the benchmark's sweep)."""
    batch, n_heads, seq_q, head_dim = query.shape
    n_kv_heads, seq_k = key.shape[1], key.shape[2]
    group = n_heads // n_kv_heads
    out = torch.empty((batch, n_heads, seq_q, head_dim), dtype=query.dtype, device=query.device)
    stats = torch.empty((batch, n_heads, seq_q, 2), dtype=torch.float32, device=query.device)
    if out.numel() == 0:
        return out, stats
    block_m, block_s, block_d, num_warps = _blocks(group * seq_q, head_dim)
    row_blocks = cdiv(group * seq_q, block_m)
    if num_splits is None:
        splits, split_len = _num_splits(batch * n_kv_heads * row_blocks, seq_k, block_s, query.device)
    else:
        splits, split_len = _split_length(seq_k, num_splits, block_s)
    mask, (smb, smh, sml, sms), has_mask, mask_bool = _mask_layout(attn_mask, (batch, n_heads, seq_q, seq_k), query)
    if splits > 1:
        part_o = torch.empty((batch * n_heads * seq_q * splits, head_dim), dtype=torch.float32, device=query.device)
        part_stats = torch.empty((batch * n_heads * seq_q * splits, 2), dtype=torch.float32, device=query.device)
    else:  # never written (the kernel stores into out and stats): an input, so no output is passed twice
        part_o, part_stats = query, query
    wrap_triton(_gqa_fwd_kernel)[(batch * n_kv_heads, row_blocks, splits)](
        query, key, value, mask, out, stats, part_o, part_stats,
        *query.stride(), *key.stride(), *value.stride(), smb, smh, sml, sms,
        n_kv_heads, group, seq_q, seq_k, head_dim, split_len, splits, scale,
        HAS_MASK=has_mask, MASK_BOOL=mask_bool, SPLIT=splits > 1,
        BLOCK_M=block_m, BLOCK_S=block_s, BLOCK_D=block_d, **dot_options(query.dtype),
        num_warps=num_warps, **launch_options(query),
    )
    if splits > 1:
        combine_splits(part_o, part_stats, out, stats, splits, block_d)
    return out, stats


def combine_splits(part_o: Tensor, part_stats: Tensor, out: Tensor, stats: Tensor, splits: int, block_d: int,
                   cache_length: Tensor | None = None, advance: int = 0) -> None:
    """The combine kernel over the forward's ``splits`` partial results of each row of ``out``; with
    ``cache_length``, it also adds ``advance`` to it (after every program of the forward has read it)."""
    batch, n_heads, seq_q, head_dim = out.shape
    wrap_triton(_gqa_combine_kernel)[(batch * n_heads * seq_q,)](
        part_o, part_stats, out, stats, stats if cache_length is None else cache_length, splits, head_dim, advance,
        BLOCK_SPLITS=max(2, next_power_of_2(splits)), BLOCK_D=block_d, ADVANCE=cache_length is not None,
        num_warps=1 if block_d <= 64 else 2, **launch_options(out),
    )


def _gqa_attention_impl(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None,
                        scale: float) -> tuple[Tensor, Tensor]:
    return _gqa_forward(query, key, value, attn_mask, scale)


def _gqa_attention_fake(query, key, value, attn_mask, scale):
    batch, n_heads, seq_q, head_dim = query.shape
    return (query.new_empty((batch, n_heads, seq_q, head_dim)),
            query.new_empty((batch, n_heads, seq_q, 2), dtype=torch.float32))


def _gqa_attention_backward_impl(
    grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None,
    out: Tensor, stats: Tensor, scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    batch, n_heads, seq_q, head_dim = query.shape
    n_kv_heads, seq_k = key.shape[1], key.shape[2]
    group = n_heads // n_kv_heads
    device = query.device
    grad_q = torch.empty((batch, n_heads, seq_q, head_dim), dtype=query.dtype, device=device)
    grad_k = torch.empty((batch, n_kv_heads, seq_k, head_dim), dtype=key.dtype, device=device)
    grad_v = torch.empty((batch, n_kv_heads, seq_k, head_dim), dtype=value.dtype, device=device)
    if grad_q.numel() == 0 or grad_k.numel() == 0:
        return grad_q.zero_(), grad_k.zero_(), grad_v.zero_()
    delta = torch.empty((batch, n_heads, seq_q), dtype=torch.float32, device=device)
    mask, (smb, smh, sml, sms), has_mask, mask_bool = _mask_layout(attn_mask, (batch, n_heads, seq_q, seq_k), query)
    block_d = max(16, next_power_of_2(head_dim))
    # Correctness first: small tiles keep dK, dV (BLOCK_S x BLOCK_D fp32 each) in registers up to D = 256.
    block_m = 64 if interpreting() else (32 if block_d <= 128 else 16)
    block_s = 64 if interpreting() or block_d <= 64 else 32
    num_warps = 4 if block_d <= 64 else 8
    common = dict(HAS_MASK=has_mask, MASK_BOOL=mask_bool, BLOCK_M=block_m, BLOCK_S=block_s, BLOCK_D=block_d,
                  num_warps=num_warps, **dot_options(query.dtype))
    strides = (*query.stride(), *key.stride(), *value.stride(), smb, smh, sml, sms, *grad_out.stride())
    sizes = (n_kv_heads, group, seq_q, seq_k, head_dim, scale)
    wrap_triton(_gqa_bwd_dq_kernel)[(batch * n_kv_heads, cdiv(group * seq_q, block_m))](
        query, key, value, mask, grad_out, out, stats, delta, grad_q, *strides, *sizes, **common,
    )
    wrap_triton(_gqa_bwd_dkdv_kernel)[(batch * n_kv_heads, cdiv(seq_k, block_s))](
        query, key, value, mask, grad_out, stats, delta, grad_k, grad_v, *strides, *sizes, **common,
    )
    return grad_q, grad_k, grad_v


def _gqa_attention_backward_fake(grad_out, query, key, value, attn_mask, out, stats, scale):
    return (query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape))


# Opaque to Inductor (custom ops, not triton_ops): the forward's kernels launch as programmatic dependents
# (_dependent_launch), which Inductor's launcher of user kernels does not do; the op runs in decode steps, as a CUDA
# graph, where its dispatch costs nothing.
_gqa_attention_op = define_differentiable_op(
    "gqa_attention", _gqa_attention_impl, fake=_gqa_attention_fake, inline_kernels=False,
    backward=_gqa_attention_backward_impl, backward_fake=_gqa_attention_backward_fake,
    saved=("query", "key", "value", "attn_mask", "output[0]", "output[1]", "scale"),
    non_differentiable=("output[1]",),  # the softmax statistics: the backward's input, never differentiated
    gradients=lambda grads, _: (*grads, None, None),  # the mask gets none
    # the statistics are the kernels' own (for their backward): none without them
    reference=lambda *args: (gqa_attention_reference(*args), None),  # defined below
)


def _check(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None) -> None:
    check_tensors("gqa_attention", dtypes=ANY_DTYPE, query=query, key=key, value=value, attn_mask=attn_mask)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(f"gqa_attention: {name} must be a 4-D tensor (batch, heads, seq, head_dim), got "
                             f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}.")
    if query.dtype not in _DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        raise ValueError(f"gqa_attention: query, key and value are {query.dtype}, {key.dtype}, {value.dtype}; "
                         "pass all three in one of float16, bfloat16, float32 (gqa_attention_reference takes others).")
    if key.shape != value.shape:
        raise ValueError(f"gqa_attention: key is {tuple(key.shape)} but value is {tuple(value.shape)}; "
                         "pass key and value of one shape (batch, kv_heads, seq_k, head_dim).")
    batch, n_heads, seq_q, head_dim = query.shape
    if key.shape[0] != batch or key.shape[3] != head_dim:
        raise ValueError(f"gqa_attention: query is {tuple(query.shape)} but key is {tuple(key.shape)}; their batch "
                         "(dim 0) and head_dim (dim 3) must match.")
    n_kv_heads = key.shape[1]
    if n_kv_heads == 0 or n_heads % n_kv_heads != 0:
        raise ValueError(f"gqa_attention: query has {n_heads} heads, key {n_kv_heads}; the query heads must be a "
                         "multiple of the key/value heads (transformers' num_key_value_groups).")
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"gqa_attention: head_dim {head_dim} > {MAX_HEAD_DIM}, more than the kernel keeps in "
                         "registers; use gqa_attention_reference.")
    if attn_mask is None:
        return
    if not isinstance(attn_mask, Tensor) or not (attn_mask.dtype == torch.bool or attn_mask.is_floating_point()):
        raise ValueError(f"gqa_attention: attn_mask must be a bool (True = attend) or floating (added to the "
                         f"scores) tensor, got {getattr(attn_mask, 'dtype', type(attn_mask).__name__)}.")
    if attn_mask.requires_grad:
        raise ValueError("gqa_attention: attn_mask requires grad, but the kernel gives the mask no gradient; "
                         "pass attn_mask.detach() or use gqa_attention_reference.")
    target = (batch, n_heads, seq_q, key.shape[2])
    sizes = (1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)
    if attn_mask.dim() > 4 or any(s != t and s != 1 for s, t in zip(sizes, target)):
        raise ValueError(f"gqa_attention: attn_mask has shape {tuple(attn_mask.shape)}, which does not broadcast "
                         f"to (batch, heads, seq_q, seq_k) = {target}; pass e.g. a (batch, 1, seq_q, seq_k) mask.")


def gqa_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                  scale: float | None = None) -> Tensor:
    """Scaled dot-product attention with grouped-query K/V, reading each KV head once.

    Equals ``F.scaled_dot_product_attention(query, repeat_kv(key, G), repeat_kv(value, G),
    attn_mask=attn_mask, scale=scale)`` with transformers' ``repeat_kv`` (query head ``h`` reads KV
    head ``h // G``, ``G = Hq // Hkv``), computed in fp32 with one rounding to the input dtype.
    A query row whose mask excludes every key (all False, or all -inf) returns zeros, not NaN, and
    passes no gradient. Large finite additive values (``torch.finfo(dtype).min``) are ordinary mask
    values: a row of only those attends uniformly, as in SDPA. The backward keeps each row's max
    and log-sum apart (not one log-sum-exp), so its gradients there are the softmax's (SDPA's CPU
    backward, which recomputes from the log-sum-exp, is off by a factor of S on such rows).

    Args:
        query (`torch.Tensor`): ``(batch, Hq, L, D)``, float16/bfloat16/float32, any strides (a
            transposed projection is read in place).
        key (`torch.Tensor`): ``(batch, Hkv, S, D)`` with ``Hq % Hkv == 0``, ``D <= 256``; query's dtype.
        value (`torch.Tensor`): key's shape and dtype.
        attn_mask (`torch.Tensor`, *optional*): bool (True = attend) or floating (added to the scaled
            scores), broadcastable to ``(batch, Hq, L, S)`` (transformers passes ``(batch, 1, L, S)``);
            read through its broadcast strides, never expanded. Gets no gradient, so it must not
            require one.
        scale (`float`, *optional*): factor on ``query @ key^T``; defaults to ``1 / sqrt(D)``.

    Returns:
        `torch.Tensor`: contiguous ``(batch, Hq, L, D)`` in query's dtype.

    Raises:
        ValueError: shapes, dtypes or devices that do not fit, or a mask that requires grad.

    Example:
        ```python
        q = torch.randn(32, 14, 1, 64, device="cuda", dtype=torch.bfloat16)   # decode step
        k = torch.randn(32, 2, 1024, 64, device="cuda", dtype=torch.bfloat16)  # static cache
        mask = torch.ones(32, 1, 1, 1024, device="cuda", dtype=torch.bool)
        out = gqa_attention(q, k, k, attn_mask=mask)  # (32, 14, 1, 64)
        ```
    """
    _check(query, key, value, attn_mask)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    return _gqa_attention_op(query, key, value, attn_mask, scale)[0]


def repeat_kv(hidden_states: Tensor, n_rep: int) -> Tensor:
    """transformers' ``repeat_kv``: ``(B, Hkv, S, D)`` -> ``(B, Hkv * n_rep, S, D)``; head ``h`` is KV head
    ``h // n_rep``."""
    batch, n_kv_heads, seq, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, n_kv_heads, n_rep, seq, head_dim)
    return hidden_states.reshape(batch, n_kv_heads * n_rep, seq, head_dim)


def gqa_attention_reference(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                            scale: float | None = None) -> Tensor:
    """Plain PyTorch ``gqa_attention``: SDPA over ``repeat_kv`` K and V (what transformers'
    ``sdpa_attention_forward`` computes), with fully masked query rows set to zeros (no gradient)."""
    group = query.shape[1] // key.shape[1]
    k, v = repeat_kv(key, group), repeat_kv(value, group)
    if attn_mask is None:
        return torch.nn.functional.scaled_dot_product_attention(query, k, v, scale=scale)
    # Fully masked rows attend to everything (a finite softmax, so no NaN reaches the backward)
    # and are zeroed afterwards.
    if attn_mask.dtype == torch.bool:
        excluded = ~attn_mask.any(-1, keepdim=True)
        safe = attn_mask | excluded
    else:
        excluded = (attn_mask == float("-inf")).all(-1, keepdim=True)
        safe = attn_mask.masked_fill(excluded, 0.0)
    out = torch.nn.functional.scaled_dot_product_attention(query, k, v, attn_mask=safe, scale=scale)
    return out.masked_fill(excluded, 0.0)
