"""One-off probe: the RMSNorm backward at short rows (131072 x 128, Qwen3's q/k norms), ours against a variant that
keeps the weight gradient as a 2D register tile and Inductor's code; device time by the profiler, L2 flushed."""
import importlib, statistics, itertools
import torch, triton, triton.language as tl
from torch.profiler import ProfilerActivity, profile
import twinkle_triton as tt
from twinkle_triton._float_args import fp32
from twinkle_triton._partial_sums import sum_partials
from twinkle_triton._launch import persistent_programs, cdiv
rms = importlib.import_module("twinkle_triton.rms_norm")
from twinkle_fx.measure.clock import DeviceClock


@triton.jit
def _bwd_2d(grad_ptr, x_ptr, weight_ptr, grad_x_ptr, part_ptr, n_rows, n_cols, eps,
            ROWS: tl.constexpr, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    eps = fp32(eps)
    pid = tl.program_id(0).to(tl.int64)
    n_programs = tl.num_programs(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)[None, :]
    col_mask = cols < n_cols
    w = tl.load(weight_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    for start in tl.range(pid * ROWS, n_rows, n_programs * ROWS, num_stages=STAGES):
        row = start + tl.arange(0, ROWS)[:, None]
        mask = (row < n_rows) & col_mask
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
        g = tl.load(grad_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        h = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=1, keep_dims=True) / n_cols + eps)
        x_hat = h * rstd
        acc += g * x_hat.to(x_ptr.dtype.element_ty).to(tl.float32)
        gn = g * w
        gx = rstd * (gn - x_hat * (tl.sum(gn * x_hat, axis=1, keep_dims=True) / n_cols))
        tl.store(grad_x_ptr + row * n_cols + cols, gx.to(grad_x_ptr.dtype.element_ty), mask=mask)
    tl.store(part_ptr + pid * n_cols + tl.arange(0, BLOCK), tl.sum(acc, axis=0), mask=tl.arange(0, BLOCK) < n_cols)


def variant(grad, x, weight, rows_per, warps, per_sm, stages):
    n_rows, n_cols = x.shape
    programs = persistent_programs(cdiv(n_rows, rows_per), x.device, per_sm=per_sm)
    gx = torch.empty_like(x)
    part = torch.empty((programs, n_cols), dtype=torch.float32, device=x.device)
    _bwd_2d[(programs,)](grad, x, weight, gx, part, n_rows, n_cols, 1e-6, ROWS=rows_per, BLOCK=n_cols,
                         STAGES=stages, num_warps=warps)
    return gx, sum_partials(part, weight.dtype)


def device_us(fn, clock, reps=20):
    flush = clock.cache_flusher()
    for _ in range(3):
        fn()
    clock.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush()
            torch.cuda.nvtx.range_push("call")
            fn()
            torch.cuda.nvtx.range_pop()
        clock.synchronize()
    names = {}
    for e in prof.events():
        if e.device_time > 0 and "flush" not in e.name.lower() and "zero" not in e.name.lower() and "fill" not in e.name.lower():
            names.setdefault(e.name, []).append(e.device_time)
    return sum(sum(v) for v in names.values()) / reps, {k[:60]: round(statistics.median(v), 1) for k, v in names.items()}


def main():
    clock = DeviceClock(torch.device("cuda"))
    for n_rows, n_cols in ((131072, 128), (16384, 128)):
        torch.manual_seed(0)
        x = torch.randn(n_rows, n_cols, device="cuda", dtype=torch.bfloat16)
        g = torch.randn_like(x)
        w = torch.randn(n_cols, device="cuda", dtype=torch.bfloat16)
        ref_gx, ref_gw = rms._launch_bwd(g, None, x, w, 1e-6, "rms_norm")
        us, parts = device_us(lambda: rms._launch_bwd(g, None, x, w, 1e-6, "rms_norm"), clock)
        print(f"{n_rows}x{n_cols} ours (tiling {rms._bwd_tiling(n_cols, False, 'rms_norm', 2, x.device)}): {us:.1f} us {parts}", flush=True)
        # Inductor: the reference's backward, compiled
        xr = x.clone().requires_grad_(); wr = w.clone().requires_grad_()
        f = torch.compile(lambda a, b: tt.rms_norm_reference(a, b, 1e-6))
        f(xr, wr)
        def ind():
            out = f(xr, wr)
            torch.autograd.grad(out, (xr, wr), g)
        fwd_us, _ = device_us(lambda: f(xr, wr), clock)
        tot_us, parts = device_us(ind, clock)
        print(f"  inductor fwd+bwd {tot_us:.1f} us, fwd {fwd_us:.1f} -> bwd ~{tot_us - fwd_us:.1f} {parts}", flush=True)
        best = []
        for rows_per, warps, per_sm, stages in itertools.product((32,), (8,), (2,), (3,)):
            if rows_per * n_cols // (32 * warps) < 4:
                continue
            try:
                gx, gw = variant(g, x, w, rows_per, warps, per_sm, stages)
                torch.testing.assert_close(gx, ref_gx, rtol=2e-2, atol=2e-2)
                torch.testing.assert_close(gw.float(), ref_gw.float(), rtol=2e-2, atol=1e-1)
                us, parts = device_us(lambda: variant(g, x, w, rows_per, warps, per_sm, stages), clock, reps=10)
            except Exception as e:
                print(f"  variant {rows_per},{warps},{per_sm},{stages} failed {type(e).__name__}: {str(e)[:100]}")
                continue
            best.append((us, (rows_per, warps, per_sm, stages), parts))
        best.sort(key=lambda b: b[0])
        for b in best[:6]:
            print(f"  2d-acc rows {b[1][0]} warps {b[1][1]} per_sm {b[1][2]} stages {b[1][3]}: {b[0]:.1f} us {b[2]}", flush=True)

    # the in-place streaming ceiling for the fused loss's row kernel: a chunk of logits read and written once
    for rows_, vocab in ((1366, 151936), (2048, 128256)):
        buf = torch.randn(rows_, vocab, device="cuda", dtype=torch.bfloat16)
        us, parts = device_us(lambda: buf.mul_(1.0), clock)
        print(f"in-place mul_ {rows_}x{vocab}: {us:.1f} us, {2 * buf.numel() * 2 / us / 1e3:.0f} GB/s {parts}")
        us, parts = device_us(lambda: torch.exp(buf, out=buf) if False else buf.exp_(), clock)
        print(f"in-place exp_ {rows_}x{vocab}: {us:.1f} us, {2 * buf.numel() * 2 / us / 1e3:.0f} GB/s")


main()
