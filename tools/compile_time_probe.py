"""Where the first step of a compiled training step spends its time, per backend (how much longer
twinkle's first step takes than Inductor's, and in which phase).

For each backend of the harness (``twinkle_fx.bench.backends``), a fresh reference model (``--workload``, bf16 on CUDA, fp32 on CPU) runs one
forward + backward with labels after ``torch._dynamo.reset()``, and the script prints:

- the wall time of that first step;
- Dynamo's own per-phase times (``torch._dynamo.utils.compile_times``: tracing, AOT autograd, the
  backend's compile);
- twinkle's pass times (``GraphReport.pass_ms``, summed over graphs);
- how often torch's per-launch Triton front-end run (``generate_ttir``) was answered from twinkle's
  memo (``twinkle_fx.compiler.inner.ttir_memo``); a backend name ending in ``/no-ttir-memo`` runs
  without the memo, for comparison;

Usage::

    python tools/compile_time_probe.py --backends inductor+cudagraphs,twinkle+cudagraphs   # GPU, 4 x 1024
    python tools/compile_time_probe.py --backends twinkle --layers 2 --batch 1 --seq 16    # CPU smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import functools
import json
import sys
import time
from collections import defaultdict

import torch

from twinkle_fx.core.outputs import output_file


def _time_generate_ttir() -> dict:
    """Count and time torch's generate_ttir for the rest of the process (what runs under the memo's
    misses, or every call without it)."""
    timer = {"count": 0, "s": 0.0, "keys": []}
    try:
        from torch._higher_order_ops import triton_kernel_wrap
    except ImportError:
        return timer
    original = triton_kernel_wrap.generate_ttir

    @functools.wraps(original)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            timer["count"] += 1
            timer["s"] += time.perf_counter() - start
            from twinkle_fx.compiler.inner.ttir_memo import ttir_key

            timer["keys"].append(ttir_key(*args, **kwargs))

    triton_kernel_wrap.generate_ttir = timed
    return timer


def _print_key_diversity(keys: list) -> None:
    """Per kernel: how many front-end runs, how many distinct memo keys, and what differs between them."""
    by_kernel: dict[str, list] = defaultdict(list)
    for key in keys:
        if key is not None:
            kernel = key[0]
            by_kernel[getattr(getattr(kernel, "fn", kernel), "__name__", repr(kernel))].append(key)
    for name, runs in by_kernel.items():
        distinct = list(dict.fromkeys(runs))
        print(f"   front-end runs of {name}: {len(runs)}, distinct keys {len(distinct)}")
        first = dict(distinct[0][2])
        for other in distinct[1:3]:
            second = dict(other[2])
            print("      differs:", {n: (first.get(n), second.get(n)) for n in sorted(set(first) | set(second))
                                      if first.get(n) != second.get(n)} or f"kernel/device {distinct[0][:2]} vs {other[:2]}")


@contextlib.contextmanager
def _without_ttir_memo():
    from twinkle_fx.compiler.inner import ttir_memo

    saved = ttir_memo.memoized_ttir
    ttir_memo.memoized_ttir = contextlib.nullcontext
    try:
        yield
    finally:
        ttir_memo.memoized_ttir = saved


def _first_training_step(workload, name: str, device: torch.device, dtype: torch.dtype, args) -> tuple[float, float]:
    """Seconds of the first forward + backward with labels (and of its forward alone), compile included."""
    from twinkle_fx.bench.backends import backend
    from twinkle_fx.bench.workloads import build_model, make_batch

    model = build_model(workload, tiny=False, dtype=dtype, device=device, seed=0).train()
    input_ids, labels = make_batch(workload, tiny=False, batch=args.batch, seq=args.seq, device=device, seed=0)
    with backend(name).prepare(model, workload.family, device) as prepared:
        _sync(device)
        start = time.perf_counter()
        loss = prepared.model(input_ids=input_ids, labels=labels).loss
        forward_s = time.perf_counter() - start
        loss.backward()
        _sync(device)
        return time.perf_counter() - start, forward_s


def _first_decode(workload, name: str, device: torch.device, dtype: torch.dtype, args) -> tuple[float, float]:
    """Seconds of the first compiled decode step (``--batch`` sequences x 1 token on a StaticCache
    filled by an eager prefill of ``--seq`` tokens), as the harness's ``--inference`` decode rows."""
    from transformers import StaticCache

    from twinkle_fx.bench.inference import INFERENCE_BACKENDS
    from twinkle_fx.bench.workloads import build_model

    model = build_model(workload, tiny=False, dtype=dtype, device=device, seed=0).eval()
    vocab = workload.config_kwargs()["vocab_size"]
    context = torch.randint(0, vocab, (args.batch, args.seq), device=device)
    step_ids = torch.randint(0, vocab, (args.batch, 1), device=device)
    with torch.no_grad(), INFERENCE_BACKENDS[name][1](model, workload.family, device, None) as prepared:
        cache = StaticCache(config=model.config, max_cache_len=args.seq + 4)
        model(input_ids=context, past_key_values=cache, use_cache=True, logits_to_keep=1)
        position = torch.tensor([args.seq], device=device)
        _sync(device)
        start = time.perf_counter()
        prepared.model(input_ids=step_ids, past_key_values=cache, cache_position=position, use_cache=True,
                       logits_to_keep=1)
        _sync(device)
        elapsed = time.perf_counter() - start
        return elapsed, elapsed


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="inductor,twinkle")
    parser.add_argument("--workload", default="qwen2")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--layers", type=int, help="override the workload's layer count")
    parser.add_argument("--decode", action="store_true",
                        help="time the first compiled decode step (--batch x 1 on a cache of --seq tokens; "
                             "backends of bench --inference) instead of a training step")
    parser.add_argument("--json", type=output_file, help="write the rows here")
    args = parser.parse_args()

    from torch._dynamo.utils import compile_times

    from twinkle_fx.bench.workloads import get_workload
    from twinkle_fx.compiler import collect_reports

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    workload = get_workload(args.workload)
    if args.layers is not None:
        workload = dataclasses.replace(workload, config={**workload.config, "num_hidden_layers": args.layers})
    from twinkle_fx.bench.model_bench import warm_compiler
    from twinkle_fx.compiler.inner import ttir_memo

    ttir_timer = _time_generate_ttir()
    rows = []
    warm_compiler(device, args.backends.split(","))
    for backend in args.backends.split(","):
        name, _, variant = backend.partition("/")
        torch._dynamo.reset()
        torch._dynamo.utils.compilation_time_metrics.clear()
        memo_before = ttir_memo.stats()
        memo = contextlib.nullcontext() if variant != "no-ttir-memo" else _without_ttir_memo()
        with memo, collect_reports() as report:
            if args.decode:
                first_s, forward_s = _first_decode(workload, name, device, dtype, args)
            else:
                first_s, forward_s = _first_training_step(workload, name, device, dtype, args)
        ttir_runs, ttir_s, ttir_keys = ttir_timer["count"], ttir_timer["s"], ttir_timer["keys"]
        ttir_timer.update(count=0, s=0.0, keys=[])
        memo_after = ttir_memo.stats()
        memo_counts = {k: memo_after[k] - memo_before[k] for k in memo_after}
        pass_ms: dict[str, float] = defaultdict(float)
        for graph in report.graphs:
            for pass_name, ms in (graph.pass_ms or {}).items():
                pass_ms[pass_name] += ms
        row = {
            "backend": backend, "first_step_s": round(first_s, 2), "forward_s": round(forward_s, 2),
            "dynamo": compile_times(repr="csv", aggregate=True),
            "pass_ms": {k: round(v, 1) for k, v in pass_ms.items()},
            "ttir_memo": memo_counts, "generate_ttir_runs": ttir_runs, "generate_ttir_s": round(ttir_s, 2),
        }
        rows.append(row)
        print(f"== {backend}: first step {first_s:.2f} s (forward incl. compile {forward_s:.2f} s), "
              f"twinkle passes {sum(pass_ms.values()) / 1e3:.2f} s; TTIR memo {memo_counts}, "
              f"{ttir_runs} Triton front-end runs for torch's analysis, {ttir_s:.2f} s", flush=True)
        _print_key_diversity(ttir_keys)
        names, values = row["dynamo"]
        for n, v in sorted(zip(names, values), key=lambda nv: -float(nv[1] or 0))[:14]:
            print(f"   dynamo {n}: {float(v):.2f} s")
        for n, v in sorted(row["pass_ms"].items(), key=lambda nv: -nv[1]):
            print(f"   pass {n}: {v:.0f} ms")
        gc.collect()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
