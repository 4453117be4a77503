"""The fused MoE expert kernels against transformers' grouped_mm experts at two model shapes (GPU only).

Each row times ``twinkle_triton.moe_swiglu_experts`` (the grouped GEMMs of ``twinkle_triton.moe_gemm``)
and the same weights in transformers' ``Qwen3MoeExperts`` with ``config._experts_implementation =
"grouped_mm"`` (``torch._grouped_mm`` over the tokens sorted and copied by expert, the SwiGLU and the
weighted sum as separate kernels), forward alone (no grad) and forward + backward (gradients of the
tokens, both weights and the routing weights), in bf16 with ``triton.testing.do_bench``. Routing is a
softmax router's top-k over random logits (about balanced). TFLOP/s counts the GEMMs' multiply-adds
(forward 6 * T * k * H * I, forward + backward 3x that).

``--block-m``, ``--block-n``, ``--block-k``, ``--warps``, ``--stages``, ``--tma`` (0 or 1: operands loaded by TMA
where they allow it), ``--programs-per-sm`` (0: a program a tile; N: N programs an SM that loop over the tiles),
``--half-tiles`` (0 or 1: an expert's last tile computed half as high where its rows fit; down and grad_input only),
``--warp-specialize`` (0 or 1) and ``--gluon`` (0 or 1: the Gluon kernel on Hopper; both padded_weight_grad only)
sweep the launch configuration (``twinkle_triton.moe_gemm.CONFIGS``) of the kernels ``--kernels`` names (default
all: ``gate_up`` and ``down`` run in the forward, ``grad_act``, ``grad_input`` and the weight gradients' kernel,
``weight_grad`` or ``padded_weight_grad``, in the backward; for those two BLOCK_M x BLOCK_N is the weight tile and
BLOCK_K the rows a step); the others keep their configuration. A configuration the GPU cannot run (shared memory)
is reported and skipped.

``--per-kernel`` tunes each kernel on its own instead: for each kernel ``--kernels`` names and each setting
(the others at their defaults) it runs forward + backward under ``torch.profiler``, checks the output and every
gradient against transformers' experts, and takes that kernel's own device time (the median of a few calls;
launches are told apart by their order in a call: ``LAUNCHES``). One run then finds every kernel's fastest
setting at each shape, and times the five together against ``grouped_mm``, forward and forward + backward.
Without knob flags each kernel tries its own ``CANDIDATES`` (settings that compile for sm_90 without spilling).

``--weight-grad padded,grouped_mm,triton`` times each way the backward can compute the weight gradients
(``moe_gemm.WEIGHT_GRAD``), every gradient checked against transformers' experts for each; with ``--per-kernel``, the
one Triton way (``padded`` or ``triton``) whose kernel is tuned with the others.

    python tools/moe_gemm_sweep.py --out moe.json
    python tools/moe_gemm_sweep.py --out moe-fwd.json --kernels gate_up --block-m 64,128 --block-n 64,128 --warps 4,8
    python tools/moe_gemm_sweep.py --out moe-kernels.json --per-kernel --block-m 64,128 --block-n 64,128 --warps 4,8
    python tools/moe_gemm_sweep.py --out moe-wgrad.json --weight-grad padded,grouped_mm,triton
    python tools/moe_gemm_sweep.py --out moe-padded.json --per-kernel --weight-grad padded --kernels padded_weight_grad
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import statistics
import tempfile
from pathlib import Path

import torch
import twinkle_triton as tt
from triton.testing import do_bench

from twinkle_fx.core.outputs import output_file
from twinkle_fx.measure.environment import describe_environment
from twinkle_fx.measure.overlap import kernel_intervals

moe_gemm = importlib.import_module("twinkle_triton.moe_gemm")

# shape name -> (experts, top-k, hidden, intermediate): one routed-experts layer of each model
SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768), "mixtral-8x7b": (8, 2, 4096, 14336),
          "deepseek-v3": (256, 8, 7168, 2048), "ernie-4.5-21b-a3b": (64, 6, 2560, 1536)}
KNOBS = (("block_m", "BLOCK_M"), ("block_n", "BLOCK_N"), ("block_k", "BLOCK_K"), ("warps", "num_warps"),
         ("stages", "num_stages"), ("tma", "TMA"), ("programs_per_sm", "PROGRAMS_PER_SM"), ("half_tiles", "HALF_TILES"),
         ("warp_specialize", "WARP_SPECIALIZE"), ("gluon", "GLUON"))
# the GEMM kernels one forward + backward of moe_swiglu_experts launches, in order, with the CONFIGS entry of each, by
# the Triton way the backward computes the weight gradients (moe_gemm.WEIGHT_GRAD)
_EXPERT_GEMMS = (("_gate_up_kernel", "gate_up"), ("_rows_to_pairs_kernel", "down"),
                 ("_gathered_gemm_kernel", "grad_act"), ("_rows_to_pairs_kernel", "grad_input"))
LAUNCHES = {"triton": _EXPERT_GEMMS + (("_weight_grad_kernel", "weight_grad"),) * 2,
            "padded": _EXPERT_GEMMS + (("_padded_weight_grad_kernel", "padded_weight_grad"),) * 2}
GRAD_RTOL = 2e-2  # relative error (norm of the difference over the reference's) of each gradient, bf16
# --per-kernel without knob flags: each kernel's candidates (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages),
# larger tiles first. Chosen from a grid compiled for sm_90 on a CPU (the stand-in driver of
# tests/kernels/hopper_compile.py): settings that spill no register and fit an H100's shared memory. gate_up spills at
# 128 x 128 with BLOCK_K 32 and at 128 x 256. grad_act's GEMM (the SwiGLU derivative is a kernel of its own) takes
# down's settings.
CANDIDATES = {
    "gate_up": ((128, 128, 64, 8, 4), (64, 256, 64, 8, 3), (128, 64, 64, 8, 4), (64, 128, 64, 8, 3)),
    "down": ((128, 256, 64, 8, 4), (128, 256, 32, 8, 3), (64, 256, 64, 8, 3), (128, 128, 64, 8, 4),
             (128, 128, 64, 8, 3)),
    "grad_act": ((128, 256, 64, 8, 4), (128, 256, 64, 8, 3), (128, 256, 32, 8, 3), (64, 256, 64, 8, 3),
                 (128, 128, 64, 8, 4), (128, 128, 64, 8, 3)),
    "grad_input": ((128, 256, 64, 8, 4), (128, 256, 64, 8, 3), (128, 256, 32, 8, 4), (64, 256, 64, 8, 3),
                   (128, 128, 64, 8, 4), (128, 128, 64, 8, 3), (128, 128, 64, 4, 3)),
    "weight_grad": ((128, 256, 64, 8, 4), (128, 256, 64, 8, 3), (128, 256, 32, 8, 4), (128, 128, 64, 8, 3),
                    (128, 128, 32, 8, 4), (128, 128, 32, 8, 3)),
    # warp-specialized: 4 warps a consumer group (two groups and a producer: 12 warps); a 128 x 256 tile 64 rows deep
    # in 3 stages takes 208 KiB of shared memory with the stored tile's
    "padded_weight_grad": ((256, 128, 64, 4, 3), (128, 256, 64, 4, 3), (256, 128, 32, 4, 6), (128, 256, 32, 4, 6),
                           (128, 128, 64, 4, 5), (128, 128, 64, 4, 4), (128, 128, 32, 4, 8)),
}


def _experts(experts, top_k, hidden, inter, dtype):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=inter, num_experts=experts,
                            num_experts_per_tok=top_k)
    config._experts_implementation = "grouped_mm"
    with torch.device("cuda"):  # not on the host first: Mixtral's experts are 5.6 GB in fp32
        module = Qwen3MoeExperts(config).to(dtype)
    with torch.no_grad():
        module.gate_up_proj.normal_(0, hidden**-0.5)
        module.down_proj.normal_(0, inter**-0.5)
    return module


def _cases(module, tokens, top_k, dtype):
    """{mode: (ours, theirs)}: callables for do_bench, inputs made once."""
    hidden = module.gate_up_proj.shape[2]
    x = torch.randn(tokens, hidden, device="cuda", dtype=dtype, requires_grad=True)
    logits = torch.randn(tokens, module.gate_up_proj.shape[0], device="cuda")
    weights, index = logits.softmax(-1).topk(top_k, dim=-1)
    weights = weights.to(dtype).requires_grad_()
    grad = torch.randn(tokens, hidden, device="cuda", dtype=dtype)
    params = (x, module.gate_up_proj, module.down_proj, weights)

    def ours():
        return tt.moe_swiglu_experts(x, module.gate_up_proj, module.down_proj, index, weights)

    def theirs():
        return module(x, index, weights)

    def with_backward(forward):
        def run():
            torch.autograd.grad(forward(), params, grad)
        return run

    def no_grad(forward):
        def run():
            with torch.no_grad():
                return forward()
        return run

    def gradients(forward):
        def run():
            return (forward(), *torch.autograd.grad(forward(), params, grad))
        return run

    return {"forward": (no_grad(ours), no_grad(theirs)),
            "forward+backward": (with_backward(ours), with_backward(theirs)),
            "gradients": (gradients(ours), gradients(theirs))}


def _launch_name(kernel: str) -> str:
    """The :data:`LAUNCHES` name of a launched kernel: the padded weight gradients' Gluon kernel is its Triton
    form's (``moe_gemm.CONFIGS["padded_weight_grad"]["GLUON"]`` picks one)."""
    return kernel.replace("_gluon_kernel", "_kernel")


def _launch_times(run, calls: int, launches: tuple) -> dict[str, float]:
    """ms of each CONFIGS entry's launches in one call of ``run`` (forward + backward), the median of ``calls``;
    ``launches`` the kernels of a call, in order (:data:`LAUNCHES`)."""
    names = {name for name, _ in launches}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(trace))
        ours = sorted((k for k in kernel_intervals(trace) if _launch_name(k.name) in names), key=lambda k: k.start)
    launched = [_launch_name(k.name) for k in ours]
    expected = [name for name, _ in launches] * calls
    if launched != expected:
        raise RuntimeError(f"moe_swiglu_experts launched {launched[:len(launches)]}... in {calls} calls, not "
                           f"{[name for name, _ in launches]} each: LAUNCHES no longer matches moe_gemm")
    per_call: dict[str, list[float]] = {}
    for index in range(calls):
        sums: dict[str, float] = {}
        for kernel, (_, entry) in zip(ours[index * len(launches):], launches):
            sums[entry] = sums.get(entry, 0.0) + (kernel.end - kernel.start) / 1e3
        for entry, ms in sums.items():
            per_call.setdefault(entry, []).append(ms)
    return {entry: statistics.median(values) for entry, values in per_call.items()}


def _reference(cases) -> list[torch.Tensor]:
    """transformers' output and gradients, kept in host memory: at DeepSeek-V3's layer the weights' gradients are
    22.5 GB, and two sets of them beside the weights do not fit one GPU."""
    return [t.detach().cpu() for t in cases["gradients"][1]()]


def _relative_error(a: torch.Tensor, b: torch.Tensor, chunk: int = 1 << 26) -> float:
    """``|a - b| / |b|`` in fp32, ``b`` brought to ``a``'s device a chunk at a time (no full fp32 copies)."""
    diff = ref = 0.0
    for x, y in zip(a.reshape(-1).split(chunk), b.reshape(-1).split(chunk)):
        x, y = x.float(), y.to(x.device).float()
        diff += (x - y).square().sum().item()
        ref += y.square().sum().item()
    return diff ** 0.5 / max(ref ** 0.5, 1e-12)


def _gradients_agree(ours, reference) -> None:
    for index, (a, b) in enumerate(zip(ours, reference)):
        error = _relative_error(a, b)
        if not error <= GRAD_RTOL:
            what = "the output" if index == 0 else f"gradient {index} of (x, gate_up_proj, down_proj, weights)"
            raise AssertionError(f"{what} is {error:.2e} from transformers' experts (relative, > {GRAD_RTOL})")


def _candidates(kernel: str) -> list[dict]:
    return [dict(zip(("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages"), c)) for c in CANDIDATES[kernel]]


def per_kernel(args, kernels: list[str], settings: list[dict], defaults: dict, launches: tuple) -> list[dict]:
    """``--per-kernel``: each kernel's own time under each setting, the fastest per kernel, and the five fastest
    together against grouped_mm; one line per measurement, the rows for the JSON."""
    dtype, rows = torch.bfloat16, []
    for name in args.shapes.split(","):
        experts, top_k, hidden, inter = SHAPES[name]
        module = _experts(experts, top_k, hidden, inter, dtype)
        cases = _cases(module, args.tokens, top_k, dtype)
        reference = _reference(cases)

        def configure(kernel=None, setting=None, chosen=None):
            moe_gemm.CONFIGS.clear()
            moe_gemm.CONFIGS.update(copy.deepcopy(defaults))
            for entry, values in (chosen or {}).items():
                moe_gemm.CONFIGS[entry].update(values)
            if kernel is not None:
                moe_gemm.CONFIGS[kernel].update(setting)

        configure()
        base = _launch_times(cases["forward+backward"][0], args.calls, launches)
        print(f"{name}: defaults " + ", ".join(f"{k} {ms:.3f} ms" for k, ms in base.items()), flush=True)
        chosen = {}
        for kernel in kernels:
            best = (base[kernel], {})
            for setting in settings if settings != [{}] else _candidates(kernel):
                label = ",".join(f"{k}={v}" for k, v in setting.items()) or "defaults"
                configure(kernel, setting)
                try:
                    _gradients_agree(cases["gradients"][0](), reference)
                    ms = _launch_times(cases["forward+backward"][0], args.calls, launches)[kernel]
                except Exception as e:  # noqa: BLE001  a setting the GPU cannot run, or one that computes wrong
                    print(f"{name:14s} {kernel:12s} {label:48s} failed: {type(e).__name__}: {str(e)[:120]}")
                    rows.append({"shape": name, "kernel": kernel, "setting": setting,
                                 "error": f"{type(e).__name__}: {e}"})
                    continue
                rows.append({"shape": name, "kernel": kernel, "setting": setting, "ms": ms,
                             "vs_default": base[kernel] / ms})
                print(f"{name:14s} {kernel:12s} {label:48s} {ms:8.3f} ms  {base[kernel] / ms:5.2f}x the default",
                      flush=True)
                if ms < best[0]:
                    best = (ms, setting)
            chosen[kernel] = best[1]
        configure(chosen=chosen)
        together = {}
        for mode in ("forward", "forward+backward"):
            ours, theirs = cases[mode]
            t_ours, t_theirs = do_bench(ours), do_bench(theirs)
            together[mode] = {"fused_ms": t_ours, "grouped_mm_ms": t_theirs, "speedup": t_theirs / t_ours}
            print(f"{name:14s} {mode:17s} fastest settings together: {t_ours:.3f} ms, grouped_mm {t_theirs:.3f} ms, "
                  f"{t_theirs / t_ours:.2f}x", flush=True)
        configs = copy.deepcopy(moe_gemm.CONFIGS)
        rows.append({"shape": name, "defaults_ms": base, "chosen": configs, "together": together})
        print(f"{name} CONFIGS: {json.dumps(configs)}")
        configure()
        del module, cases, reference
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=output_file)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--kernels", default="",
                        help=f"comma-separated kernels the sweep sets, of {', '.join(moe_gemm.CONFIGS)} (default all; "
                             "with --per-kernel, those the weight-gradient way launches)")
    for flag, _ in KNOBS:
        parser.add_argument(f"--{flag.replace('_', '-')}", default="",
                            help="comma-separated values (default: each kernel's own)")
    parser.add_argument("--per-kernel", action="store_true",
                        help="tune each kernel on its own time under the profiler (see the module docstring)")
    parser.add_argument("--calls", type=int, default=5, help="--per-kernel: profiled calls per setting")
    parser.add_argument("--weight-grad", default=moe_gemm.WEIGHT_GRAD,
                        help=f"comma-separated, of {', '.join(moe_gemm.WEIGHT_GRADS)}: how the backward computes the "
                             "weight gradients (moe_gemm.WEIGHT_GRAD)")
    args = parser.parse_args()
    variants = args.weight_grad.split(",")
    if set(variants) - set(moe_gemm.WEIGHT_GRADS):
        parser.error(f"--weight-grad: unknown {', '.join(sorted(set(variants) - set(moe_gemm.WEIGHT_GRADS)))}; "
                     f"known: {', '.join(moe_gemm.WEIGHT_GRADS)}")
    if args.per_kernel and (len(variants) != 1 or variants[0] not in LAUNCHES):
        parser.error("--per-kernel times the Triton kernels, the weight gradients' too: pass --weight-grad "
                     f"{' or '.join(LAUNCHES)}")
    launched = [entry for _, entry in LAUNCHES[variants[0]]] if args.per_kernel else list(moe_gemm.CONFIGS)
    args.kernels = args.kernels or ",".join(dict.fromkeys(launched))
    for what, given, known in (("--shapes", args.shapes, SHAPES), ("--kernels", args.kernels, launched)):
        unknown = sorted(set(given.split(",")) - set(known))
        if unknown:
            parser.error(f"{what}: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    kernels = args.kernels.split(",")
    axes = [(key, [int(v) for v in getattr(args, flag).split(",")]) for flag, key in KNOBS if getattr(args, flag)]
    settings = [{}]
    for key, values in axes:
        settings = [{**s, key: v} for s in settings for v in values]
    defaults, default_weight_grad = copy.deepcopy(moe_gemm.CONFIGS), moe_gemm.WEIGHT_GRAD
    if args.per_kernel:
        moe_gemm.WEIGHT_GRAD = variants[0]
        rows = per_kernel(args, kernels, settings, defaults, LAUNCHES[variants[0]])
        moe_gemm.CONFIGS.clear()
        moe_gemm.CONFIGS.update(defaults)
        with open(args.out, "w") as f:
            json.dump({"environment": describe_environment(torch.device("cuda")), "dtype": "bf16",
                       "tokens": args.tokens, "defaults": defaults, "per_kernel": rows}, f, indent=1)
        return
    dtype, results = torch.bfloat16, []
    print(f"{'shape':14s} {'mode':17s} {'setting':40s} grouped_mm ms  TFLOP/s | fused ms  TFLOP/s | speedup")
    for name in args.shapes.split(","):
        experts, top_k, hidden, inter = SHAPES[name]
        module = _experts(experts, top_k, hidden, inter, dtype)
        cases = _cases(module, args.tokens, top_k, dtype)
        reference = None  # transformers' gradients, computed once a shape, when a setting is first checked
        flops = 6 * args.tokens * top_k * hidden * inter
        for mode in ("forward", "forward+backward"):
            ours, theirs = cases[mode]
            mode_flops = flops * (3 if mode == "forward+backward" else 1)
            t_theirs = do_bench(theirs)
            for variant, setting in [(v, s) for v in variants for s in settings]:
                moe_gemm.WEIGHT_GRAD = variant
                moe_gemm.CONFIGS.clear()
                moe_gemm.CONFIGS.update(copy.deepcopy(defaults))
                for kernel in kernels:
                    moe_gemm.CONFIGS[kernel].update(setting)
                label = ",".join(f"{k}={v}" for k, v in setting.items()) or "defaults"
                if len(variants) > 1:
                    label += f" wgrad={variant}"
                try:
                    if mode == "forward":
                        torch.testing.assert_close(ours(), theirs(), rtol=2e-2, atol=2e-2)
                    else:
                        reference = reference or _reference(cases)
                        _gradients_agree(cases["gradients"][0](), reference)
                    t_ours = do_bench(ours)
                except Exception as e:  # noqa: BLE001  a configuration the GPU cannot run: report, go on
                    print(f"{name:14s} {mode:17s} {label:40s} failed: {type(e).__name__}: {str(e)[:120]}")
                    results.append({"shape": name, "mode": mode, "setting": setting, "kernels": kernels,
                                    "weight_grad": variant, "error": f"{type(e).__name__}: {e}"})
                    continue
                results.append({"shape": name, "mode": mode, "setting": setting, "kernels": kernels,
                                "weight_grad": variant, "grouped_mm_ms": t_theirs, "fused_ms": t_ours,
                                "speedup": t_theirs / t_ours, "fused_tflops": mode_flops / t_ours / 1e9})
                print(f"{name:14s} {mode:17s} {label:40s} {t_theirs:13.3f} {mode_flops / t_theirs / 1e9:8.1f} | "
                      f"{t_ours:8.3f} {mode_flops / t_ours / 1e9:8.1f} | {t_theirs / t_ours:6.2f}x", flush=True)
        del module, cases, reference
        torch.cuda.empty_cache()
    moe_gemm.CONFIGS.clear()
    moe_gemm.CONFIGS.update(defaults)
    moe_gemm.WEIGHT_GRAD = default_weight_grad
    if len(settings) * len(variants) > 1:
        print(f"\nfastest setting of {', '.join(kernels)} per shape and mode:")
        best = {}
        for r in results:
            key = (r["shape"], r["mode"])
            if "fused_ms" in r and (key not in best or r["fused_ms"] < best[key]["fused_ms"]):
                best[key] = r
        for (name, mode), r in best.items():
            print(f"{name:14s} {mode:17s} {r['setting']} wgrad={r['weight_grad']}  {r['fused_ms']:.3f} ms, "
                  f"{r['speedup']:.2f}x grouped_mm")
    with open(args.out, "w") as f:
        json.dump({"environment": describe_environment(torch.device("cuda")), "dtype": "bf16", "tokens": args.tokens,
                   "defaults": defaults, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
