"""Tile sweep of the tiled fused linear cross-entropy against Cut Cross-Entropy, Inductor and the
chunked strategy, in one process, at the reference LM-head shape (4096 tokens x 896 -> 151,936
vocab, bf16, every 7th label -100, forward + backward).

Times and extra memory come from the harness's own ``time_calls`` (CUDA events, cold L2, peak
allocated over one call minus what was allocated before). Writes JSON lines to ``--out``.

    python tools/flce_sweep.py --out flce_sweep.jsonl
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time

import torch

from twinkle_fx.bench.timing import GIB, time_calls
from twinkle_fx.measure.clock import DeviceClock
from twinkle_fx.core.outputs import output_file

import twinkle_triton as tt
from twinkle_triton import fused_linear_cross_entropy_tiled as tiled


# The first sweep (H100, before backward tiles were skipped by the forward's bound) measured every
# FORWARD entry below with the first BACKWARD one: 2.59-3.87 ms forward, best SPLITS_PER_SM=1.
FORWARD = [
    dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3, SPLITS_PER_SM=1),
    dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3, SPLITS_PER_SM=2),
    dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3, SPLITS_PER_SM=1),
]
BACKWARD = [
    dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, BLOCK_D=64, num_warps=4, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, BLOCK_D=64, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, BLOCK_D=128, num_warps=8, num_stages=3),
    dict(BLOCK_M=64, BLOCK_N=256, BLOCK_K=64, BLOCK_D=64, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, BLOCK_D=64, num_warps=8, num_stages=3),
    dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, BLOCK_D=64, num_warps=4, num_stages=3),
    dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, BLOCK_D=128, num_warps=4, num_stages=3),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=output_file)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="first configs only")
    args = parser.parse_args()
    device = torch.device("cuda")
    clock = DeviceClock(device)
    torch.manual_seed(0)
    n, h, v = 4096, 896, 151936
    x = torch.randn(n, h, device=device).bfloat16().requires_grad_()
    w = (torch.randn(v, h, device=device) * 0.02).bfloat16().requires_grad_()
    y = torch.randint(0, v, (n,), device=device)
    y[::7] = -100
    with torch.no_grad():
        ref_loss = tt.fused_linear_cross_entropy_reference(x.float(), w.float(), y)
    xr, wr = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ref_grads = torch.autograd.grad(tt.fused_linear_cross_entropy_reference(xr, wr, y), (xr, wr))
    del xr, wr
    out = open(args.out, "w")

    def rel(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm())

    def record(name, fn, **extra):
        try:
            loss = fn()
            grads = torch.autograd.grad(loss, (x, w))
            err = max(rel(loss, ref_loss), *(rel(g, r) for g, r in zip(grads, ref_grads)))
            del loss, grads

            def fwd():
                with torch.no_grad():
                    fn()

            fwd_ms, fwd_extra = time_calls(fwd, clock, warmup=3, reps=args.reps)

            def both():
                torch.autograd.grad(fn(), (x, w))

            ms, extra_bytes = time_calls(both, clock, warmup=3, reps=args.reps)
            row = dict(name=name, fwd_ms=fwd_ms, ms=ms, extra_gib=extra_bytes / GIB, fwd_extra_gib=fwd_extra / GIB,
                       max_rel_err=err, **extra)
        except Exception as e:  # noqa: BLE001 - a failing config is a row of the sweep
            row = dict(name=name, error=f"{type(e).__name__}: {e}"[:500], **extra)
        print(json.dumps(row), flush=True)
        out.write(json.dumps(row) + "\n")
        out.flush()
        torch.cuda.empty_cache()

    t0 = time.time()
    record("chunked (1024 rows)", lambda: tt.fused_linear_cross_entropy(x, w, y, strategy="chunked"))
    compiled = torch.compile(tt.fused_linear_cross_entropy_reference, dynamic=False)
    record("inductor", lambda: compiled(x, w, y))
    if importlib.util.find_spec("cut_cross_entropy"):
        from cut_cross_entropy import linear_cross_entropy

        record("cce", lambda: linear_cross_entropy(x, w, y))
        record("cce exact", lambda: linear_cross_entropy(x, w, y, impl="cce_exact"))
    best = None
    for cfg in FORWARD[: 2 if args.quick else None]:
        tiled.TILED_FORWARD = cfg
        record("tiled fwd sweep", lambda: tt.fused_linear_cross_entropy(x, w, y), forward=cfg,
               backward=tiled.TILED_BACKWARD)
    rows = [json.loads(line) for line in open(args.out)]
    fwd_rows = [r for r in rows if r["name"] == "tiled fwd sweep" and "fwd_ms" in r]
    if fwd_rows:
        tiled.TILED_FORWARD = min(fwd_rows, key=lambda r: r["fwd_ms"])["forward"]
    for cfg in BACKWARD[: 2 if args.quick else None]:
        tiled.TILED_BACKWARD = cfg
        record("tiled bwd sweep", lambda: tt.fused_linear_cross_entropy(x, w, y), forward=tiled.TILED_FORWARD,
               backward=cfg)
    rows = [json.loads(line) for line in open(args.out)]
    bwd_rows = [r for r in rows if r["name"] == "tiled bwd sweep" and "ms" in r]
    if bwd_rows:
        best = min(bwd_rows, key=lambda r: r["ms"])
        tiled.TILED_BACKWARD = best["backward"]
    record("tiled best, exact (filter_eps=None)", lambda: tt.fused_linear_cross_entropy(x, w, y, filter_eps=None),
           forward=tiled.TILED_FORWARD, backward=tiled.TILED_BACKWARD)
    record("tiled best, fp32_accumulation", lambda: tt.fused_linear_cross_entropy(x, w, y, fp32_accumulation=True),
           forward=tiled.TILED_FORWARD, backward=tiled.TILED_BACKWARD)
    print(f"sweep took {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
