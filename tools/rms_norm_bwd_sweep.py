"""The RMSNorm backward's tiling (rows a loop step, warps, programs per SM, the loop's pipeline stages) at a training
step's shapes, with and without the residual sum's gradient (``add_rms_norm``): the device time of the kernel and of
the partial weight-gradient sum (the harness's ``kernel_ms``: profiled, cold L2; event timing of these eager launches
would time the host), each setting checked against the default's gradients.
Prints the best settings per shape and writes JSON.

``--launches``: the default tiling launched eagerly and by Inductor (the op compiled alone: Inductor then launches
the kernel from its own code, as in a compiled training step), the kernel's device time and its compiled binary
(warps, registers, spills) for each, and every build of the kernel in Triton's and Inductor's caches (the argument
types and hints it was compiled with, its vector loads and stores). It found Inductor typing ``eps`` fp64, which
made the kernel's arithmetic fp64 (1.6-20x slower) until the kernels converted their float arguments to fp32.

    python tools/rms_norm_bwd_sweep.py --out rms-norm-bwd.json
    python tools/rms_norm_bwd_sweep.py --out rms-norm-launches.json --launches
"""

from __future__ import annotations

import argparse
import glob
import importlib
import itertools
import json
import os
import pathlib
import re
import statistics
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from twinkle_fx.bench.timing import kernel_ms
from twinkle_fx.core.outputs import output_file
from twinkle_fx.measure.clock import DeviceClock
from twinkle_fx.measure.environment import describe_environment

# the module (the package's attribute of that name is the function)
rms = importlib.import_module("twinkle_triton.rms_norm")


KERNEL = "_rms_norm_bwd_kernel"


def _kernel_us(fn, clock: DeviceClock, reps: int) -> float:
    """Median device µs of the backward kernel itself over ``reps`` calls of ``fn``, each after an L2 flush."""
    flush = clock.cache_flusher()
    for _ in range(3):
        fn()
    clock.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush()
            fn()
        clock.synchronize()
    return statistics.median(e.device_time for e in prof.events() if KERNEL in e.name and e.device_time > 0)


def _eager_binaries() -> list[dict]:
    out = []
    for kernels, *_ in rms._rms_norm_bwd_kernel.device_caches.values():
        out += [{"num_warps": k.metadata.num_warps, "num_stages": k.metadata.num_stages, "n_regs": k.n_regs,
                 "n_spills": k.n_spills, "shared": k.metadata.shared} for k in kernels.values()]
    return out


def _compiled_modules() -> list:
    from torch._inductor.codecache import PyCodeCache

    return list(getattr(PyCodeCache, "modules", []))


def _inductor_binaries(modules: list) -> list[dict]:
    out = []
    for module in modules:
        for name in dir(module):
            tuner = getattr(module, name)
            if KERNEL in name and hasattr(tuner, "launchers"):
                out += [{"name": name, "config": str(getattr(launcher, "config", None)),
                         "n_regs": getattr(launcher, "n_regs", None), "n_spills": getattr(launcher, "n_spills", None),
                         "shared": getattr(launcher, "shared", None)} for launcher in tuner.launchers]
    return out


def _cached_builds() -> list[dict]:
    """Every build of the kernel in Triton's and Inductor's caches: the argument hints its TTIR was compiled with
    (divisibility, equal-to-1) and how its PTX loads global memory (vector widths), to tell the two launches apart."""
    roots = [os.environ.get("TRITON_CACHE_DIR", os.path.expanduser("~/.triton/cache")),
             os.path.join(tempfile.gettempdir(), "torchinductor_*")]
    out = []
    for ttir in sorted({p for root in roots for p in glob.glob(f"{root}/**/{KERNEL}.ttir", recursive=True)}):
        text = pathlib.Path(ttir).read_text()
        ptx_path = pathlib.Path(ttir[: -len(".ttir")] + ".ptx")
        ptx = ptx_path.read_text() if ptx_path.exists() else ""
        out.append({"path": ttir, "signature": next((ln.strip() for ln in text.splitlines() if "tt.func" in ln), ""),
                    **{f"{op}_global_{name}": len(re.findall(rf"{op}\.global[\w.]*{suffix}\b", ptx))
                       for op in ("ld", "st") for name, suffix in (("v4", ".v4"), ("v2", ".v2"), ("all", ""))}})
    return out


def compare_launches(args, clock: DeviceClock) -> list[dict]:
    """The default tiling's kernel launched eagerly and by Inductor, at each shape."""
    device, results = clock.device, []
    for hidden, has_sum in itertools.product((int(h) for h in args.hidden.split(",")), (False, True)):
        torch.manual_seed(0)
        x, grad, grad_sum = (torch.randn(args.rows, hidden, device=device, dtype=torch.bfloat16) for _ in range(3))
        weight = torch.randn(hidden, device=device, dtype=torch.bfloat16)
        if has_sum:
            op, inputs = torch.ops.twinkle.add_rms_norm_backward.default, (grad, grad_sum, x, weight, 1e-6)
        else:
            op, inputs = torch.ops.twinkle.rms_norm_backward.default, (grad, x, weight, 1e-6)
        torch._dynamo.reset()
        compiled = torch.compile(lambda *a, op=op: op(*a), fullgraph=True)
        eager_out = rms._launch_bwd(grad, grad_sum if has_sum else None, x, weight, 1e-6, "rms_norm")
        known = len(_compiled_modules())
        compiled_out = compiled(*inputs)
        err = max(float((a.float() - b.float()).norm() / a.float().norm()) for a, b in zip(eager_out, compiled_out))
        tiling = rms._bwd_tiling(hidden, has_sum, "rms_norm", x.element_size(), device)
        row = {"hidden": hidden, "grad_sum": has_sum, "tiling": tiling,
               "eager_us": _kernel_us(lambda op=op, inputs=inputs: op(*inputs), clock, args.reps),
               "inductor_us": _kernel_us(lambda inputs=inputs, fn=compiled: fn(*inputs), clock, args.reps),
               "max_rel_err": err, "eager_binaries": _eager_binaries(),
               "inductor_binaries": _inductor_binaries(_compiled_modules()[known:])}
        print(json.dumps(row), flush=True)
        results.append(row)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=output_file)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--hidden", default="896,2048,3072")
    parser.add_argument("--tile-rows", default="1,2,4,8")
    parser.add_argument("--warps", default="4,8,16")
    parser.add_argument("--per-sm", default="1,2,4")
    parser.add_argument("--stages", default="1,3", help="the loop's pipeline stages (1: not pipelined)")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--launches", action="store_true", help="the default tiling, eager launch against Inductor's")
    args = parser.parse_args()
    device = torch.device("cuda")
    clock = DeviceClock(device)
    if args.launches:
        launches = compare_launches(args, clock)
        builds = _cached_builds()
        for build in builds:
            print(json.dumps(build), flush=True)
        with open(args.out, "w") as f:
            json.dump({"environment": describe_environment(device), "rows": args.rows, "dtype": "bf16",
                       "launches": launches, "builds": builds}, f, indent=1)
        return
    default_tiling = rms._bwd_tiling
    results = []
    for hidden, has_sum in itertools.product((int(h) for h in args.hidden.split(",")), (False, True)):
        torch.manual_seed(0)
        x, grad, grad_sum = (torch.randn(args.rows, hidden, device=device, dtype=torch.bfloat16) for _ in range(3))
        weight = torch.randn(hidden, device=device, dtype=torch.bfloat16)
        summed = grad_sum if has_sum else None
        rms._bwd_tiling = default_tiling
        want = rms._launch_bwd(grad, summed, x, weight, 1e-6, "rms_norm")
        default_setting = default_tiling(hidden, has_sum, "rms_norm", x.element_size(), device)
        block = default_setting[0]
        moved = (4 if has_sum else 3) * args.rows * hidden * 2
        rows = []
        settings = [default_setting] + [
            (block, r, w, p, st) for r, w, p, st in itertools.product(*(
                [int(v) for v in a.split(",")] for a in (args.tile_rows, args.warps, args.per_sm, args.stages)))]
        for setting in settings:
            rms._bwd_tiling = lambda *_, s=setting: s
            try:
                got = rms._launch_bwd(grad, summed, x, weight, 1e-6, "rms_norm")
                err = max(float((g.float() - w.float()).norm() / w.float().norm()) for g, w in zip(got, want))
                call = (grad, summed, x, weight, 1e-6, "rms_norm")
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
            print(f"    (BLOCK, ROWS, warps, per SM, stages) {r['setting']}: {r['us']:.1f} us ({r['gb_s']:.0f} GB/s), "
                  f"err {r['max_rel_err']:.1e}")
        results += rows
    with open(args.out, "w") as f:
        json.dump({"environment": describe_environment(device), "rows": args.rows, "dtype": "bf16",
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
