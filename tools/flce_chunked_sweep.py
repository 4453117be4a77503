"""The chunked fused linear cross-entropy (the default strategy) at the LM heads of the training matrix: rows per
logits chunk and the row kernel's settings (``ROW_KERNEL``), forward + backward, every setting checked against
an fp32 computation (the largest relative error of the loss, grad_x and grad_W; PyTorch's in bf16 printed beside).

Each setting is timed in interleaved rounds (the clock moves at a GPU's power cap; a setting timed in one block
would take the clock of its block) with the harness's ``time_calls`` (CUDA events, cold L2); the row kernel alone
is timed too (one launch over a chunk's logits, the gradient pass included). Prints a table and writes JSON.

    python tools/flce_chunked_sweep.py --out flce-chunked.json
    python tools/flce_chunked_sweep.py --shapes llama1b --chunk-mib 512,1024 --row-kernels default,2pass-2sm-32w-16k
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
    "qwen3_moe": (2048, 151936),
}
# name: ROW_KERNEL; "2pass": every gradient from the max/sum pass then the gradient pass (reversed), "1pass": the
# gradient up to a factor a row in one pass; programs an SM, warps, columns a loop step
_TWO_PASSES = {"block": 16384, "warps": 32, "programs_per_sm": 2, "reverse": True}
ROW_KERNELS = {
    "default": flce.ROW_KERNEL,
    "2pass-2sm-32w-16k": {"one_pass": None, "two_passes": _TWO_PASSES},
    "2pass-4sm-8w-4k": {"one_pass": None,
                        "two_passes": {"block": 4096, "warps": 8, "programs_per_sm": 4, "reverse": True}},
    "1pass-2sm-32w-16k": {"one_pass": {"block": 16384, "warps": 32, "programs_per_sm": 2}, "two_passes": _TWO_PASSES},
    "1pass-2sm-16w-8k": {"one_pass": {"block": 8192, "warps": 16, "programs_per_sm": 2}, "two_passes": _TWO_PASSES},
    "1pass-4sm-8w-8k": {"one_pass": {"block": 8192, "warps": 8, "programs_per_sm": 4}, "two_passes": _TWO_PASSES},
    "1pass-8sm-4w-2k": {"one_pass": {"block": 2048, "warps": 4, "programs_per_sm": 8}, "two_passes": _TWO_PASSES},
}


def _loss_and_grads(fn, x, w, y) -> list[torch.Tensor]:
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    loss = fn(x, w, y)
    return [loss, *torch.autograd.grad(loss, (x, w))]


def _rel_err(got: list[torch.Tensor], truth: list[torch.Tensor]) -> float:
    """The largest relative error (L2 norms) of the loss, grad_x and grad_W against the fp32 truth."""
    return max(float((g.float() - t).norm() / t.norm()) for g, t in zip(got, truth))


def sweep_shape(shape: str, args, clock: DeviceClock) -> tuple[dict, list[dict]]:
    """PyTorch's bf16 error at one head shape, and every setting there, timed in interleaved rounds."""
    device, (hidden, vocab) = clock.device, SHAPES[shape]
    torch.manual_seed(0)
    x = torch.randn(args.rows, hidden, device=device).bfloat16().requires_grad_()
    w = (torch.randn(vocab, hidden, device=device) * 0.02).bfloat16().requires_grad_()
    y = torch.randint(0, vocab, (args.rows,), device=device)
    y[::7] = -100
    truth = _loss_and_grads(tt.fused_linear_cross_entropy_reference, x.float(), w.float(), y)
    # what PyTorch computes in bf16 (the logits rounded to bf16, as Inductor's step does), against the same truth
    pytorch_bf16 = _rel_err(_loss_and_grads(tt.fused_linear_cross_entropy_reference, x, w, y), truth)
    baseline = {"shape": shape, "pytorch_bf16_rel_err": pytorch_bf16}
    print(json.dumps(baseline), flush=True)
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
                setting["max_rel_err"] = _rel_err(both(), truth)
            ms, extra = time_calls(both, clock, warmup=1, reps=args.reps)
            setting["ms"].append(ms)
            setting["extra_gib"] = extra / GIB
            chunk_logits, row_loss = logits[:chunk], torch.empty(chunk, device=device)
            row_scale, shifts = torch.empty(chunk, device=device), torch.empty(chunk * -(-vocab // 1024), device=device)

            def kernel(chunk=chunk, chunk_logits=chunk_logits, row_loss=row_loss, setting=kernel_setting,
                       row_scale=row_scale, shifts=shifts):
                one_pass = setting["one_pass"] is not None
                k = setting["one_pass" if one_pass else "two_passes"]
                grid = (flce._row_programs(chunk, device, k),)
                common = {"BLOCK": k["block"], "COMPUTE_DTYPE": tl.float32, "num_warps": k["warps"]}
                if one_pass:
                    flce._fused_linear_cross_entropy_one_pass_kernel[grid](
                        chunk_logits, y[:chunk], row_loss, scale, row_scale, shifts, chunk_logits.stride(0), chunk,
                        vocab, -100, SPREAD=flce.SHIFT_SPREAD, **common)
                else:
                    flce._fused_linear_cross_entropy_fwd_kernel[grid](
                        chunk_logits, y[:chunk], row_loss, scale, chunk_logits.stride(0), chunk, vocab, -100,
                        COMPUTE_GRAD=True, REVERSE=k["reverse"], **common)

            setting["kernel_ms"].append(time_calls(kernel, clock, warmup=1, reps=args.reps)[0])
    for setting in settings:
        setting["ms"], setting["kernel_ms"] = statistics.median(setting["ms"]), statistics.median(setting["kernel_ms"])
        passes = 2 if ROW_KERNELS[setting["row_kernel"]]["one_pass"] is not None else 3
        setting["kernel_gb_s"] = passes * setting["chunk_rows"] * vocab * 2 / setting["kernel_ms"] / 1e6
        print(json.dumps(setting), flush=True)
    return baseline, settings


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
    default_kernel, default_budget = flce.ROW_KERNEL, flce.LOGITS_CHUNK_BYTES
    baselines, results = [], []
    for shape in args.shapes.split(","):
        baseline, settings = sweep_shape(shape, args, clock)
        baselines.append(baseline)
        results += settings
        torch.cuda.empty_cache()
    flce.ROW_KERNEL, flce.LOGITS_CHUNK_BYTES = default_kernel, default_budget
    print("\n| head | logits budget | chunk rows | row kernel | fwd+bwd ms | row kernel ms (GB/s of its passes) "
          "| extra GiB | rel. err. vs fp32 |\n|---|---|---|---|---|---|---|---|")
    for s in results:
        budget = f"{s['chunk_mib']} MiB" if s["chunk_mib"] else "all rows"
        print(f"| {s['shape']} | {budget} | {s['chunk_rows']} | {s['row_kernel']} | {s['ms']:.3f} | "
              f"{s['kernel_ms']:.3f} ({s['kernel_gb_s']:.0f}) | {s['extra_gib']:.3f} | {s['max_rel_err']:.1e} |")
    for b in baselines:
        print(f"| {b['shape']} | PyTorch in bf16 (the logits rounded) | | | | | | {b['pytorch_bf16_rel_err']:.1e} |")
    with open(args.out, "w") as f:
        json.dump({"environment": describe_environment(clock.device), "rows": args.rows, "dtype": "bf16",
                   "row_kernels": ROW_KERNELS, "pytorch_bf16": baselines,
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
