"""torch.compile(model, backend="twinkle") on a tiny Qwen2: what was swapped, and the numerics.

The built-in kernels (twinkle_triton RMSNorm, SwiGLU MLP, rotary; the Triton interpreter on CPU)
are registered; the backend finds their regions in Dynamo's graph, a training step runs compiled,
and its logits, loss and every parameter gradient are compared with eager.

Run: python examples/compile_qwen2.py [--compiler inductor|aot_eager|eager]
"""

import argparse
import logging

import torch
from _common import DEVICE, report_close, tiny_qwen2

import twinkle_fx
from twinkle_fx.builtin import use_builtin_kernels


def train_step(model, compiled_or_model, input_ids):
    out = compiled_or_model(input_ids, labels=input_ids)
    grads = torch.autograd.grad(out.loss, list(model.parameters()))
    return out, grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compiler", default="inductor", choices=("inductor", "aot_eager", "eager"))
    args = parser.parse_args()
    logging.getLogger("twinkle_fx").setLevel(logging.WARNING)  # the report below says it all

    # fused_loss=False: this example compares the logits, which the fused-loss head never builds (and
    # that head needs kernelize_model before torch.compile anyway: see the README)
    use_builtin_kernels(devices=(DEVICE,), models=("qwen2",), fused_loss=False)
    model = tiny_qwen2()
    input_ids = torch.randint(0, model.config.vocab_size, (2, 16), device=DEVICE)

    # What the backend does with this model, without running the inner compiler.
    print(twinkle_fx.explain(model, input_ids, labels=input_ids).summary())

    compiled = torch.compile(model, backend="twinkle", options={"compiler": args.compiler})
    out, grads = train_step(model, compiled, input_ids)
    want, want_grads = train_step(model, model, input_ids)
    report_close("logits", out.logits, want.logits)
    report_close("loss", out.loss, want.loss)
    worst = max(range(len(grads)), key=lambda i: (grads[i] - want_grads[i]).abs().max().item())
    name = [n for n, _ in model.named_parameters()][worst]
    report_close(f"gradients ({len(grads)} parameters, worst: {name})", grads[worst], want_grads[worst])


if __name__ == "__main__":
    main()
