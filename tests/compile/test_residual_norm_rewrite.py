"""The residual_norm rewrite: which residual adds join their swapped RMSNorm's kernel, and the switches that
leave them apart. The numbers of the rewritten graphs (logits, every gradient) are checked against eager by
tests/compile/test_compile_transformers.py, whose graphs it changes."""

import torch
from tiny_models import input_ids, register_qwen2_kernels, tiny

import twinkle_fx
from twinkle_fx.testing import record_graphs


def _after(model, ids, options=None):
    with record_graphs() as graphs:
        torch.compile(model, backend="twinkle", options={"compiler": "aot_eager", **(options or {})})(ids, labels=ids)
    return graphs.after[0]


def _kernel_calls(code: str, name: str) -> int:
    return sum(f"twinkle.{name}(" in line or f"twinkle_{name}(" in line for line in code.splitlines())


def test_every_norm_of_a_sum_read_again_takes_its_add():
    register_qwen2_kernels()
    code = _after(tiny("qwen2", layers=2), input_ids())
    # 2 layers: the post-attention norms and the second layer's input norm read a sum the next residual add
    # reads too; the first input norm reads the embeddings, the final norm a sum nothing else reads
    assert _kernel_calls(code, "add_rms_norm") == 3
    assert code.count("twinkle_layer_RMSNorm") == 2


def test_the_option_and_the_registry_each_turn_it_off():
    register_qwen2_kernels()
    ids = input_ids()
    assert _kernel_calls(_after(tiny("qwen2"), ids, {"residual_norm": False}), "add_rms_norm") == 0
    with twinkle_fx.scoped_registry() as registry:
        registry.remove_graph_rewrite("residual_norm")
        assert _kernel_calls(_after(tiny("qwen2"), ids), "add_rms_norm") == 0


def test_a_sum_of_two_dtypes_keeps_its_add():
    """A residual kept in fp32 (a model that adds in another dtype) promotes the sum: the kernel, which rounds
    the sum to its addends' dtype, does not take it."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

            self.proj = torch.nn.Linear(64, 64)
            self.norm = Qwen2RMSNorm(64)

        def forward(self, x, residual):
            h = residual + self.proj(x)
            return self.norm(h), h

    register_qwen2_kernels()
    block = Block().to(torch.bfloat16).to(input_ids().device)
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16, device=input_ids().device)
    for residual in (torch.randn_like(x), torch.randn_like(x, dtype=torch.float32)):
        with record_graphs() as graphs:
            torch.compile(block, backend="twinkle", options={"compiler": "aot_eager"})(x, residual)
        want = 1 if residual.dtype == x.dtype else 0
        assert _kernel_calls(graphs.after[0], "add_rms_norm") == want, graphs.after[0]
        torch._dynamo.reset()
