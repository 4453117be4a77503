"""Does Triton's compiler run in parallel from Python threads? (whether the custom ops' kernels
can be compiled in a thread pool beside Inductor's compile, issue 15's first-step time)

Compiles ``--kernels`` distinct specialisations of one elementwise kernel (a constexpr block size
and a constexpr seed make each one a new compile) once one after another, then as many again from
a thread pool, and prints both wall times. Equal times: the compiler holds the GIL.

    python tools/triton_compile_threads_probe.py --kernels 8 --threads 8     # needs a GPU
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import triton
import triton.language as tl


@triton.jit
def _scaled_copy(x_ptr, y_ptr, n, SEED: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    y = tl.exp(x * SEED) / (1.0 + tl.exp(-x)) + tl.sqrt(tl.abs(x) + SEED)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


def _compile(seed: int) -> None:
    x = torch.randn(4096, device="cuda")
    _scaled_copy[(4,)](x, torch.empty_like(x), x.numel(), SEED=seed, BLOCK=1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=8)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    _compile(10_000)  # driver and backend initialisation out of the timing
    torch.cuda.synchronize()
    start = time.perf_counter()
    for seed in range(args.kernels):
        _compile(seed + 1)
    torch.cuda.synchronize()
    serial = time.perf_counter() - start
    start = time.perf_counter()
    with ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(_compile, range(args.kernels + 1, 2 * args.kernels + 1)))
    torch.cuda.synchronize()
    threaded = time.perf_counter() - start
    print(f"triton {triton.__version__}: {args.kernels} compiles serially {serial:.2f} s "
          f"({serial / args.kernels * 1e3:.0f} ms each), from {args.threads} threads {threaded:.2f} s "
          f"(speed-up {serial / threaded:.2f}x)")


if __name__ == "__main__":
    main()
