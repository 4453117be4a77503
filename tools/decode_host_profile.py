"""Where the host time of one eager decode step goes (issue 14): Qwen2-0.5B shape, bf16, 32 x 1 with a
StaticCache of 1024 + 64, plain and kernelized (built-in kernels), 20 steps each under cProfile after
5 warm-up steps; prints the wall ms per step and the top functions by own time.
Run on the GPU machine from the repository root: PYTHONPATH=.:kernels python3 tools/decode_host_profile.py"""
import cProfile
import io
import pstats
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, StaticCache

import twinkle_fx
from twinkle_fx.builtin import use_builtin_kernels

config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
                     num_hidden_layers=24, vocab_size=151936, tie_word_embeddings=True, use_cache=True)
torch.manual_seed(0)
model = Qwen2ForCausalLM(config).to("cuda", torch.bfloat16).eval()
ids = torch.randint(0, 151936, (32, 1), device="cuda")
context = torch.randint(0, 151936, (32, 1024), device="cuda")


def decode_steps(label: str) -> None:
    cache = StaticCache(config=config, max_cache_len=1024 + 64)
    position = torch.tensor([1024], device="cuda")
    with torch.no_grad():
        model(input_ids=context, past_key_values=cache, use_cache=True, logits_to_keep=1)

        def step():
            return model(input_ids=ids, past_key_values=cache, cache_position=position, use_cache=True,
                         logits_to_keep=1).logits

        for _ in range(5):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            step()
        torch.cuda.synchronize()
        print(f"{label}: {(time.perf_counter() - start) / 20 * 1e3:.2f} ms/step", flush=True)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(20):
            step()
        torch.cuda.synchronize()
        profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(22)
    print(out.getvalue()[-5200:], flush=True)


decode_steps("eager")
with twinkle_fx.scoped_registry():
    use_builtin_kernels(devices=("cuda",), models=("qwen2",))
    twinkle_fx.kernelize_model(model, mode="inference", device="cuda")
    decode_steps("kernelize")
    twinkle_fx.undo_kernelize(model)
