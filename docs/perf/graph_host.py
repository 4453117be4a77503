"""Host microseconds per decoder layer, forward and backward: HF eager, kernelize_model, and
kernelize_model(cuda_graphs=True), on the Qwen2-0.5B shape (bf16) with few tokens (1 x 64), so the
device never holds the host back (a diagnostic, not a benchmark). The forward is one call of the
decoder stack (``model.model``) and the backward one ``backward()`` of its summed output, each
divided by the layer count; best of 5 x 20 calls after 3 warm-up calls (recording included).

Run from the repository root on a GPU machine: PYTHONPATH=.:kernels python docs/perf/graph_host.py
"""

import time

import torch
import transformers

from twinkle_fx import kernelize_model, scoped_registry, undo_kernelize
from twinkle_fx.builtin import use_builtin_kernels
from twinkle_fx.eager.graphs import graph_status

LAYERS = 24


def build():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=LAYERS,
                                      num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                      tie_word_embeddings=True, use_cache=False, attn_implementation="sdpa")
    with torch.device("cuda"):
        return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).train()


def best_us(fn, calls=20, rounds=5):
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
        torch.cuda.synchronize()
    return best * 1e6 / LAYERS


def measure(name, model):
    ids = torch.randint(0, 151936, (1, 64), device="cuda")
    for _ in range(3):  # warm-up; with CUDA graphs: eager, record, replay
        model.model(input_ids=ids).last_hidden_state.float().sum().backward()
    forward = best_us(lambda: model.model(input_ids=ids))
    outs = []

    def backward():
        outs.pop().backward()

    def run_backward():
        for _ in range(20):
            outs.append(model.model(input_ids=ids).last_hidden_state.float().sum())
            torch.cuda.synchronize()
            start = time.perf_counter()
            backward()
            run_backward.total += time.perf_counter() - start
        torch.cuda.synchronize()

    best = float("inf")
    for _ in range(5):
        run_backward.total = 0.0
        run_backward()
        best = min(best, run_backward.total / 20)
    print(f"{name:34s} forward {forward:7.1f} us/layer   backward {best * 1e6 / LAYERS:7.1f} us/layer", flush=True)
    status = graph_status(model)
    if status is not None:
        print("  " + str(status).replace("\n", "\n  "))


def main():
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}")
    measure("HF eager", build())
    for graphs in (False, True):
        with scoped_registry():
            use_builtin_kernels(models=("qwen2",), decoder_layers=True)
            model = build()
            kernelize_model(model, mode="train", cuda_graphs=graphs)
            measure("kernelize" + (" + CUDA graphs" if graphs else ""), model)
            undo_kernelize(model)


if __name__ == "__main__":
    main()
