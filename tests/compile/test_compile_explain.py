"""``twinkle_fx.explain`` and ``python -m twinkle_fx explain``."""

import torch
from compile_kernels import GatedMLP, SiluAndMul, SiluAndMulKernel

import twinkle_fx
from twinkle_fx import register_external_layer, register_layer_kernel
from twinkle_fx.__main__ import main


def test_explain_reports_swaps_times_and_the_diff():
    register_layer_kernel(kernel_name="SiluAndMul", layer=SiluAndMulKernel, device="cpu")
    register_external_layer(SiluAndMul, "SiluAndMul")
    report = twinkle_fx.explain(GatedMLP(), torch.randn(3, 8))
    text = str(report)
    assert text.startswith("twinkle: 1 graph(s), 0 graph break(s), 1 region(s) swapped, 0 kept; passes took ")
    assert "swapped 1 x layer SiluAndMul -> SiluAndMul: SiluAndMul [cpu, any] from impl SiluAndMulKernel (custom op call)  [act]" in text
    assert "+    layer_silu_and_mul = twinkle_layer_SiluAndMul(linear);  linear = None" in text
    assert list(report.graphs[0].pass_ms) == ["graph_breaks", "layer_regions", "function_patterns", "function_calls",
                                              "compiled_root", "foreign_forwards", "attention", "decode_gemv", "residual_norm",
                                              "decode_cache", "gemm_fusion"]


def test_a_container_root_reports_the_paths_under_it():
    """A root whose forward is torch's own (nn.Sequential, a subclass of it) reaches Dynamo through the bound
    method (``L['fn'].__self__``): the report names its layers by their paths, not ``__self__.0``."""
    register_layer_kernel(kernel_name="SiluAndMul", layer=SiluAndMulKernel, device="cpu")
    register_external_layer(SiluAndMul, "SiluAndMul")
    text = str(twinkle_fx.explain(torch.nn.Sequential(SiluAndMul(), SiluAndMul()), torch.randn(3, 8)))
    assert "swapped 2 x layer SiluAndMul -> SiluAndMul: SiluAndMul [cpu, any] from impl SiluAndMulKernel (custom op " \
           "call)  [0, 1]" in text, text


def test_cli_explains_a_tiny_qwen2(capsys, device):
    assert main(["explain", "--config", "qwen2", "--summary", "--device", device]) == 0
    out = capsys.readouterr().out
    assert "swapped 5 x layer Qwen2RMSNorm -> RMSNorm" in out
    assert "swapped 2 x layer Qwen2MLP -> SwiGLUMLP" in out
    assert "swapped 2 x function transformers.models.qwen2.modeling_qwen2.apply_rotary_pos_emb" in out
