"""Time ``twinkle_triton.gqa_attention`` (forward, no grad) against what transformers runs, on CUDA.

Rows per shape (bf16, each timed in a CUDA graph with ``triton.testing.do_bench_cudagraph``, as the
compiled decode step replays it, so host launch cost is excluded):

* ``gqa``: the op with the mask;
* ``sdpa+repeat_kv``: ``F.scaled_dot_product_attention(q, repeat_kv(k), repeat_kv(v), attn_mask=mask)``,
  transformers' ``sdpa_attention_forward`` whenever a mask is given (always, with a static cache);
* ``gqa nomask`` / ``sdpa enable_gqa nomask``: both without a mask (SDPA's GQA path takes none here);
* ``gqa splits=N``: the forward with N key splits forced, to check the split heuristic
  (``PROGRAMS_PER_SM``, ``MIN_SPLIT_KEYS`` in gqa_attention.py); ``heuristic`` names its choice;
* ``gqa block_s=S splits=N`` (batch 1): likewise with key blocks of S.

GB/s counts the bytes the op must move at least (q, K, V, mask, out, each once), the same for every
row, so it compares time; a bandwidth near the device's (~3.3 TB/s on an H100 SXM) means the cache was
read once. Shapes: Qwen2-0.5B decode (B=32, Hq=14, Hkv=2, D=64, L=1, S=1024) with a full (B,1,1,S)
bool mask and with a half-filled cache (mask True on the first 512 keys: the kernel skips K/V blocks
no row attends to), B=1, L=1, S=8192, and generate()'s batch-1 step with the heads of Qwen2-0.5B and Llama-3.2-1B
(S=640, 576 keys filled).

Correctness: max |error| of the op against ``gqa_attention_reference`` on the same bf16 inputs and
against an fp32 reference, and of the backward (dq, dk, dv) at a training-like shape.

    python tools/gqa_attention_bench.py [--out gqa-bench.json]
"""

import argparse
import functools
import json
import sys

import torch
import torch.nn.functional as F
import triton
import triton.testing

import twinkle_triton as tt
from twinkle_fx.core.outputs import output_file

_gqa_module = sys.modules["twinkle_triton.gqa_attention"]

SHAPES = [
    # name, B, Hq, Hkv, L, S, D, keys the mask keeps (None: all)
    ("qwen2-0.5b decode b32 s1024", 32, 14, 2, 1, 1024, 64, None),
    ("qwen2-0.5b decode b32 s1024, 512 keys filled", 32, 14, 2, 1, 1024, 64, 512),
    ("decode b1 s8192", 1, 14, 2, 1, 8192, 64, None),
    # generate()'s static cache at prompt 512 + 128 new tokens, half way: latency, not bandwidth, at batch 1
    ("qwen2-0.5b decode b1 s640, 576 keys filled", 1, 14, 2, 1, 640, 64, 576),
    ("llama-3.2-1b decode b1 s640, 576 keys filled", 1, 32, 8, 1, 640, 64, 576),
]
BATCH1_BLOCK_S = (16, 32)  # key blocks also tried at batch 1: more programs, shorter loops
SPLITS = (1, 2, 4, 8, 16, 32, 64)


def _time_ms(fn) -> float:
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=200)
    except Exception as error:  # a baseline that cannot be captured is timed eagerly, and says so
        print(f"    (not capturable: {type(error).__name__}: {error}; timed eagerly)")
        return triton.testing.do_bench(fn, rep=200)


def _with_block_s(block_s: int, fn):
    """``fn()`` with the forward's key block forced to ``block_s`` (``_blocks`` patched for the call)."""
    blocks = _gqa_module._blocks
    def forced(rows, head_dim):
        block_m, _, block_d, num_warps = blocks(rows, head_dim)
        return block_m, block_s, block_d, num_warps

    _gqa_module._blocks = forced
    try:
        return fn()
    finally:
        _gqa_module._blocks = blocks


def bench_shape(name, batch, n_heads, n_kv_heads, seq_q, seq_k, head_dim, filled) -> dict:
    dtype, device = torch.bfloat16, "cuda"
    torch.manual_seed(0)
    q = torch.randn(batch, seq_q, n_heads, head_dim, device=device, dtype=dtype).transpose(1, 2)  # as projected
    k = torch.randn(batch, n_kv_heads, seq_k, head_dim, device=device, dtype=dtype)
    v = torch.randn(batch, n_kv_heads, seq_k, head_dim, device=device, dtype=dtype)
    keep = seq_k if filled is None else filled
    mask = (torch.arange(seq_k, device=device) < keep).expand(batch, 1, seq_q, seq_k).contiguous()
    scale = head_dim ** -0.5
    group = n_heads // n_kv_heads
    nbytes = (q.numel() + k.numel() + v.numel() + q.numel()) * q.element_size() + mask.numel()

    with torch.no_grad():
        got = tt.gqa_attention(q, k, v, attn_mask=mask, scale=scale)
        ref = tt.gqa_attention_reference(q, k, v, attn_mask=mask, scale=scale)
        ref32 = tt.gqa_attention_reference(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale)
        rows = {
            "gqa": lambda: tt.gqa_attention(q, k, v, attn_mask=mask, scale=scale),
            "sdpa+repeat_kv": lambda: F.scaled_dot_product_attention(
                q, _gqa_module.repeat_kv(k, group), _gqa_module.repeat_kv(v, group),
                attn_mask=mask, scale=scale),
            "gqa nomask": lambda: tt.gqa_attention(q, k, v, scale=scale),
            "sdpa enable_gqa nomask": lambda: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True),
        }
        for splits in SPLITS:
            rows[f"gqa splits={splits}"] = (
                lambda splits=splits: _gqa_module._gqa_forward(q, k, v, mask, scale, splits)[0])
        for block_s in BATCH1_BLOCK_S if batch == 1 else ():
            for splits in SPLITS:
                rows[f"gqa block_s={block_s} splits={splits}"] = functools.partial(
                    _with_block_s, block_s, lambda splits=splits: _gqa_module._gqa_forward(q, k, v, mask, scale, splits)[0])
        block_m, block_s, _, _ = _gqa_module._blocks(group * seq_q, head_dim)
        heuristic = _gqa_module._num_splits(
            batch * n_kv_heads * triton.cdiv(group * seq_q, block_m), seq_k, block_s, q.device)
        result = {
            "shape": name, "bytes": nbytes, "heuristic_splits": heuristic[0], "split_keys": heuristic[1],
            "max_err_vs_bf16_reference": (got.float() - ref.float()).abs().max().item(),
            "max_err_vs_fp32_reference": (got.float() - ref32).abs().max().item(),
            "bf16_reference_err_vs_fp32": (ref.float() - ref32).abs().max().item(),
            "rows": {},
        }
        print(f"\n{name}: q {tuple(q.shape)} kv {tuple(k.shape)} mask keeps {keep}/{seq_k}; heuristic "
              f"{heuristic[0]} splits of {heuristic[1]} keys; max err vs bf16 ref "
              f"{result['max_err_vs_bf16_reference']:.3g}, vs fp32 ref {result['max_err_vs_fp32_reference']:.3g} "
              f"(bf16 SDPA vs fp32: {result['bf16_reference_err_vs_fp32']:.3g})")
        for row, fn in rows.items():
            ms = _time_ms(fn)
            result["rows"][row] = {"ms": ms, "GB/s": nbytes / ms / 1e6}
            print(f"  {row:28s} {ms * 1e3:9.2f} us  {nbytes / ms / 1e6:8.1f} GB/s")
    return result


def check_backward() -> dict:
    """dq, dk, dv against the reference's (bf16, training-like shape with a padding mask)."""
    torch.manual_seed(0)
    dtype, device = torch.bfloat16, "cuda"
    q = torch.randn(2, 17, 14, 64, device=device, dtype=dtype).transpose(1, 2).requires_grad_()
    k = torch.randn(2, 2, 300, 64, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(2, 2, 300, 64, device=device, dtype=dtype, requires_grad=True)
    mask = torch.rand(2, 1, 17, 300, device=device) > 0.2
    out = tt.gqa_attention(q, k, v, attn_mask=mask)
    ref = tt.gqa_attention_reference(q, k, v, attn_mask=mask)
    grad = torch.randn_like(ref)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    errors = {n: (g.float() - w.float()).abs().max().item() for n, g, w in zip(("dq", "dk", "dv"), got, want)}
    errors["out"] = (out.float() - ref.float()).abs().max().item()
    print("\nbackward (B=2, Hq=14, Hkv=2, L=17, S=300, bf16) max |ours - reference|:",
          ", ".join(f"{n} {e:.3g}" for n, e in errors.items()))
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=output_file, help="write the results as JSON here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gqa_attention_bench: needs a CUDA device (it times kernels).")
    print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "shapes": [bench_shape(*shape) for shape in SHAPES], "backward_max_err": check_backward()}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
