"""The scaled_gradient rewrite of backward graphs: an untied LM head's gradient, which the fused loss computes in the
forward and the backward scales by the loss's gradient, is scaled in place by twinkle_triton.scale_in_place and
returned as the weight's gradient; with the gradients of eager."""

import logging
import re

import pytest
import torch
import transformers
from tiny_models import (TINY, assert_the_cache_key_follows_the_sources, compiled_afresh, cuda_graph_steps_match_eager,
                         eager_grads, fused_loss_steps, input_ids)

import twinkle_fx
from twinkle_fx.builtin import use_builtin_kernels

from device_under_test import DEVICE
from dtype_tolerance import assert_close

LOGGER = "twinkle_fx.compiler.inner.scaled_gradient"


def _untied_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("llama", **{**TINY, "num_hidden_layers": 1}, tie_word_embeddings=False)
    return transformers.AutoModelForCausalLM.from_config(config).to(DEVICE)


def _fused_loss_steps(compiler: str, steps: int, **kwargs):
    """An untied tiny Llama's compiled steps with the fused-loss head (:func:`tiny_models.fused_loss_steps`)."""
    return fused_loss_steps(_untied_llama(), compiler, steps, **kwargs)


def test_the_untied_heads_gradient_is_scaled_where_it_lies_and_returned():
    code, grads, want = _fused_loss_steps("aot_eager", 2)
    call = re.search(r"torch\.ops\.twinkle\.scale_in_place\.default\((\w+), (\w+)\)", code)
    assert call is not None and code.count("twinkle.scale_in_place.default(") == 1
    buffer, scale = call.groups()
    inputs = re.search(r"def forward\(self, (.*)\):", code).group(1)
    assert re.search(rf"\b{buffer}: \"f32\[128, 64\]\"", inputs)  # a backward input: the saved head gradient
    assert scale.startswith("tangents")  # the loss's gradient, read on the device
    returned = re.search(r"return \((.*)\)", code).group(1).split(", ")
    assert returned.count(buffer) == 1  # that buffer is the head weight's gradient
    assert not re.search(rf"aten\.mul\.Tensor\({buffer}, ", code)  # and no product of it is computed
    for got, w in zip(grads, want):
        assert_close(got, w, torch.float32, "gradient")


def test_gradients_accumulated_over_steps_and_a_retained_graph_stay_eagers():
    """Without zero_grad the second step adds to the first's gradient (the buffer the first backward returned);
    a backward run twice (retain_graph) keeps its saved tensors, so nothing is donated and the product is computed
    into a new tensor instead."""
    _, grads, want = _fused_loss_steps("aot_eager", 2, zero_grad=False)
    for got, w in zip(grads, want):
        assert_close(got, 2 * w, torch.float32, "gradient")
    torch._dynamo.reset()
    code, grads, want = _fused_loss_steps("aot_eager", 1, retain_graph=True)
    assert "scale_in_place" not in code
    for got, w in zip(grads, want):
        assert_close(got, 2 * w, torch.float32, "gradient")


def test_a_scaled_loss_scales_the_heads_gradient():
    """A loss multiplied before its backward (gradient accumulation's loss / n): the gradient the head's buffer
    receives is not 1, and every element is scaled."""
    use_builtin_kernels(devices=(DEVICE,))
    model, ids = _untied_llama(), input_ids()
    want = eager_grads(model, ids)
    model.zero_grad(set_to_none=True)
    compiled = twinkle_fx.compile(model, options={"compiler": "aot_eager"})
    (compiled(ids, labels=ids).loss * 0.25).backward()
    for got, w in zip([p.grad for p in model.parameters()], want):
        assert_close(got, 0.25 * w, torch.float32, "gradient")


def test_the_option_and_the_registry_each_turn_it_off():
    code, _, _ = _fused_loss_steps("aot_eager", 1, options={"scaled_gradient": False})
    assert "scale_in_place" not in code
    torch._dynamo.reset()
    with twinkle_fx.scoped_registry() as registry:
        registry.remove_graph_rewrite("scaled_gradient")
        code, _, _ = _fused_loss_steps("aot_eager", 1)
    assert "scale_in_place" not in code


def test_the_compile_caches_key_hashes_the_rewrite_and_its_kernel(tmp_path, monkeypatch):
    from twinkle_fx.compiler.inner import scaled_gradient

    assert_the_cache_key_follows_the_sources(scaled_gradient, "scaled_gradient", tmp_path, monkeypatch)


@pytest.mark.slow
def test_under_inductor_the_untied_heads_gradient_is_scaled_in_place(caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER), compiled_afresh():
        _, grads, want = _fused_loss_steps("inductor", 2, zero_grad=False)
    assert any("1 gradient(s) a backward graph returns scaled in place" in r.getMessage() for r in caplog.records)
    for got, w in zip(grads, want):
        assert_close(got, 2 * w, torch.float32, "gradient")


@pytest.mark.gpu
@pytest.mark.slow
def test_under_cuda_graphs_every_steps_head_gradient_is_eagers(caplog):
    """The forward's replay writes the saved head gradient where the previous step's weight gradient lay: each
    step's head gradient is still eager's, with nothing skipped."""
    with caplog.at_level(logging.INFO, logger=LOGGER):
        cuda_graph_steps_match_eager(_untied_llama(), lambda m: m.lm_head.weight, "head weight's gradient")
    assert any("1 gradient(s) a backward graph returns scaled in place" in r.getMessage() for r in caplog.records)
