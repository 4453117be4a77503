"""The exact strategies of the fused linear cross-entropy against each other and the anchors, in one
process, at the reference LM-head shape (4096 tokens x 896 -> 151,936 vocab, bf16, every 7th label
-100, forward + backward): chunked (token chunks, the old default), vocab_chunked over a sweep of
chunk bytes and both forwards, tiled with filter_eps="auto" (not exact), Cut Cross-Entropy,
Inductor. Each row carries its largest relative error against an fp32 reference (loss, grad_x,
grad_W): the weights are at init scale (0.02), so the softmax is flat and filtering shows.

Times and extra memory come from the harness's ``time_calls`` (CUDA events, cold L2, peak allocated
over one call minus what was allocated before: the gradients grad_x, grad_W are included).

    python tools/flce_vocab_sweep.py --out flce_vocab_sweep.jsonl
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
from twinkle_triton import fused_linear_cross_entropy_vocab_chunked as vocab


# 1024 to 16384 columns at 4096 tokens in bf16 (6 bytes a column per token: fp32 logits, bf16 gradient)
CHUNK_MIB = (24, 48, 96, 192, 384)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=output_file)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--quick", action="store_true",
                        help="only the defaults: chunked, vocab_chunked, exact tiling, and label smoothing's route")
    args = parser.parse_args()
    device = torch.device("cuda")
    clock = DeviceClock(device)
    torch.manual_seed(0)
    n, h, v = 4096, 896, 151936
    x = torch.randn(n, h, device=device).bfloat16().requires_grad_()
    w = (torch.randn(v, h, device=device) * 0.02).bfloat16().requires_grad_()
    y = torch.randint(0, v, (n,), device=device)
    y[::7] = -100
    xr, wr = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ref_loss = tt.fused_linear_cross_entropy_reference(xr, wr, y)
    ref_grads = torch.autograd.grad(ref_loss, (xr, wr))
    ref_loss = ref_loss.detach()
    del xr, wr
    out = open(args.out, "w")

    def rel(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm())

    def record(name, fn, compare=True, **extra):
        """compare=False: a loss other than the plain one (label smoothing): no error against the reference."""
        try:
            loss = fn()
            grads = torch.autograd.grad(loss, (x, w))
            errors = dict(loss=rel(loss, ref_loss), grad_x=rel(grads[0], ref_grads[0]),
                          grad_w=rel(grads[1], ref_grads[1])) if compare else {}
            del loss, grads

            def fwd():
                with torch.no_grad():
                    fn()

            fwd_ms, _ = time_calls(fwd, clock, warmup=2, reps=args.reps)

            def both():
                torch.autograd.grad(fn(), (x, w))

            ms, extra_bytes = time_calls(both, clock, warmup=3, reps=args.reps)
            row = dict(name=name, fwd_ms=round(fwd_ms, 3), ms=round(ms, 3), extra_gib=round(extra_bytes / GIB, 4),
                       rel_err={k: float(f"{e:.3g}") for k, e in errors.items()}, **extra)
        except Exception as e:  # noqa: BLE001 - a failing config is a row of the sweep
            row = dict(name=name, error=f"{type(e).__name__}: {e}"[:500], **extra)
        print(json.dumps(row), flush=True)
        out.write(json.dumps(row) + "\n")
        out.flush()
        torch.cuda.empty_cache()

    t0 = time.time()
    print(json.dumps(dict(torch=torch.__version__, device=torch.cuda.get_device_name())), flush=True)
    if args.quick:
        record("chunked (default)", lambda: tt.fused_linear_cross_entropy(x, w, y))
        record("vocab_chunked (its defaults)", lambda: tt.fused_linear_cross_entropy(x, w, y, strategy="vocab_chunked"),
               forward=vocab.VOCAB_CHUNKED_FORWARD, chunk_mib=vocab.VOCAB_CHUNK_BYTES >> 20)
        record("tiled exact (filter_eps=None)", lambda: tt.fused_linear_cross_entropy(x, w, y, strategy="tiled"))
        # label smoothing: the default route (vocab_chunked) against the old one (exact tiling)
        record("label_smoothing=0.1, default route", lambda: tt.fused_linear_cross_entropy(x, w, y, label_smoothing=0.1),
               compare=False)
        record("label_smoothing=0.1, tiled exact",
               lambda: tt.fused_linear_cross_entropy(x, w, y, label_smoothing=0.1, strategy="tiled"), compare=False)
        print(f"sweep took {time.time() - t0:.0f} s", flush=True)
        return
    record("chunked (token chunks, exact)", lambda: tt.fused_linear_cross_entropy(x, w, y, strategy="chunked"))
    record("tiled filter_eps=auto (not exact)", lambda: tt.fused_linear_cross_entropy(x, w, y, filter_eps="auto"))
    compiled = torch.compile(tt.fused_linear_cross_entropy_reference, dynamic=False)
    record("inductor", lambda: compiled(x, w, y))
    if importlib.util.find_spec("cut_cross_entropy"):
        from cut_cross_entropy import linear_cross_entropy

        record("cce (filtering, default)", lambda: linear_cross_entropy(x, w, y))
    for forward in ("cublas", "tiled"):
        vocab.VOCAB_CHUNKED_FORWARD = forward
        for mib in CHUNK_MIB:
            vocab.VOCAB_CHUNK_BYTES = mib << 20
            record("vocab_chunked", lambda: tt.fused_linear_cross_entropy(x, w, y, strategy="vocab_chunked"),
                   forward=forward, chunk_mib=mib, chunk_cols=vocab.default_vocab_chunk(n, v, x.dtype))
    print(f"sweep took {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
