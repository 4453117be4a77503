"""Is a kernelized bf16 model less accurate than the same model in plain PyTorch bf16?

Both are compared with the fp32 model (the truth) per parameter gradient, ||g - g_fp32|| / ||g_fp32||;
a kernel set is fine when its errors are of the size of PyTorch bf16's own. Runs the kernelized model
twice: with the eager cached launcher (the default) and with Triton's JIT launch.

    python tools/accuracy_probe.py --family qwen2 --hidden 896 --seq 512
"""

import argparse
import copy

import torch
import transformers

from twinkle_fx import kernelize_model, scoped_registry, undo_kernelize
from twinkle_fx.builtin import BUILTIN_MODELS, use_builtin_kernels


def grads(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids)
    out.loss.backward()
    return out.loss.detach().float(), {n: p.grad.detach().float() for n, p in model.named_parameters() if p.grad is not None}


def rel(got, want):
    errs = {n: float((got[n] - want[n]).norm() / want[n].norm().clamp_min(1e-30)) for n in want}
    worst = max(errs, key=errs.get)
    return worst, errs[worst], sorted(errs.values())[len(errs) // 2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--family", default="qwen2")
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--fused-loss", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    f = BUILTIN_MODELS[a.family]
    cfg = transformers.AutoConfig.for_model(f.model_type, hidden_size=a.hidden, intermediate_size=4 * a.hidden,
                                            num_hidden_layers=2, num_attention_heads=a.hidden // 64,
                                            num_key_value_heads=2, head_dim=64, vocab_size=32000,
                                            pad_token_id=0, bos_token_id=1, eos_token_id=2)
    ref = transformers.AutoModelForCausalLM.from_config(cfg).cuda().float()
    ids = torch.randint(3, 32000, (2, a.seq), device="cuda")
    loss32, g32 = grads(ref, ids)
    model = copy.deepcopy(ref).bfloat16()
    loss16, g16 = grads(model, ids)
    print(f"{a.family}: fp32 loss {loss32:.5f}; torch bf16 loss {loss16:.5f}; worst/median grad rel err vs fp32: "
          "%s %.3e / %.3e" % rel(g16, g32))
    import twinkle_triton._library as lib
    for label, launcher in (("cached launcher", lib.cached_launcher), ("JIT launch", lambda k: k)):
        lib.cached_launcher = launcher
        with scoped_registry(inherit=False):
            use_builtin_kernels(devices=("cuda",), models=(a.family,), fused_loss=a.fused_loss)
            kernelize_model(model, mode="train", device="cuda")
            lossk, gk = grads(model, ids)
            undo_kernelize(model)
        print(f"  kernels ({label}): loss {lossk:.5f}; worst/median grad rel err vs fp32: %s %.3e / %.3e" % rel(gk, g32)
              + "; vs torch bf16: %s %.3e / %.3e" % rel(gk, g16))


if __name__ == "__main__":
    main()
