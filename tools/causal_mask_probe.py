"""Why (or whether) the attention pass turns the reference workload's causal mask into is_causal=True.

Builds the harness's qwen2 workload (2 of its layers) on the device in bf16, compiles one training step
the way the harness's twinkle+cudagraphs row does, and prints the SDPA calls of the Dynamo graph before
the rewrite, the graph inputs the mask is computed from, and the pass's outcomes.

    python tools/causal_mask_probe.py [--layers 2] [--inference]
"""

from __future__ import annotations

import argparse
import dataclasses
import re

import torch

import twinkle_fx
from twinkle_fx.bench.workloads import build_model, get_workload, make_batch
from twinkle_fx.builtin import use_builtin_kernels
from twinkle_fx.compile import collect_reports
from twinkle_fx.compile.rewrites import attention
from twinkle_fx.testing import record_graphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--inference", action="store_true", help="a no-grad prefill instead of a training step")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = get_workload("qwen2")
    workload = dataclasses.replace(base, config={**base.config, "num_hidden_layers": args.layers})
    seen = []
    original = attention.constant_causal

    def spy(gm, mask):
        result = original(gm, mask)
        seen.append((mask.name, result))
        return result

    attention.constant_causal = spy
    with twinkle_fx.scoped_registry():
        use_builtin_kernels(devices=(device.type,), models=("qwen2",))
        model = build_model(workload, tiny=device.type == "cpu", dtype=torch.bfloat16, device=device, seed=0)
        ids, labels = make_batch(workload, tiny=device.type == "cpu", batch=2, seq=256, device=device, seed=0)
        with record_graphs() as graphs, collect_reports() as report:
            if args.inference:
                model.eval()
                with torch.no_grad():
                    torch.compile(model, backend="twinkle", dynamic=False)(input_ids=ids, use_cache=False, logits_to_keep=1)
            else:
                twinkle_fx.compile(model, device=device.type)(input_ids=ids, labels=labels).loss.backward()
    for i, before in enumerate(graphs.before):
        print(f"graph {i}: SDPA calls before the rewrite:")
        for line in before.splitlines():
            if "scaled_dot_product_attention(" in line:
                print("   ", re.sub(r";.*", "", line.strip())[:240])
    print("constant_causal:", seen or "never called (no SDPA with a mask node)")
    print("attention outcomes:", [str(r) for r in report.regions if "scaled_dot_product" in r.target] or "none")


if __name__ == "__main__":
    main()
