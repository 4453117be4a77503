"""The names a command line may give, known without importing torch: the command checks every
argument against them before it imports anything heavy. Each list mirrors the table the library
runs from (named beside it); tests/cli check that they agree.
"""

from __future__ import annotations

__all__ = ["BUILTIN_FAMILIES", "WORKLOADS", "MODEL_BACKENDS", "TWINKLE_BACKENDS", "GRAPH_REWRITES", "is_model_backend",
           "MATRIX_MODELS", "MATRIX_BACKENDS",
           "TINY_MATRIX_BACKENDS", "INFERENCE_BACKENDS", "MICRO_IMPLS", "MICRO_OPS", "MICRO_CASE_NAMES", "DTYPES"]

# twinkle_fx.builtin.BUILTIN_MODELS
BUILTIN_FAMILIES = ("qwen2", "llama", "mistral", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "olmo2", "granite",
                    "smollm3", "glm4", "deepseek_v3", "mixtral", "qwen3_moe", "gpt_oss", "ernie4_5", "ernie4_5_moe",
                    "cohere", "starcoder2")
# twinkle_fx.bench.workloads.WORKLOADS
WORKLOADS = ("qwen2", "qwen3", "llama", "mistral", "llama1b", "qwen3_1_7b", "llama3b", "gemma", "gemma2", "gemma3", "phi3", "olmo2", "granite",
             "smollm3", "glm4", "deepseek_v3", "mixtral", "qwen3_moe", "gpt_oss", "ernie4_5", "ernie4_5_moe", "cohere",
             "starcoder2", "qwen3_moe_8l")
# twinkle_fx.bench.backends.BACKENDS
MODEL_BACKENDS = ("eager", "inductor", "twinkle", "kernelize+twinkle", "kernelize", "kernelize+cudagraphs", "liger",
                  "inductor+cudagraphs", "twinkle+cudagraphs", "inductor+cudagraphs+cce", "twinkle+gemm-fusion",
                  "twinkle+cudagraphs+gemm-fusion", "twinkle-all-swaps", "twinkle+cudagraphs+fused-experts",
                  "liger+inductor")
# twinkle_fx.bench.backends._TWINKLE: the backends a "-<graph rewrite>" may follow
TWINKLE_BACKENDS = ("twinkle", "kernelize+twinkle", "twinkle+cudagraphs", "twinkle+gemm-fusion",
                    "twinkle+cudagraphs+gemm-fusion", "twinkle-all-swaps", "twinkle+cudagraphs+fused-experts")
# twinkle_fx.core.registry.GRAPH_REWRITES
GRAPH_REWRITES = ("causal_attention", "gqa_attention", "fused_projections", "decode_gemv", "decode_cache",
                  "residual_norm", "embedding_grad", "scaled_gradient", "matmul_sums", "topk")


def is_model_backend(name: str) -> bool:
    """One of :data:`MODEL_BACKENDS`, or a twinkle backend without a graph rewrite
    (``twinkle+cudagraphs-embedding_grad``).

    Examples:
        >>> is_model_backend("twinkle+cudagraphs-residual_norm"), is_model_backend("inductor-residual_norm")
        (True, False)
    """
    base, _, rewrite = name.rpartition("-")
    return name in MODEL_BACKENDS or (base in TWINKLE_BACKENDS and rewrite in GRAPH_REWRITES)
# twinkle_fx.bench.matrix: MATRIX_MODELS, MATRIX_BACKENDS, TINY_MATRIX_BACKENDS
MATRIX_MODELS = ("qwen2", "llama1b", "qwen3_1_7b", "llama3b", "qwen3_moe", "qwen3_moe_8l", "mixtral")
MATRIX_BACKENDS = ("inductor+cudagraphs", "inductor+cudagraphs+cce", "liger+inductor", "twinkle+cudagraphs",
                   "kernelize+cudagraphs")
TINY_MATRIX_BACKENDS = ("eager", "kernelize")
# twinkle_fx.bench.inference.INFERENCE_BACKENDS
INFERENCE_BACKENDS = ("eager", "kernelize", "kernelize+cudagraphs", "inductor", "inductor+cudagraphs", "twinkle",
                      "twinkle+cudagraphs")
# twinkle_fx.bench.micro.MICRO_IMPLS
MICRO_IMPLS = ("eager", "inductor", "twinkle", "liger", "cce")
# the ops of twinkle_fx.bench.micro.MICRO_CASES (an op with several cases, once)
MICRO_OPS = ("silu_and_mul", "silu_mul", "rms_norm", "add_rms_norm", "apply_rotary_pos_emb", "add_gelu", "mul_add",
             "fused_linear_cross_entropy", "gelu_mul", "rms_norm_fp32", "layer_norm", "apply_rotary_pos_emb_partial",
             "apply_rotary_pos_emb_deinterleave", "clamped_swiglu", "moe_swiglu_experts", "gqa_attention")
# the cases of twinkle_fx.bench.micro.MICRO_CASES named apart from their op (one shape of an op with several)
MICRO_CASE_NAMES = ("add_rms_norm llama1b", "add_rms_norm llama3b", "moe_swiglu_experts qwen3_moe",
                    "moe_swiglu_experts mixtral", "moe_swiglu_experts ernie4_5_moe", "moe_swiglu_experts deepseek_v3",
                    "gqa_attention llama1b", "gqa_attention llama3b")
# twinkle_fx.checklist.checklist._DTYPE_NAMES (bench --dtype takes the same)
DTYPES = ("fp32", "bf16", "fp16")
