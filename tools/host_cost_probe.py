"""Is ``bench --micro``'s "host us" column launch cost only? The same measurement
(``twinkle_fx.bench.micro._Case._host_fwd_bwd`` and ``bench.timing.host_us``) on each op's full
micro shape and on its tiny shape (64 rows), in one process.

If the host time of a call included waits on the device (a full launch queue, an allocator
synchronisation) or work that grows with the tensors, the full shape would cost more host time than
the tiny one: the host of a kernel launch does not depend on the tensor sizes. Equal columns mean
the micro bench's host column measures Python, dispatch and launch work only.

    python tools/host_cost_probe.py [--ops rms_norm,add_rms_norm,...] [--dtype bf16]

Needs CUDA (on the CPU there is no launch to separate from the work).
"""

from __future__ import annotations

import argparse

import torch

from twinkle_fx.bench.micro import MICRO_CASES, MicroBenchOptions, _Case, _Impl, _tensors
from twinkle_fx.bench.timing import DeviceClock, host_us

DEFAULT_OPS = ("rms_norm", "add_rms_norm", "apply_rotary_pos_emb", "silu_mul", "silu_and_mul")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=",".join(DEFAULT_OPS))
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tools/host_cost_probe.py needs CUDA: the host cost of a launch is what it separates")
    import twinkle_triton

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    device = torch.device("cuda")
    clock = DeviceClock(device)
    options = MicroBenchOptions(impls=["twinkle"], dtype=dtype, reps=1, warmup=1, device=device)
    by_op = {case.op: case for case in MICRO_CASES}
    unknown = [op for op in args.ops.split(",") if op not in by_op]
    if unknown:
        raise SystemExit(f"unknown op(s) {unknown}; known: {sorted(by_op)}")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}; host us per call "
          "(best of 3 rounds, as bench --micro)")
    print(f"{'op':32} {'shape':34} {'fwd (no grad)':>14} {'fwd+bwd':>9} {'bwd':>7}")
    for op in args.ops.split(","):
        for tiny in (False, True):
            inputs = by_op[op].make(tiny, device, dtype)
            case = _Case(by_op[op], inputs, options, clock, copy_gbps=1.0)
            impl = _Impl("twinkle", getattr(twinkle_triton, op), inputs.args)
            case.run_once(impl)  # compiles the kernels of this shape
            with torch.no_grad():
                fwd = host_us(lambda: impl.fn(*impl.args), clock, calls=20)
            both, bwd = case._host_fwd_bwd(impl, case.grad_outputs(_tensors(impl.fn(*impl.args))))
            print(f"{op:32} {inputs.shape[:34]:34} {fwd:14.1f} {both:9.1f} {bwd:7.1f}")


if __name__ == "__main__":
    main()
