"""Shared by the example scripts: paths, device, the tiny Qwen2 they run on, the Triton interpreter on CPU."""

import logging
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    # No GPU: run the Triton kernels through the interpreter (must be set before triton.jit runs).
    os.environ.setdefault("TRITON_INTERPRET", "1")
# TRITON_INTERPRET=1 set by the caller means the CPU even where a GPU exists: the interpreter runs
# kernels on host memory only (on CUDA tensors it fails deep inside Triton)
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

EXAMPLES = Path(__file__).resolve().parent
LOCAL_REPO = EXAMPLES / "local_repo"  # stands for "/path/to/local/repo" in the documentation
sys.path.insert(0, str(EXAMPLES))  # makes my_pkg importable
DEVICE = "cpu" if INTERPRETED else "cuda"

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
logging.getLogger("twinkle_fx").setLevel(logging.INFO)


def tiny_qwen2(seed: int = 0, dtype: torch.dtype = torch.float32):
    """A 2-layer Qwen2ForCausalLM (random weights) small enough for the Triton interpreter."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=128, tie_word_embeddings=True,
    )
    config._attn_implementation = "eager"
    return Qwen2ForCausalLM(config).to(device=DEVICE, dtype=dtype)


def report_close(name: str, ours: torch.Tensor, reference: torch.Tensor, atol: float = 1e-4, rtol: float = 1e-4) -> None:
    error = (ours.float() - reference.float()).abs().max().item()
    ok = torch.allclose(ours.float(), reference.float(), atol=atol, rtol=rtol)
    print(f"{name}: max abs error {error:.2e} -> {'match' if ok else 'MISMATCH'}")
    if not ok:
        raise SystemExit(f"{name} differs from the reference")
