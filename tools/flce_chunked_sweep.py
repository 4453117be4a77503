"""The chunked fused linear cross-entropy (the default strategy) at the LM heads of the training matrix: rows per
logits chunk and the row kernel's settings (``ROW_KERNEL``), forward + backward, every setting checked against
the default's loss and gradients.

Each setting is timed in interleaved rounds (the clock moves at a GPU's power cap; a setting timed in one block
would take the clock of its block) with the harness's ``time_calls`` (CUDA events, cold L2); the row kernel alone
is timed too (one launch over a chunk's logits, the gradient pass included). Prints a table and writes JSON.

    python tools/flce_chunked_sweep.py --out flce-chunked.json
    python tools/flce_chunked_sweep.py --shapes llama1b --chunk-mib 512,1024 --row-kernels default,row-16w-8k
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics

import torch
import triton.language as tl
import twinkle_triton as tt

# the module (the package's attribute of that name is the function)
flce = importlib.import_module("twinkle_triton.fused_linear_cross_entropy")

from twinkle_fx.bench.timing import GIB, time_calls
from twinkle_fx.core.outputs import output_file
from twinkle_fx.measure.clock import DeviceClock
from twinkle_fx.measure.environment import describe_environment

SHAPES = {  # name: (hidden, vocab) of the LM head
    "qwen2": (896, 151936),
    "llama1b": (2048, 128256),
    "llama3b": (3072, 128256),
}
# name: ROW_KERNEL; "row": a program a row, "2sm": two programs an SM, "rev": the gradient pass reversed
ROW_KERNELS = {
    "default": dict(flce.ROW_KERNEL),
    "row-16w-8k": {"block": 8192, "warps": 16, "reverse": False, "programs_per_sm": 0},
    "row-16w-8k-rev": {"block": 8192, "warps": 16, "reverse": True, "programs_per_sm": 0},
    "2sm-16w-8k-rev": {"block": 8192, "warps": 16, "reverse": True, "programs_per_sm": 2},
    "1sm-32w-16k-rev": {"block": 16384, "warps": 32, "reverse": True, "programs_per_sm": 1},
    "2sm-32w-16k": {"block": 16384, "warps": 32, "reverse": False, "programs_per_sm": 2},
}


def sweep_shape(shape: str, args, clock: DeviceClock) -> list[dict]:
    """Every setting at one head shape, timed in interleaved rounds."""
    device, (hidden, vocab) = clock.device, SHAPES[shape]
    torch.manual_seed(0)
    x = torch.randn(args.rows, hidden, device=device).bfloat16().requires_grad_()
    w = (torch.randn(vocab, hidden, device=device) * 0.02).bfloat16().requires_grad_()
    y = torch.randint(0, vocab, (args.rows,), device=device)
    y[::7] = -100
    loss = tt.fused_linear_cross_entropy(x, w, y)
    reference = [t.float() for t in (loss, *torch.autograd.grad(loss, (x, w)))]
    settings = []
    for mib in (int(m) for m in args.chunk_mib.split(",")):
        flce.LOGITS_CHUNK_BYTES = (mib << 20) if mib else args.rows * vocab * 2
        rows = flce.default_chunk_size(vocab, torch.bfloat16, args.rows)
        settings += [{"shape": shape, "chunk_mib": mib, "chunk_rows": rows, "row_kernel": name, "ms": [],
                      "kernel_ms": []} for name in args.row_kernels.split(",")]
    logits = torch.randn(max(s["chunk_rows"] for s in settings), vocab, device=device).bfloat16()
    scale = torch.ones((), device=device)
    for _ in range(args.rounds):
        for setting in settings:
            flce.ROW_KERNEL = kernel_setting = ROW_KERNELS[setting["row_kernel"]]
            chunk = setting["chunk_rows"]

            def both(chunk=chunk):
                loss = flce._fused_linear_cross_entropy_op(x, w, y, None, -100, "mean", chunk, True, True, False)[0]
                return loss, *torch.autograd.grad(loss, (x, w))

            if "max_rel_err" not in setting:
                got = both()
                setting["max_rel_err"] = max(float((g.float() - r).norm() / r.norm()) for g, r in zip(got, reference))
                del got
            ms, extra = time_calls(both, clock, warmup=1, reps=args.reps)
            setting["ms"].append(ms)
            setting["extra_gib"] = extra / GIB
            chunk_logits, row_loss = logits[:chunk], torch.empty(chunk, device=device)

            def kernel(chunk=chunk, chunk_logits=chunk_logits, row_loss=row_loss, k=kernel_setting):
                flce._fused_linear_cross_entropy_fwd_kernel[(flce._row_programs(chunk, device),)](
                    chunk_logits, y[:chunk], row_loss, scale, chunk_logits.stride(0), chunk, vocab, -100,
                    COMPUTE_GRAD=True, BLOCK=k["block"], COMPUTE_DTYPE=tl.float32, REVERSE=k["reverse"],
                    num_warps=k["warps"],
                )

            setting["kernel_ms"].append(time_calls(kernel, clock, warmup=1, reps=args.reps)[0])
    for setting in settings:
        setting["ms"], setting["kernel_ms"] = statistics.median(setting["ms"]), statistics.median(setting["kernel_ms"])
        setting["kernel_gb_s"] = 3 * setting["chunk_rows"] * vocab * 2 / setting["kernel_ms"] / 1e6
        print(json.dumps(setting), flush=True)
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=output_file)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--rows", type=int, default=4096, help="tokens a step")
    parser.add_argument("--chunk-mib", default="512,1024,0", help="logits budgets in MiB; 0: every row in one chunk")
    parser.add_argument("--row-kernels", default=",".join(ROW_KERNELS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    clock = DeviceClock(torch.device("cuda"))
    default_kernel, default_budget = dict(flce.ROW_KERNEL), flce.LOGITS_CHUNK_BYTES
    results = []
    for shape in args.shapes.split(","):
        results += sweep_shape(shape, args, clock)
        torch.cuda.empty_cache()
    flce.ROW_KERNEL, flce.LOGITS_CHUNK_BYTES = default_kernel, default_budget
    print("\n| head | logits budget | chunk rows | row kernel | fwd+bwd ms | row kernel ms (3 passes, GB/s) "
          "| extra GiB | max rel. err. |\n|---|---|---|---|---|---|---|---|")
    for s in results:
        budget = f"{s['chunk_mib']} MiB" if s["chunk_mib"] else "all rows"
        print(f"| {s['shape']} | {budget} | {s['chunk_rows']} | {s['row_kernel']} | {s['ms']:.3f} | "
              f"{s['kernel_ms']:.3f} ({s['kernel_gb_s']:.0f}) | {s['extra_gib']:.3f} | {s['max_rel_err']:.1e} |")
    with open(args.out, "w") as f:
        json.dump({"environment": describe_environment(clock.device), "rows": args.rows, "dtype": "bf16",
                   "row_kernels": ROW_KERNELS, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
