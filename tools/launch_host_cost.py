"""Host cost of one twinkle_triton kernel launched from Inductor's generated code, with and without
``torch._inductor.config.static_launch_user_defined_triton_kernels``, beside Inductor's own kernels.

A compiled chain of ``--ops`` RMSNorms on a small bf16 tensor (8 x 896: the device work is a few
microseconds, so the host is the bottleneck) is called back to back without synchronising; host time
per call (best of 3 rounds) divided by the kernels it launches (counted with the profiler) is the
host cost per launch. Rows:

* ``inductor``: the RMSNorm written in torch ops, Inductor's own generated kernels (static launcher),
  fusion off so that there are many of them;
* ``twinkle``: ``twinkle_triton.rms_norm`` (a ``torch.library.triton_op``): Inductor launches our
  user-defined Triton kernel; by default through Triton's own launcher;
* ``twinkle+static``: the same with the static launcher for user-defined kernels.

The static-launch decision is made where the kernel is compiled, in Inductor's compile workers,
which read ``TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS`` when they start: a
``config.patch`` in the calling process does not reach them. So each setting runs in a child process
with the variable set from the start and its own Inductor cache, and ``TORCHINDUCTOR_STRICT_STATIC_CUDA_LAUNCHER=1``
makes the static child fail, naming the kernel and why, if any kernel cannot be launched statically.

    python tools/launch_host_cost.py [--ops 32] [--out launch-host-cost.json]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from twinkle_fx.core.outputs import output_file

SETTINGS = ("inductor", "twinkle", "twinkle+static")


def child(setting: str, ops: int) -> dict:
    import torch
    import twinkle_triton

    x = torch.randn(8, 896, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(896, device="cuda", dtype=torch.bfloat16)

    def torch_rms_norm(x, w, eps=1e-6):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    norm = torch_rms_norm if setting == "inductor" else twinkle_triton.rms_norm
    if setting == "inductor":
        # no fusion: Inductor would fuse the chain into a few kernels; here every scheduler node is a
        # kernel of its own, so the host cost per launch is averaged over many launches
        torch._inductor.config.max_fusion_size = 1

    def chain(x, w):
        for _ in range(ops):
            x = norm(x, w, 1e-6)
        return x

    compiled = torch.compile(chain)
    start = time.perf_counter()
    for _ in range(3):
        compiled(x, w)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - start
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        compiled(x, w)
        torch.cuda.synchronize()
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    calls, best = 200, float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            compiled(x, w)
        best = min(best, time.perf_counter() - start)
        torch.cuda.synchronize()
    per_call_us = best / calls * 1e6
    return {"setting": setting, "ops": ops, "kernels_per_call": kernels, "kernel_names": names,
            "host_us_per_call": round(per_call_us, 1),
            "host_us_per_kernel": round(per_call_us / max(kernels, 1), 2), "compile_s": round(compile_s, 1),
            "device": torch.cuda.get_device_name(), "torch": torch.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=32)
    parser.add_argument("--out", type=output_file)
    parser.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.ops)))
        return
    results = []
    for setting in SETTINGS:
        static = setting == "twinkle+static"
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="inductor-"),
               "TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS": "1" if static else "0",
               "TORCHINDUCTOR_STRICT_STATIC_CUDA_LAUNCHER": "1" if static else "0"}
        proc = subprocess.run([sys.executable, __file__, "--child", setting, "--ops", str(args.ops)],
                              env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            result = {"setting": setting, "error": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]}
            print(proc.stderr[-3000:], file=sys.stderr)
        else:
            result = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(result)
        print(json.dumps(result), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
