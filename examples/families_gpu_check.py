"""Reference-size forward + backward per built-in family on a GPU: kernelized vs the unswapped model.

For each family of ``twinkle_fx.builtin.BUILTIN_MODELS``: a random 2-layer model at realistic layer
sizes (hidden 2048, heads of 128, 1024 tokens x batch 2, 32000-token vocabulary), bf16, one training
step with labels eagerly and one with ``kernelize_model`` (the built-in kernels), then the loss
difference, the worst relative gradient error (‖g - g_ref‖ / ‖g_ref‖ per parameter), what was
swapped, and ms per step (median of 5 after 2 warm-up). Writes one JSON line per family to
``--out`` and prints a table.

    python examples/families_gpu_check.py --out /tmp/families.jsonl             # every family
    python examples/families_gpu_check.py --families gemma phi3 --seq 512
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback

import torch
import transformers

from twinkle_fx import kernelize_model, scoped_registry, undo_kernelize
from twinkle_fx.builtin import BUILTIN_MODELS, use_builtin_kernels
from twinkle_fx.eager.layers import swapped_forward

SIZES = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=2, num_attention_heads=16,
             num_key_value_heads=4, head_dim=128, vocab_size=32000, max_position_embeddings=4096,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)
OVERRIDES = {
    "phi3": dict(partial_rotary_factor=0.5),
    "deepseek_v3": dict(q_lora_rank=768, kv_lora_rank=256, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=128,
                        head_dim=64, num_key_value_heads=16, n_routed_experts=8, num_experts_per_tok=2,
                        moe_intermediate_size=1024, first_k_dense_replace=1, n_group=1, topk_group=1),
    "ernie4_5_moe": dict(moe_num_experts=8, moe_k=2, moe_intermediate_size=1024, moe_num_shared_experts=1,
                         moe_layer_start_index=1),
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2),
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=1024, mlp_only_layers=[0]),
    "gpt_oss": dict(num_local_experts=8, num_experts_per_tok=2),
    "starcoder2": dict(use_bias=True),
}


def build(family: str, device: str) -> torch.nn.Module:
    config = transformers.AutoConfig.for_model(BUILTIN_MODELS[family].model_type,
                                               **{**SIZES, **OVERRIDES.get(family, {})})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).to(device, torch.bfloat16).train()


def step(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.detach().float(), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}


def timed(model, ids, device) -> float:
    times = []
    for i in range(7):
        torch.cuda.synchronize(device) if device == "cuda" else None
        start = time.perf_counter()
        step(model, ids)
        torch.cuda.synchronize(device) if device == "cuda" else None
        if i >= 2:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def check(family: str, device: str, batch: int, seq: int) -> dict:
    with scoped_registry(inherit=False):
        use_builtin_kernels(devices=(device,), models=(family,))
        model = build(family, device)
        ids = torch.randint(3, SIZES["vocab_size"], (batch, seq), device=device)
        ref_loss, ref_grads = step(model, ids)
        ref_ms = timed(model, ids, device)
        kernelize_model(model, mode="train", use_fallback=False)
        swapped = sorted({f"{type(m).__name__} -> {swapped_forward(m).kernel_name}"
                          for m in model.modules() if swapped_forward(m)})
        loss, grads = step(model, ids)
        ms = timed(model, ids, device)
        undo_kernelize(model)
    rel = {n: ((grads[n] - g).norm() / g.norm().clamp_min(1e-30)).item() for n, g in ref_grads.items()}
    worst = max(rel, key=rel.get)
    return dict(family=family, loss=ref_loss.item(), loss_diff=abs(loss - ref_loss).item(),
                worst_grad_rel_err=rel[worst], worst_grad=worst, eager_ms=ref_ms, kernelized_ms=ms, swapped=swapped,
                experts_implementation=getattr(model.config, "_experts_implementation", None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="*", default=list(BUILTIN_MODELS))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None, help="JSON lines file")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device "
          f"{torch.cuda.get_device_name() if args.device == 'cuda' else args.device}, bf16, "
          f"batch {args.batch} x {args.seq}")
    print(f"{'family':<12} {'loss':>8} {'|dloss|':>9} {'grad rel err':>12} {'eager ms':>9} {'kernel ms':>9}  swapped")
    failed = 0
    for family in args.families:
        try:
            row = check(family, args.device, args.batch, args.seq)
        except Exception as e:  # one family failing must not hide the others; the error is printed in full
            failed += 1
            row = dict(family=family, error=repr(e), traceback=traceback.format_exc())
            print(f"{family:<12} FAILED {e!r}")
        else:
            print(f"{family:<12} {row['loss']:8.4f} {row['loss_diff']:9.2e} {row['worst_grad_rel_err']:12.2e} "
                  f"{row['eager_ms']:9.2f} {row['kernelized_ms']:9.2f}  {', '.join(row['swapped'])}")
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
        torch.cuda.empty_cache() if args.device == "cuda" else None
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
