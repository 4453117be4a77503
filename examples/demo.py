"""The main demo: a Qwen2 model with the built-in Triton kernels, eagerly and under torch.compile.

    python examples/demo.py            # CPU (Triton interpreter) or GPU, whichever is here

It trains a few steps without kernels, with ``kernelize_model`` and with ``twinkle_fx.compile`` (the
fused-loss head, then ``backend="twinkle"``), all from the same seeded weights and inputs, prints the
losses side by side (the same every run) and what each path swapped.
"""

import time

import torch
from _common import DEVICE, tiny_qwen2

import twinkle_fx
from twinkle_fx import kernelize_model, undo_kernelize
from twinkle_fx.builtin import use_builtin_kernels
from twinkle_fx.compiler import collect_reports
from twinkle_fx.core.swaps import swapped_forward
from twinkle_fx.function import patched_functions

STEPS = 3
# Inductor compiles C++ for the CPU, which takes minutes on a small machine; aot_eager shows the same rewrite.
COMPILER = "inductor" if DEVICE == "cuda" else "aot_eager"


def train(model, input_ids):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    start = time.perf_counter()
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = model(input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, time.perf_counter() - start


def main():
    print(f"device: {DEVICE}  torch {torch.__version__}  twinkle_fx {twinkle_fx.__version__}")
    use_builtin_kernels(devices=(DEVICE,), models=("qwen2",))  # the model's family: RMSNorm, MLP, rotary, head
    input_ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0)).to(DEVICE)

    runs = {"reference": train(tiny_qwen2(seed=0), input_ids)}

    model = kernelize_model(tiny_qwen2(seed=0), mode="train", use_fallback=False)
    swapped = sum(swapped_forward(m) is not None for m in model.modules())
    patched = len(patched_functions())
    print(f"kernelize_model swapped {swapped} layers and patched {patched} function{'' if patched == 1 else 's'}")
    runs["kernelize_model"] = train(model, input_ids)
    undo_kernelize(model)

    # the fused-loss head goes on the model itself, the other kernels into the graph torch.compile captures
    compiled = twinkle_fx.compile(tiny_qwen2(seed=0), options={"compiler": COMPILER})
    with collect_reports() as report:  # filled when the first call compiles
        runs[f"twinkle ({COMPILER})"] = train(compiled, input_ids)
    print(report.summary())

    reference = runs["reference"][0]
    worst = 0.0
    for name, (losses, seconds) in runs.items():
        diffs = [abs(a - b) for a, b in zip(losses, reference)]
        worst = max(worst, *diffs)
        print(f"{name:>22}: losses {', '.join(f'{x:.6f}' for x in losses)}  max diff {max(diffs):.1e}  ({seconds:.1f}s)")
    if worst > 1e-4:
        raise SystemExit(f"losses differ by {worst:.2e}")
    print("losses match")


if __name__ == "__main__":
    main()
