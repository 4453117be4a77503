"""The main demo: a Qwen2 model with the built-in Triton kernels, eagerly and under torch.compile.

    python examples/demo.py            # CPU (Triton interpreter) or GPU, whichever is here

It trains a few steps with and without kernels from the same seed and prints the losses side by
side, then shows what was swapped.
"""

import time

import torch
from _common import DEVICE, tiny_qwen2

from twinkle_fx import kernelize_model, undo_kernelize
from twinkle_fx.builtin import use_builtin_kernels
from twinkle_fx.eager.layers import swapped_forward
from twinkle_fx.function import patched_functions

STEPS = 3


def train(model, input_ids):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = model(input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main():
    print(f"device: {DEVICE}  torch {torch.__version__}")
    use_builtin_kernels(devices=(DEVICE,))
    input_ids = torch.randint(0, 256, (2, 32), device=DEVICE, generator=None)

    reference = train(tiny_qwen2(seed=0), input_ids)

    model = kernelize_model(tiny_qwen2(seed=0), mode="train", use_fallback=False)
    swapped = sum(swapped_forward(m) is not None for m in model.modules())
    print(f"kernelize_model swapped {swapped} layers and patched {len(patched_functions())} functions")
    start = time.perf_counter()
    kernelized = train(model, input_ids)
    print(f"eager kernelize_model: {STEPS} steps in {time.perf_counter() - start:.1f}s")
    for step, (a, b) in enumerate(zip(reference, kernelized)):
        print(f"step {step}: loss reference {a:.6f}  kernels {b:.6f}  diff {abs(a - b):.2e}")
    undo_kernelize(model)
    worst = max(abs(a - b) for a, b in zip(reference, kernelized))
    if worst > 1e-4:
        raise SystemExit(f"losses differ by {worst:.2e}")
    print("losses match")


if __name__ == "__main__":
    main()
