"""The embedding_grad rewrite of backward graphs: an embedding's dense weight gradient (plus a tied LM head's)
becomes twinkle_triton.embedding_grad_sums gathered into the kernel that writes the gradient, or, where the tied
head's gradient is a buffer the backward owns (the fused loss's), added to it in place by
twinkle_triton.add_embedding_grad; with the gradients of eager."""

import logging
import re

import pytest
import torch
import transformers
from tiny_models import TINY, compiled_afresh, cuda_graph_steps_match_eager, eager_grads, fused_loss_steps, input_ids

import twinkle_fx
from twinkle_fx.testing import record_graphs

from device_under_test import DEVICE
from dtype_tolerance import assert_close


def _llama(tied: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("llama", **{**TINY, "num_hidden_layers": 1},
                                               tie_word_embeddings=tied)
    return transformers.AutoModelForCausalLM.from_config(config).to(DEVICE)


def _gathered_sums_added(code: str) -> bool:
    """Whether the row sums gathered through the slots (``index`` of the sums, times ``slot >= 0``) are added
    to something (a tied head's gradient) rather than being the weight's gradient themselves."""
    gather = re.search(r"(\w+)(?::[^=]*)? = torch\.ops\.aten\.index\.Tensor\(", code).group(1)
    masked = re.search(rf"(\w+)(?::[^=]*)? = torch\.ops\.aten\.mul\.Tensor\({gather}, ", code).group(1)
    return re.search(rf"aten\.add\.Tensor\(\w+, {masked}\)", code) is not None


def _compiled_grads(model, ids, options=None):
    """The backward graph's code and every gradient, from one step compiled with aot_eager."""
    model.zero_grad()
    with record_graphs() as graphs:
        compiled = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager", **(options or {})})
        compiled(ids, labels=ids).loss.backward()
    return graphs.backward[0], [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("tied", (True, False))
def test_the_weight_gradient_is_its_rows_put_into_the_head_gradient_or_zeros(tied):
    model, ids = _llama(tied), input_ids()
    code, grads = _compiled_grads(model, ids)
    assert code.count("twinkle.embedding_grad_sums.default(") == 1 and "embedding_dense_backward" not in code
    # tied: the sums are added to the head's gradient where it is written; untied: they are the gradient
    assert _gathered_sums_added(code) is tied
    for got, want in zip(grads, eager_grads(model, ids)):
        assert_close(got, want, torch.float32, "gradient")


def test_the_option_and_the_registry_each_turn_it_off():
    model, ids = _llama(True), input_ids()
    code, _ = _compiled_grads(model, ids, {"embedding_grad": False})
    assert "embedding_grad_sums" not in code and "embedding_dense_backward" in code
    torch._dynamo.reset()
    with twinkle_fx.scoped_registry() as registry:
        registry.remove_graph_rewrite("embedding_grad")
        code, _ = _compiled_grads(model, ids)
    assert "embedding_grad_sums" not in code


class _Tied(torch.nn.Module):
    """An embedding whose weight an output projection shares, as a tied LM head does."""

    def __init__(self, **embedding):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32, **embedding)
        self.mix = torch.nn.Linear(32, 32)

    def forward(self, ids):
        return (self.mix(self.embed(ids)) @ self.embed.weight.T).square().mean()


def _module_grads(module, ids, compiler):
    module.zero_grad()
    with record_graphs() as graphs:
        torch.compile(module, backend="twinkle", options={"compiler": compiler})(ids).backward()
    return graphs.backward, [p.grad.clone() for p in module.parameters()]


def test_the_padding_index_keeps_its_row_and_scaled_gradients_are_left_alone():
    ids = torch.randint(0, 64, (3, 10), device=DEVICE)
    ids[:, :4] = 5
    module = _Tied(padding_idx=5).to(DEVICE)
    backward, grads = _module_grads(module, ids, "aot_eager")
    assert "embedding_grad_sums" in backward[0]
    module.zero_grad()
    module(ids).backward()
    for got, p in zip(grads, module.parameters()):
        assert_close(got, p.grad, torch.float32, "gradient")
    torch._dynamo.reset()
    backward, _ = _module_grads(_Tied(scale_grad_by_freq=True).to(DEVICE), ids, "aot_eager")
    assert "embedding_grad_sums" not in backward[0] and "embedding_dense_backward" in backward[0]


@pytest.mark.slow
def test_inductors_decomposition_of_the_gradient_is_rewritten_too(caplog):
    """Under Inductor the backward graph holds the decomposition (an fp32 table of zeros, a masked
    accumulating index-put, a cast): it is rewritten as well, in bf16, with the gradients of eager."""
    ids = torch.randint(0, 64, (3, 10), device=DEVICE)
    module = _Tied().to(DEVICE, torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="twinkle_fx.compiler.inner.embedding_grad"), compiled_afresh():
        _, grads = _module_grads(module, ids, "inductor")
    assert any(r.getMessage().startswith("embedding_grad: 1 embedding weight gradient(s) of a backward graph")
               for r in caplog.records)
    module.zero_grad()
    module(ids).backward()
    for got, p in zip(grads, module.parameters()):
        assert_close(got, p.grad, torch.bfloat16, "gradient")


def test_a_table_looked_up_twice_sums_both_gradients():
    """Two lookups of one table (shared encoder/decoder embeddings): AOTAutograd adds their dense gradients; each
    becomes its sums, and the weight's gradient is still both."""

    class TwoLookups(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(64, 32)

        def forward(self, a, b):
            return (self.embed(a) * self.embed(b).flip(1)).square().mean()

    module = TwoLookups().to(DEVICE)
    a, b = torch.randint(0, 64, (2, 9), device=DEVICE), torch.randint(0, 64, (2, 9), device=DEVICE)
    with record_graphs() as graphs:
        torch.compile(module, backend="twinkle", options={"compiler": "aot_eager"})(a, b).backward()
    assert graphs.backward[0].count("twinkle.embedding_grad_sums.default(") == 2
    got = module.embed.weight.grad.clone()
    module.zero_grad()
    module(a, b).backward()
    assert_close(got, module.embed.weight.grad, torch.float32, "gradient")


def _torch_2_11_decomposition(grad, indices, head):
    """torch 2.11's decomposition of embedding_dense_backward (padding index 3), added to a tied head's gradient:
    the padding rows zeroed by masked_fill, then an accumulating index-put with no mask."""
    rows = grad.float().masked_fill((indices == 3).unsqueeze(-1), 0)
    table = rows.new_zeros((head.shape[0], rows.shape[-1]))
    return head + torch.ops.aten._unsafe_index_put(table, [indices], rows, True).to(grad.dtype)


def _installed_decomposition(grad, indices, head):
    return head + torch.ops.aten.embedding_dense_backward(grad, indices, head.shape[0], 3, False)


@pytest.mark.parametrize("form", (_torch_2_11_decomposition, _installed_decomposition), ids=("torch-2.11", "installed"))
def test_both_forms_of_the_dense_gradients_decomposition_are_rewritten(form):
    """The graph Inductor's post-grad pass sees, in the form of torch 2.11 and in the installed torch's, whatever
    the installed version: each becomes the sums, with the padding tokens left out, and the same gradient."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    from twinkle_fx.compiler.inner.embedding_grad import rewrite_embedding_grads

    torch.manual_seed(0)
    grad = torch.randn(3, 7, 16, device=DEVICE, dtype=torch.bfloat16)
    indices = torch.randint(0, 40, (3, 7), device=DEVICE)
    indices[:, :2] = 3  # the padding index
    head = torch.randn(40, 16, device=DEVICE, dtype=torch.bfloat16)
    traced = make_fx(form, decomposition_table=select_decomp_table(), tracing_mode="fake")(grad, indices, head)
    assert rewrite_embedding_grads(traced.graph) == 1
    traced.recompile()
    assert "embedding_grad_sums" in traced.code and "index_put" not in traced.code
    assert_close(traced(grad, indices, head), form(grad, indices, head), torch.bfloat16, "gradient")


def _fused_loss_steps(compiler: str, steps: int, **kwargs):
    """A tied tiny Llama's compiled steps with the fused-loss head (:func:`tiny_models.fused_loss_steps`)."""
    return fused_loss_steps(_llama(True), compiler, steps, **kwargs)


def test_a_fused_loss_heads_gradient_takes_the_rows_in_place_and_is_the_weights_gradient():
    code, grads, want = _fused_loss_steps("aot_eager", 2)
    call = re.search(r"torch\.ops\.twinkle\.add_embedding_grad\.default\((\w+), (\w+), ", code)
    assert call is not None and "aten.index.Tensor" not in code  # no gather, no pass over the vocabulary
    buffer, scale = call.groups()
    inputs = re.search(r"def forward\(self, (.*)\):", code).group(1)
    assert re.search(rf"\b{buffer}: \"f32\[128, 64\]\"", inputs)  # a backward input: the saved buffer
    assert scale.startswith("tangents")  # the loss's gradient, read on the device
    returned = re.search(r"return \((.*)\)", code).group(1).split(", ")
    assert returned.count(buffer) == 1  # that buffer is the tied weight's gradient
    for got, w in zip(grads, want):
        assert_close(got, w, torch.float32, "gradient")


def test_gradients_accumulated_over_steps_and_a_retained_graph_stay_eagers():
    """Without zero_grad the second step adds to the first's gradient (the buffer the first backward returned);
    a backward run twice (retain_graph) keeps its saved tensors, so nothing is donated and the gradient is
    gathered into a new tensor instead."""
    _, grads, want = _fused_loss_steps("aot_eager", 2, zero_grad=False)
    for got, w in zip(grads, want):
        assert_close(got, 2 * w, torch.float32, "gradient")
    torch._dynamo.reset()
    code, grads, want = _fused_loss_steps("aot_eager", 1, retain_graph=True)
    assert "add_embedding_grad" not in code and "twinkle.embedding_grad_sums" in code
    for got, w in zip(grads, want):
        assert_close(got, 2 * w, torch.float32, "gradient")


@pytest.mark.slow
def test_under_inductor_the_fused_loss_heads_gradient_takes_the_rows_in_place(caplog):
    with caplog.at_level(logging.INFO, logger="twinkle_fx.compiler.inner.embedding_grad"), compiled_afresh():
        _, grads, want = _fused_loss_steps("inductor", 2, zero_grad=False)
    assert any("1 added in place to a tied head's gradient" in r.getMessage() for r in caplog.records)
    for got, w in zip(grads, want):
        assert_close(got, 2 * w, torch.float32, "gradient")


@pytest.mark.gpu
@pytest.mark.slow
def test_under_cuda_graphs_every_steps_tied_gradient_is_eagers(caplog):
    """The forward's replay writes the saved head gradient where the previous step's weight gradient lay: each
    step's tied gradient is still eager's, with nothing skipped."""
    with caplog.at_level(logging.INFO, logger="twinkle_fx.compiler.inner.embedding_grad"):
        cuda_graph_steps_match_eager(_llama(True), lambda m: m.model.embed_tokens.weight, "tied weight's gradient")
    assert any("1 added in place to a tied head's gradient" in r.getMessage() for r in caplog.records)
