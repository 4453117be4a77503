"""Why does ``mode="reduce-overhead"`` fail in training? Runs the tiny Qwen2 training loop of
``tests/compile/test_compile_speed.py::test_reduce_overhead_captures_the_tiny_model_with_twinkle_kernels``
under three setups (plain Inductor; backend="twinkle" without kernels; with the built-in kernels)
and prints, per setup, the CUDA-graph status of every compiled graph, Inductor's skip messages,
and the full traceback of anything that raised.

    python tools/cudagraph_training_probe.py
"""

import sys
import traceback

import torch

sys.path.insert(0, "tests")
sys.path.insert(0, "tests/compile")

from tiny_models import DEVICE, register_qwen2_kernels, tiny  # noqa: E402
from twinkle_fx import scoped_registry  # noqa: E402
from twinkle_fx.compile.inductor_options import collect_cudagraph_status  # noqa: E402


def run(name: str, backend: str, kernels: bool) -> None:
    print(f"===== {name}", flush=True)
    torch._dynamo.reset()
    with scoped_registry():
        if kernels:
            register_qwen2_kernels()
        model = tiny("qwen2")
        ids = torch.randint(0, 128, (2, 16), device=DEVICE)
        compiled = torch.compile(model, backend=backend, mode="reduce-overhead")
        step = "?"
        with collect_cudagraph_status() as cudagraphs:
            try:
                for step in range(3):
                    out = compiled(input_ids=ids, labels=ids)
                    out.loss.backward()
                expected = model(input_ids=ids, labels=ids)
                step = "compare"
                err = (out.logits.float() - expected.logits.float()).abs().max().item()
                print(f"max |logits - eager| = {err:.3g}")
            except Exception:  # noqa: BLE001 - a probe: print everything, go on with the next setup
                print(f"RAISED at step {step}:")
                traceback.print_exc(file=sys.stdout)
        for status in cudagraphs.graphs:
            print("  ", status)
        print("  summary:", cudagraphs.summary())
        for skip in dict.fromkeys(cudagraphs.skips):
            print("   skip:", skip)


if __name__ == "__main__":
    print("torch", torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    run("inductor, reduce-overhead, training", "inductor", kernels=False)
    run("twinkle (no kernels), reduce-overhead, training", "twinkle", kernels=False)
    run("twinkle + qwen2 kernels, reduce-overhead, training", "twinkle", kernels=True)
