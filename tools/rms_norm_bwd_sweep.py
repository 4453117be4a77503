"""The RMSNorm backward's tiling (rows a loop step, warps, programs per SM) at a training step's shapes, with and
without the residual sum's gradient (``add_rms_norm``): the device time of the kernel and of the partial
weight-gradient sum (the harness's ``kernel_ms``: profiled, cold L2; event timing of these eager launches would time
the host), each setting checked against the default's gradients.
Prints the best settings per shape and writes JSON.

    python tools/rms_norm_bwd_sweep.py --out rms-norm-bwd.json
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json

import torch

from twinkle_fx.bench.timing import kernel_ms
from twinkle_fx.core.outputs import output_file
from twinkle_fx.measure.clock import DeviceClock
from twinkle_fx.measure.environment import describe_environment

# the module (the package's attribute of that name is the function)
rms = importlib.import_module("twinkle_triton.rms_norm")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=output_file)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--hidden", default="896,2048,3072")
    parser.add_argument("--tile-rows", default="1,2,4,8")
    parser.add_argument("--warps", default="4,8,16")
    parser.add_argument("--per-sm", default="1,2,4")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    device = torch.device("cuda")
    clock = DeviceClock(device)
    default_tiling = rms._bwd_tiling
    results = []
    for hidden, has_sum in itertools.product((int(h) for h in args.hidden.split(",")), (False, True)):
        torch.manual_seed(0)
        x, grad, grad_sum = (torch.randn(args.rows, hidden, device=device, dtype=torch.bfloat16) for _ in range(3))
        weight = torch.randn(hidden, device=device, dtype=torch.bfloat16)
        summed = grad_sum if has_sum else None
        rms._bwd_tiling = default_tiling
        want = rms._launch_bwd(grad, summed, x, weight, 1e-6, "rms_norm")
        block = default_tiling(hidden, has_sum, "rms_norm")[0]
        moved = (4 if has_sum else 3) * args.rows * hidden * 2
        rows = []
        settings = [default_tiling(hidden, has_sum, "rms_norm")] + [
            (block, r, w, p) for r, w, p in itertools.product(*(
                [int(v) for v in a.split(",")] for a in (args.tile_rows, args.warps, args.per_sm)))]
        for setting in settings:
            rms._bwd_tiling = lambda *_, s=setting: s
            try:
                got = rms._launch_bwd(grad, summed, x, weight, 1e-6, "rms_norm")
                err = max(float((g.float() - w.float()).norm() / w.float().norm()) for g, w in zip(got, want))
                call = (grad, summed, x, weight, 1e-6, "rms_norm")
                rms._launch_bwd(*call)
                ms = kernel_ms(lambda call=call: rms._launch_bwd(*call), clock, reps=args.reps)
            except Exception as e:  # noqa: BLE001 - a setting that does not compile is a row of the sweep
                rows.append({"hidden": hidden, "grad_sum": has_sum, "setting": setting, "error": str(e)[:300]})
                continue
            rows.append({"hidden": hidden, "grad_sum": has_sum, "setting": setting, "us": ms * 1e3,
                         "gb_s": moved / ms / 1e6, "max_rel_err": err, "default": setting == settings[0]})
        rms._bwd_tiling = default_tiling
        timed = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
        default = next(r for r in rows if r.get("default"))
        print(f"rows {args.rows} hidden {hidden} grad_sum {has_sum}: default {default['setting']} "
              f"{default['us']:.1f} us ({default['gb_s']:.0f} GB/s)")
        for r in timed[:5]:
            print(f"    (BLOCK, ROWS, warps, per SM) {r['setting']}: {r['us']:.1f} us ({r['gb_s']:.0f} GB/s), "
                  f"err {r['max_rel_err']:.1e}")
        results += rows
    with open(args.out, "w") as f:
        json.dump({"environment": describe_environment(device), "rows": args.rows, "dtype": "bf16",
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
