"""The fused MoE expert kernels against transformers' grouped_mm experts at two model shapes (GPU only).

Each row times ``twinkle_triton.moe_swiglu_experts`` (the grouped GEMMs of ``twinkle_triton.moe_gemm``)
and the same weights in transformers' ``Qwen3MoeExperts`` with ``config._experts_implementation =
"grouped_mm"`` (``torch._grouped_mm`` over the tokens sorted and copied by expert, the SwiGLU and the
weighted sum as separate kernels), forward alone (no grad) and forward + backward (gradients of the
tokens, both weights and the routing weights), in bf16 with ``triton.testing.do_bench``. Routing is a
softmax router's top-k over random logits (about balanced). TFLOP/s counts the GEMMs' multiply-adds
(forward 6 * T * k * H * I, forward + backward 3x that).

``--block-m``, ``--block-n``, ``--block-k``, ``--warps`` and ``--stages`` sweep the launch
configuration (``twinkle_triton.moe_gemm.CONFIGS``) of the kernels ``--kernels`` names (default all
five: ``gate_up`` and ``down`` run in the forward, ``grad_act``, ``grad_input`` and ``weight_grad``
in the backward; for ``weight_grad`` BLOCK_M x BLOCK_N is the weight tile and BLOCK_K the rows a step);
the others keep their configuration. A configuration the GPU cannot run (shared memory) is reported
and skipped.

    python tools/moe_gemm_sweep.py --out moe.json
    python tools/moe_gemm_sweep.py --out moe-fwd.json --kernels gate_up --block-m 64,128 --block-n 64,128 --warps 4,8
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json

import torch
import twinkle_triton as tt
from triton.testing import do_bench

from twinkle_fx.core.outputs import output_file
from twinkle_fx.measure.environment import describe_environment

moe_gemm = importlib.import_module("twinkle_triton.moe_gemm")

# shape name -> (experts, top-k, hidden, intermediate)
SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768), "mixtral-8x7b": (8, 2, 4096, 14336)}
KNOBS = (("block_m", "BLOCK_M"), ("block_n", "BLOCK_N"), ("block_k", "BLOCK_K"), ("warps", "num_warps"),
         ("stages", "num_stages"))


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

    return {"forward": (no_grad(ours), no_grad(theirs)),
            "forward+backward": (with_backward(ours), with_backward(theirs))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=output_file)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--kernels", default=",".join(moe_gemm.CONFIGS),
                        help=f"comma-separated kernels the sweep sets, of {', '.join(moe_gemm.CONFIGS)}")
    for flag, _ in KNOBS:
        parser.add_argument(f"--{flag.replace('_', '-')}", default="",
                            help="comma-separated values (default: each kernel's own)")
    args = parser.parse_args()
    for what, given, known in (("--shapes", args.shapes, SHAPES), ("--kernels", args.kernels, moe_gemm.CONFIGS)):
        unknown = sorted(set(given.split(",")) - set(known))
        if unknown:
            parser.error(f"{what}: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    kernels = args.kernels.split(",")
    axes = [(key, [int(v) for v in getattr(args, flag).split(",")]) for flag, key in KNOBS if getattr(args, flag)]
    settings = [{}]
    for key, values in axes:
        settings = [{**s, key: v} for s in settings for v in values]
    defaults = copy.deepcopy(moe_gemm.CONFIGS)
    dtype, results = torch.bfloat16, []
    print(f"{'shape':14s} {'mode':17s} {'setting':40s} grouped_mm ms  TFLOP/s | fused ms  TFLOP/s | speedup")
    for name in args.shapes.split(","):
        experts, top_k, hidden, inter = SHAPES[name]
        module = _experts(experts, top_k, hidden, inter, dtype)
        cases = _cases(module, args.tokens, top_k, dtype)
        flops = 6 * args.tokens * top_k * hidden * inter
        for mode, (ours, theirs) in cases.items():
            mode_flops = flops * (3 if mode == "forward+backward" else 1)
            t_theirs = do_bench(theirs)
            for setting in settings:
                moe_gemm.CONFIGS.clear()
                moe_gemm.CONFIGS.update(copy.deepcopy(defaults))
                for kernel in kernels:
                    moe_gemm.CONFIGS[kernel].update(setting)
                label = ",".join(f"{k}={v}" for k, v in setting.items()) or "defaults"
                try:
                    if mode == "forward":
                        torch.testing.assert_close(ours(), theirs(), rtol=2e-2, atol=2e-2)
                    t_ours = do_bench(ours)
                except Exception as e:  # noqa: BLE001  a configuration the GPU cannot run: report, go on
                    print(f"{name:14s} {mode:17s} {label:40s} failed: {type(e).__name__}: {str(e)[:120]}")
                    results.append({"shape": name, "mode": mode, "setting": setting, "kernels": kernels,
                                    "error": f"{type(e).__name__}: {e}"})
                    continue
                results.append({"shape": name, "mode": mode, "setting": setting, "kernels": kernels,
                                "grouped_mm_ms": t_theirs, "fused_ms": t_ours, "speedup": t_theirs / t_ours,
                                "fused_tflops": mode_flops / t_ours / 1e9})
                print(f"{name:14s} {mode:17s} {label:40s} {t_theirs:13.3f} {mode_flops / t_theirs / 1e9:8.1f} | "
                      f"{t_ours:8.3f} {mode_flops / t_ours / 1e9:8.1f} | {t_theirs / t_ours:6.2f}x", flush=True)
        del module, cases
        torch.cuda.empty_cache()
    moe_gemm.CONFIGS.clear()
    moe_gemm.CONFIGS.update(defaults)
    if len(settings) > 1:
        print(f"\nfastest setting of {', '.join(kernels)} per shape and mode:")
        best = {}
        for r in results:
            key = (r["shape"], r["mode"])
            if "fused_ms" in r and (key not in best or r["fused_ms"] < best[key]["fused_ms"]):
                best[key] = r
        for (name, mode), r in best.items():
            print(f"{name:14s} {mode:17s} {r['setting']}  {r['fused_ms']:.3f} ms, {r['speedup']:.2f}x grouped_mm")
    with open(args.out, "w") as f:
        json.dump({"environment": describe_environment(torch.device("cuda")), "dtype": "bf16", "tokens": args.tokens,
                   "defaults": defaults, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
