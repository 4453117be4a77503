"""One-off probe: where the fused loss's one-pass row kernel spends its time (timing only; variants not exact)."""
import statistics
import torch, triton, triton.language as tl
from torch.profiler import ProfilerActivity, profile
import importlib
flce = importlib.import_module("twinkle_triton.fused_linear_cross_entropy")
from twinkle_fx.measure.clock import DeviceClock


@triton.jit
def _variant(logits_ptr, shifts_ptr, d_ptr, stride, n_rows, n_cols, SEGMENTS: tl.constexpr, STORE_SHIFTS: tl.constexpr,
             BLOCK_MAX: tl.constexpr, BLOCK: tl.constexpr):
    n_blocks = tl.cdiv(n_cols, BLOCK)
    seg_blocks = tl.cdiv(n_blocks, SEGMENTS)
    n_items = n_rows * SEGMENTS
    for item in range(tl.program_id(0), n_items, tl.num_programs(0)):
        row = (item // SEGMENTS).to(tl.int64)
        seg = item % SEGMENTS
        row_ptr = logits_ptr + row * stride
        first = seg * seg_blocks
        x0 = tl.load(row_ptr + first * BLOCK + tl.arange(0, BLOCK), mask=first * BLOCK + tl.arange(0, BLOCK) < n_cols,
                     other=float("-inf")).to(tl.float32)
        s = tl.max(x0, axis=0)
        d = tl.zeros([BLOCK], tl.float32)
        for block in range(first, tl.minimum(first + seg_blocks, n_blocks)):
            cols = block * BLOCK + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(row_ptr + cols, mask=mask, other=float("-inf")).to(tl.float32)
            if BLOCK_MAX:
                bm = tl.max(x, axis=0)
                s = tl.where(bm > s + 32.0, bm, s)
            e = tl.exp(x - s)
            d += e
            tl.store(row_ptr + cols, e.to(logits_ptr.dtype.element_ty), mask=mask)
            if STORE_SHIFTS:
                tl.store(shifts_ptr + row * n_blocks + block, s)
        tl.store(d_ptr + item, tl.sum(d, axis=0))


def device_us(fn, clock, reps=20):
    flush = clock.cache_flusher()
    for _ in range(3):
        fn()
    clock.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush()
            fn()
        clock.synchronize()
    times = [e.device_time for e in prof.events() if e.device_time > 0 and ("_variant" in e.name or "one_pass" in e.name)]
    return statistics.median(times)


def main():
    clock = DeviceClock(torch.device("cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for rows, vocab in ((1366, 151936), (2048, 128256)):
        buf = torch.randn(rows, vocab, device="cuda").to(torch.bfloat16)
        target = torch.randint(0, vocab, (rows,), device="cuda")
        loss = torch.empty(rows, device="cuda"); scale = torch.ones((), device="cuda")
        row_scale = torch.empty(rows, device="cuda")
        shifts = torch.empty(rows * triton.cdiv(vocab, 1024), device="cuda")
        gb = 2 * buf.numel() * 2 / 1e3
        for name, k in (("default", flce.ROW_KERNEL["one_pass"]),):
            grid = (flce._row_programs(rows, buf.device, k),)
            us = device_us(lambda: flce._fused_linear_cross_entropy_one_pass_kernel[grid](
                buf, target, loss, scale, row_scale, shifts, buf.stride(0), rows, vocab, -100, SPREAD=32.0,
                BLOCK=k["block"], COMPUTE_DTYPE=tl.float32, STAGES=1, num_warps=k["warps"]), clock)
            print(f"{rows}x{vocab} kernel {name}: {us:.1f} us {gb / us:.0f} GB/s", flush=True)
        for seg in (1, 2, 4, 8):
            for store, bmax in ((1, 1), (0, 1), (1, 0), (0, 0)):
                for block, warps, per_sm in ((4096, 8, 4), (2048, 4, 8)):
                    d = torch.empty(rows * seg, device="cuda")
                    shifts2 = torch.empty(rows * triton.cdiv(vocab, block), device="cuda")
                    grid = (min(rows * seg, per_sm * sms),)
                    us = device_us(lambda: _variant[grid](buf, shifts2, d, buf.stride(0), rows, vocab, SEGMENTS=seg,
                                                          STORE_SHIFTS=store, BLOCK_MAX=bmax, BLOCK=block,
                                                          num_warps=warps), clock, reps=10)
                    print(f"  seg {seg} store_shifts {store} block_max {bmax} block {block} warps {warps} per_sm "
                          f"{per_sm}: {us:.1f} us {gb / us:.0f} GB/s", flush=True)


main()
