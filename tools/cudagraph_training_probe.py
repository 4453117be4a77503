"""Why ``mode="reduce-overhead"`` failed in training, shown on the tiny Qwen2: for plain Inductor and
for ``twinkle_fx.compile`` (built-in kernels, fused-loss head), a few SGD steps

* ``keep-grads``: without resetting ``.grad`` between steps (what this probe and the GPU test used to
  do): the second step's backward raises "accessing tensor output of CUDAGraphs that has been
  overwritten by a subsequent run" (torch 2.11; torch >= 2.13 says "accessing gradient tensor output");
* ``zero-grad``: ``optimizer.zero_grad()`` (``set_to_none=True``) before each step: trains, losses
  equal to eager's;

and prints, per run, every graph's CUDA-graph status, Inductor's skip messages and what the
CUDA-graph tree recorded.

Why: the first time a parameter gets a gradient, autograd's AccumulateGrad adopts the backward
graph's output tensor as ``.grad`` (no copy). Under CUDA graphs that tensor lives in the graph's
memory pool. The next call of the compiled model starts a new cudagraph-trees generation
(``torch._dynamo`` bumps it at every call; ``cudagraph_mark_step_begin()`` bumps it too) and marks
every output of the previous generation as overwritten, the old ``.grad`` included; the next backward
then reads that ``.grad`` to add to it, and raises. The stack trace in the message is the forward
node whose gradient it was (``self.embed_tokens(input_ids)``: the embedding weight's gradient),
which made it look like a saved activation. Fixes: set ``.grad`` to None before each backward (the
optimizer's default ``zero_grad``), or, to accumulate gradients over micro-batches, give every
parameter a ``.grad`` of its own before the first step and zero it in place
(``zero_grad(set_to_none=False)``). See pytorch/pytorch#169545.

    python tools/cudagraph_training_probe.py
"""

import sys
import traceback

import torch

sys.path.insert(0, "tests")
sys.path.insert(0, "tests/compile")

from tiny_models import DEVICE, tiny  # noqa: E402
import twinkle_fx  # noqa: E402
from twinkle_fx import scoped_registry  # noqa: E402
from twinkle_fx.builtin import use_builtin_kernels  # noqa: E402
from twinkle_fx.compiler.inner.inductor_options import collect_cudagraph_status, cudagraph_tree_summary  # noqa: E402

STEPS = 4


def losses(run, model, batches, *, zero_grad: bool) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    out = []
    for ids in batches:
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        loss = run(input_ids=ids, labels=ids).loss
        loss.backward()
        out.append(loss.item())
        optimizer.step()
    return out


def run(name: str, compile_fn, *, zero_grad: bool, batches, expected) -> None:
    print(f"===== {name}, {'zero-grad' if zero_grad else 'keep-grads'}", flush=True)
    torch._dynamo.reset()
    with scoped_registry():
        use_builtin_kernels(devices=(DEVICE,), models=("qwen2",))
        model = tiny("qwen2")
        compiled = compile_fn(model)
        with collect_cudagraph_status() as cudagraphs:
            try:
                got = losses(compiled, model, batches, zero_grad=zero_grad)
                print("losses      ", " ".join(f"{x:.6f}" for x in got))
                print("eager losses", " ".join(f"{x:.6f}" for x in expected))
                print("max |diff| =", max(abs(a - b) for a, b in zip(got, expected)))
            except Exception:  # noqa: BLE001 - a probe: print everything, go on with the next run
                print("RAISED:")
                traceback.print_exc(file=sys.stdout)
            print("  tree:", cudagraph_tree_summary() if DEVICE == "cuda" else "cpu: no CUDA graphs")
        for status in cudagraphs.graphs:
            print("  ", status)
        print("  summary:", cudagraphs.summary(), flush=True)


if __name__ == "__main__":
    print("torch", torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    torch.manual_seed(1)
    batches = [torch.randint(0, 128, (2, 16), device=DEVICE) for _ in range(STEPS)]
    with scoped_registry():
        use_builtin_kernels(devices=(DEVICE,), models=("qwen2",))
        eager = tiny("qwen2")
        expected = losses(eager, eager, batches, zero_grad=True)
    setups = {
        "inductor": lambda m: torch.compile(m, mode="reduce-overhead"),
        "twinkle_fx.compile": lambda m: twinkle_fx.compile(m, mode="reduce-overhead"),
    }
    for name, compile_fn in setups.items():
        for zero_grad in (False, True):
            run(name, compile_fn, zero_grad=zero_grad, batches=batches, expected=expected)
