"""The decode_cache pass: the rotary kernel and a static KV cache's two writes become one kernel call."""

from __future__ import annotations

import pytest
import torch
from transformers import StaticCache

from tiny_models import DEVICE, register_qwen2_kernels, tiny
from twinkle_fx.compiler import collect_reports
from twinkle_fx.core.registry import scoped_registry
from twinkle_fx.testing import record_graphs


def _step(model, ids, *, compiled: bool, **options):
    """Prefill ids[:, :-1] into a fresh static cache, then one step of the last token (compiled or not):
    (logits, the cache's layers as (keys, values))."""
    cache = StaticCache(config=model.config, max_cache_len=16)
    length = ids.shape[1] - 1
    model(ids[:, :length], past_key_values=cache, cache_position=torch.arange(length, device=DEVICE))
    step = torch.compile(model, backend="twinkle", dynamic=False, options={"compiler": "aot_eager", **options}) \
        if compiled else model
    logits = step(ids[:, length:], past_key_values=cache, cache_position=torch.tensor([length], device=DEVICE)).logits
    return logits, [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


def _swapped(report, kernel="apply_rotary_pos_emb_to_cache"):
    return [r.target for r in report.regions if r.swapped and r.kernel.endswith(kernel)]


@pytest.mark.slow
def test_a_decode_step_writes_the_cache_in_the_rotary_kernel():
    model = tiny("qwen2").eval()
    ids = torch.randint(0, 128, (1, 9), device=DEVICE)
    with torch.no_grad(), scoped_registry():
        register_qwen2_kernels()
        want, want_cache = _step(model, ids, compiled=False)
        torch._dynamo.reset()
        with record_graphs() as graphs, collect_reports() as report:
            got, got_cache = _step(model, ids, compiled=True, decode_cache=True, gqa_attention=False)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for (keys, values), (want_keys, want_values) in zip(got_cache, want_cache):  # written at the step's row
        torch.testing.assert_close(keys, want_keys, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(values, want_values, rtol=1e-5, atol=1e-6)
    layers = model.config.num_hidden_layers
    assert _swapped(report) == ["rotary + KV cache write of 1 token(s)"] * layers
    graph = graphs.after[-1]
    assert "index_copy_" not in graph and graph.count("apply_rotary_pos_emb_to_cache(") == layers


@pytest.mark.slow
@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_with_the_gqa_kernel_the_attention_and_the_length_update_join_the_call(compiler):
    """Every layer's rotary, cache write and attention become one call. Layer 0's length counter is also read for
    the step's positions and mask, so its call takes the index and the graph keeps its update; the other layers'
    calls advance their counters themselves. Two steps: the second reads what the first wrote and advanced."""
    model = tiny("qwen2").eval()
    ids = torch.randint(0, 128, (2, 11), device=DEVICE)
    options = {"compiler": compiler, "decode_cache": True, "gqa_attention": True}

    def steps(compiled):
        cache = StaticCache(config=model.config, max_cache_len=16)
        model(ids[:, :9], past_key_values=cache)
        step = torch.compile(model, backend="twinkle", dynamic=False, options=options) if compiled else model
        return [step(ids[:, i:i + 1], past_key_values=cache).logits for i in (9, 10)], cache

    with torch.no_grad(), scoped_registry():
        register_qwen2_kernels()
        want, want_cache = steps(compiled=False)
        torch._dynamo.reset()
        with record_graphs() as graphs, collect_reports() as report:
            got, got_cache = steps(compiled=True)
    for got_logits, want_logits in zip(got, want):
        torch.testing.assert_close(got_logits, want_logits, rtol=1e-5, atol=1e-5)
    for layer, want_layer in zip(got_cache.layers, want_cache.layers):
        torch.testing.assert_close(layer.keys, want_layer.keys, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(layer.values, want_layer.values, rtol=1e-5, atol=1e-6)
        assert layer.cumulative_length.item() == want_layer.cumulative_length.item() == 11
    layers = model.config.num_hidden_layers
    assert _swapped(report, "rotary_cache_attention") == ["rotary + KV cache write + attention of 1 token(s)"] * layers
    graph = graphs.after[-1]
    assert "index_copy_" not in graph and "gqa_attention(" not in graph
    assert graph.count("rotary_cache_attention(") == layers
    assert graph.count("cache_length = l_kwargs_past_key_values_layers_") == layers - 1
    assert graph.count(".add_(1)") == 1, "only layer 0's update stays in the graph"


@pytest.mark.slow
def test_auto_and_off_leave_the_writes_alone():
    """"auto" rewrites on CUDA only; False, a training graph or a registry without the rewrite never."""
    model = tiny("qwen2").eval()
    ids = torch.randint(0, 128, (1, 9), device=DEVICE)
    cases = [({"decode_cache": "auto"}, DEVICE == "cuda", False), ({"decode_cache": False}, False, False),
             ({"decode_cache": True, "mode": "train"}, False, False), ({"decode_cache": True}, False, True)]
    for options, rewritten, removed in cases:
        torch._dynamo.reset()
        with torch.no_grad(), scoped_registry() as registry, collect_reports() as report:
            register_qwen2_kernels()
            if removed:
                registry.remove_graph_rewrite("decode_cache")
            _step(model, ids, compiled=True, **options)
        # on CUDA "auto" also rewrites SDPA to the GQA kernel, which then joins the call
        assert bool(_swapped(report, ("apply_rotary_pos_emb_to_cache", "rotary_cache_attention"))) == rewritten, options
