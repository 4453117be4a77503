"""The attention pass: a constant causal mask becomes is_causal=True; a short query on repeated K/V
(transformers' repeat_kv) becomes one grouped-query kernel call."""

from __future__ import annotations

import re
import warnings
from collections import Counter

import expecttest
import pytest
import torch
import transformers
from transformers.integrations.sdpa_attention import repeat_kv

from tiny_models import DEVICE, TINY
from twinkle_fx.compiler import collect_reports
from twinkle_fx.compiler.options import parse_options
from twinkle_fx.core.registry import scoped_registry
from twinkle_fx.testing import record_graphs

_TARGET = "scaled_dot_product_attention on repeated K/V"
_CAUSAL = "scaled_dot_product_attention with a constant causal mask"


def aot_op_counts(code: str) -> dict[str, int]:
    return dict(Counter(re.findall(r"torch\.ops\.(\w+\.\w+)\.", code)))


class RepeatKVAttention(torch.nn.Module):
    """What transformers' sdpa_attention_forward does with a mask: repeat K/V, then SDPA."""

    def __init__(self, groups: int, interleave: bool = False) -> None:
        super().__init__()
        self.groups, self.interleave = groups, interleave

    def forward(self, q, k, v, mask):
        if self.interleave:
            k, v = k.repeat_interleave(self.groups, dim=1), v.repeat_interleave(self.groups, dim=1)
        else:
            k, v = repeat_kv(k, self.groups), repeat_kv(v, self.groups)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)


def _inputs(query_len: int, *, batch=2, kv_heads=2, groups=3, keys=19, dim=16, requires_grad=False):
    g = torch.Generator().manual_seed(0)

    def t(*shape):
        return torch.randn(*shape, generator=g).to(DEVICE).requires_grad_(requires_grad)

    q = t(batch, kv_heads * groups, query_len, dim)
    k, v = t(batch, kv_heads, keys, dim), t(batch, kv_heads, keys, dim)
    mask = (torch.rand(batch, 1, query_len, keys, generator=g) > 0.3).to(DEVICE)
    mask[..., 0] = True  # every query sees at least one key
    return q, k, v, mask


def _compile(model, **options):
    return torch.compile(model, backend="twinkle", dynamic=False, options={"compiler": "aot_eager", **options})


class TestExpectedRewrite(expecttest.TestCase):
    def test_a_decode_step_calls_the_kernel_on_the_unrepeated_key_and_value(self):
        model = RepeatKVAttention(groups=3)
        q, k, v, mask = _inputs(1)
        with torch.no_grad(), record_graphs() as graphs, collect_reports() as report:
            got = _compile(model)(q, k, v, mask)
        torch.testing.assert_close(got, model(q, k, v, mask), rtol=1e-4, atol=1e-5)
        self.assertExpectedInline(graphs.diff(context=0), """\
@@
-        getitem: "f32[2, 2, 1, 19, 16]" = l_k_[(slice(None, None, None), slice(None, None, None), None, slice(None, None, None), slice(None, None, None))];  l_k_ = None
-        hidden_states: "f32[2, 2, 3, 19, 16]" = getitem.expand(2, 2, 3, 19, 16);  getitem = None
-
-        k: "f32[2, 6, 19, 16]" = hidden_states.reshape(2, 6, 19, 16);  hidden_states = None
-
-        getitem_1: "f32[2, 2, 1, 19, 16]" = l_v_[(slice(None, None, None), slice(None, None, None), None, slice(None, None, None), slice(None, None, None))];  l_v_ = None
-        hidden_states_1: "f32[2, 2, 3, 19, 16]" = getitem_1.expand(2, 2, 3, 19, 16);  getitem_1 = None
-
-        v: "f32[2, 6, 19, 16]" = hidden_states_1.reshape(2, 6, 19, 16);  hidden_states_1 = None
-
-        scaled_dot_product_attention: "f32[2, 6, 1, 16]" = torch._C._nn.scaled_dot_product_attention(l_q_, k, v, attn_mask = l_mask_, scale = 0.3);  l_q_ = k = v = l_mask_ = None
-        return (scaled_dot_product_attention,)
+        gqa_attention: "f32[2, 6, 1, 16]" = twinkle_gqa_attention(l_q_, l_k_, l_v_, l_mask_, 0.3);  l_q_ = l_k_ = l_v_ = l_mask_ = None
+        return (gqa_attention,)
""")
        counts = aot_op_counts(graphs.forward[0])
        # an opaque op on every device: its kernels launch as programmatic dependents, through our launcher
        self.assertEqual(counts.get("twinkle.gqa_attention"), 1)
        self.assertNotIn("aten._scaled_dot_product_efficient_attention", counts)  # nothing of SDPA is left
        self.assertNotIn("aten.expand", counts)
        (region,) = report.regions
        self.assertTrue(region.swapped)
        self.assertEqual((region.target, region.kernel), (_TARGET, "twinkle_triton.gqa_attention"))


def test_repeat_interleave_is_matched_too():
    model = RepeatKVAttention(groups=2, interleave=True)
    q, k, v, mask = _inputs(2, groups=2)
    with torch.no_grad(), collect_reports() as report:
        got = _compile(model)(q, k, v, mask)
    torch.testing.assert_close(got, model(q, k, v, mask), rtol=1e-4, atol=1e-5)
    assert [r.swapped for r in report.regions] == [True]


def test_auto_keeps_a_long_query_and_true_rewrites_it():
    model = RepeatKVAttention(groups=3)
    q, k, v, mask = _inputs(20)
    with torch.no_grad(), collect_reports() as report:
        _compile(model)(q, k, v, mask)
    assert report.regions == []  # a prefill is no candidate under "auto"
    torch._dynamo.reset()
    with torch.no_grad(), collect_reports() as report:
        got = _compile(model, gqa_attention=True)(q, k, v, mask)
    assert [r.swapped for r in report.regions] == [True]
    torch.testing.assert_close(got, model(q, k, v, mask), rtol=1e-4, atol=1e-5)


def test_false_leaves_the_graph_alone():
    model = RepeatKVAttention(groups=3)
    q, k, v, mask = _inputs(1)
    with torch.no_grad(), record_graphs() as graphs, collect_reports() as report:
        _compile(model, gqa_attention=False)(q, k, v, mask)
    assert graphs.diff().strip() == "" and report.regions == []


def test_gradients_reach_query_key_and_value():
    model = RepeatKVAttention(groups=3)
    q, k, v, mask = _inputs(3, requires_grad=True)
    grad = torch.randn(2, 6, 3, 16, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with collect_reports() as report:
        got = _compile(model)(q, k, v, mask)
    assert [r.swapped for r in report.regions] == [True]
    got_grads = torch.autograd.grad(got, (q, k, v), grad)
    want = model(q, k, v, mask)
    want_grads = torch.autograd.grad(want, (q, k, v), grad)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_bad_option_values_name_the_option():
    with pytest.raises(ValueError, match="gqa_attention must be True, False or 'auto', got 'always'"):
        parse_options({"gqa_attention": "always"})
    with pytest.raises(ValueError, match="causal_mask must be True or False, got 'yes'"):
        parse_options({"causal_mask": "yes"})


def _decode(model, config, step, *, batch=2, prompt=8):
    """Prefill ``prompt`` tokens eagerly into a StaticCache, then run ``step`` on one more token."""
    cache = transformers.StaticCache(config=config, max_cache_len=32)
    ids = torch.randint(0, config.vocab_size, (batch, prompt + 1), generator=torch.Generator().manual_seed(1))
    ids = ids.to(DEVICE)
    with torch.no_grad():
        model(input_ids=ids[:, :prompt], past_key_values=cache, use_cache=True,
              cache_position=torch.arange(prompt, device=DEVICE))
        logits = step(input_ids=ids[:, prompt:], past_key_values=cache, use_cache=True,
                      cache_position=torch.tensor([prompt], device=DEVICE)).logits
    return logits, cache


def test_a_qwen2_decode_step_with_a_static_cache():
    """Every layer's attention is the kernel; the logits and the cache's in-place update are eager's."""
    torch.manual_seed(0)
    config = transformers.Qwen2Config(**TINY, attn_implementation="sdpa")
    model = transformers.Qwen2ForCausalLM(config).to(DEVICE).eval()
    want, want_cache = _decode(model, config, model)
    with collect_reports() as report:
        got, got_cache = _decode(model, config, _compile(model))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for got_layer, want_layer in zip(got_cache.layers, want_cache.layers):  # the new token's K/V were written
        torch.testing.assert_close(got_layer.keys, want_layer.keys)
        torch.testing.assert_close(got_layer.values, want_layer.values)
    swapped = [r for r in report.regions if r.target == _TARGET]
    assert [r.swapped for r in swapped] == [True, True]
    assert [r.location.split(" ")[0] for r in swapped] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]


class CausalFromArange(torch.nn.Module):
    """A mask built in forward from aranges (what transformers does under torch.compile)."""

    def __init__(self, groups: int, window: int | None = None) -> None:
        super().__init__()
        self.groups, self.window = groups, window

    def forward(self, q, k, v):
        rows = torch.arange(q.shape[2], device=q.device)
        cols = torch.arange(k.shape[2], device=q.device)
        mask = cols[None, :] <= rows[:, None]
        if self.window is not None:
            mask = mask & (rows[:, None] - cols[None, :] < self.window)
        mask = mask[None, None].expand(q.shape[0], 1, -1, -1)
        k, v = repeat_kv(k, self.groups), repeat_kv(v, self.groups)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_constant_causal_mask_becomes_is_causal_with_grouped_heads(dtype):
    model = CausalFromArange(groups=3)
    q, k, v, _ = _inputs(24, keys=24, requires_grad=True)
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    with record_graphs() as graphs, collect_reports() as report:
        got = _compile(model)(q, k, v)
    assert [(r.target, r.swapped) for r in report.regions] == [(_CAUSAL, True)]
    (after,) = graphs.after
    call = [line for line in after.splitlines() if "scaled_dot_product_attention(" in line]
    assert len(call) == 1 and "is_causal = True" in call[0] and "attn_mask" not in call[0]
    grouped = dtype == torch.bfloat16 or DEVICE == "cpu"  # fp32 on CUDA: the efficient kernel, no GQA
    assert ("enable_gqa = True" in call[0]) == grouped and ("expand" not in after) == grouped
    assert "arange" not in after  # the mask's computation is gone
    want = model(q, k, v)
    grads = torch.autograd.grad(got.float().sum(), (q, k, v))
    want_grads = torch.autograd.grad(want.float().sum(), (q, k, v))
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got, want, **tol)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, **tol)


def test_a_windowed_or_input_mask_is_left_alone():
    q, k, v, mask = _inputs(24, keys=24)
    with torch.no_grad(), record_graphs() as graphs, collect_reports() as report:
        _compile(CausalFromArange(groups=3, window=4))(q, k, v)
    assert graphs.diff().strip() == ""
    # a constant mask that is not causal is reported; a query of 24 is no candidate of the kernel under "auto"
    (region,) = report.regions
    assert region.target == _CAUSAL and not region.swapped and "not causal" in str(region.reason)
    torch._dynamo.reset()
    with torch.no_grad(), record_graphs() as graphs:
        _compile(RepeatKVAttention(groups=3), gqa_attention=False)(q, k, v, mask.tril())  # a causal mask from an input
    assert graphs.diff().strip() == ""


def test_causal_mask_false_leaves_the_graph_alone():
    q, k, v, _ = _inputs(24, keys=24)
    with torch.no_grad(), record_graphs() as graphs:
        _compile(CausalFromArange(groups=3), causal_mask=False)(q, k, v)
    assert graphs.diff().strip() == ""


@pytest.mark.parametrize("removed", ["gqa_attention", "causal_attention"])
def test_a_graph_rewrite_removed_from_the_registry_is_not_made_and_the_other_is(removed):
    decode, prefill = _inputs(1), _inputs(24, keys=24)[:3]
    with scoped_registry() as registry, torch.no_grad(), collect_reports() as report:
        registry.remove_graph_rewrite(removed)
        _compile(RepeatKVAttention(groups=3))(*decode)
        _compile(CausalFromArange(groups=3))(*prefill)
    made = {r.target for r in report.regions if r.swapped}
    assert made == {_TARGET, _CAUSAL} - {_TARGET if removed == "gqa_attention" else _CAUSAL}


def test_a_compiled_qwen2_forward_without_padding_runs_causal_attention():
    """transformers materialises the causal mask under torch.compile (use_cache=False: the cache
    position is a traced tensor); the pass hands SDPA is_causal=True and the unrepeated K/V."""
    torch.manual_seed(0)
    config = transformers.Qwen2Config(**TINY, attn_implementation="sdpa")
    model = transformers.Qwen2ForCausalLM(config).to(DEVICE)
    ids = torch.randint(0, config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    want = model(input_ids=ids, labels=ids, use_cache=False)
    want_grads = torch.autograd.grad(want.loss, list(model.parameters()))
    with collect_reports() as report:
        got = _compile(model)(input_ids=ids, labels=ids, use_cache=False)
    grads = torch.autograd.grad(got.loss, list(model.parameters()))
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    causal = [r for r in report.regions if r.target == _CAUSAL]
    # transformers 5.22 skips the mask itself when it can; then there is nothing to rewrite
    assert all(r.swapped for r in causal)


@pytest.mark.gpu
def test_inductor_compiles_the_kernel_with_a_bool_mask():
    """Inductor lowers the traced kernel (a bool mask once went through a uint8 view it cannot lower)."""
    model = RepeatKVAttention(groups=3)
    q, k, v, mask = (t.to(torch.bfloat16) if t.is_floating_point() else t for t in _inputs(1))
    with torch.no_grad(), collect_reports() as report:
        got = torch.compile(model, backend="twinkle", dynamic=False)(q, k, v, mask)
    assert [r.swapped for r in report.regions] == [True]
    torch.testing.assert_close(got, model(q, k, v, mask), rtol=2e-2, atol=2e-2)


class CausalBuiltInPlace(torch.nn.Module):
    """The mask's own tensors changed in place (``&=``, as some transformers versions build it), and a
    tensor of the mask changed in place outside its computation after the mask read it."""

    def __init__(self, mutate_outside: bool) -> None:
        super().__init__()
        self.mutate_outside = mutate_outside

    def forward(self, q, k, v):
        rows = torch.arange(q.shape[2], device=q.device)
        cols = torch.arange(k.shape[2], device=q.device)
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
        mask &= cols[None, :] <= rows[:, None]
        out = torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, 3), repeat_kv(v, 3), attn_mask=mask)
        if self.mutate_outside:
            rows.add_(1)  # after the call: the mask the call saw is still causal, but the pass cannot tell
            return out, rows
        return out


@pytest.mark.parametrize("mutate_outside", [False, True])
def test_in_place_steps_in_the_mask(mutate_outside):
    model = CausalBuiltInPlace(mutate_outside)
    q, k, v, _ = _inputs(24, keys=24)
    with torch.no_grad(), collect_reports() as report:
        got = _compile(model)(q, k, v)
    want = model(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    (region,) = report.regions
    assert region.swapped is not mutate_outside
    if mutate_outside:
        assert "changes a tensor of the mask's computation in place" in str(region.reason)


def test_only_the_key_repeated_keeps_the_value_as_it_is():
    """A call whose key alone is repeated (value already has the query's heads) still gets the causal
    rewrite, on the tensors as they are."""

    class KeyOnly(torch.nn.Module):
        def forward(self, q, k, v):
            rows = torch.arange(q.shape[2], device=q.device)
            mask = rows[None, :] <= rows[:, None]
            return torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, 3), v, attn_mask=mask)

    q, k, _, _ = _inputs(24, keys=24)
    v = torch.randn(2, 6, 24, 16, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    with torch.no_grad(), collect_reports() as report:
        got = _compile(KeyOnly())(q, k, v)
    assert [r.swapped for r in report.regions] == [True]
    torch.testing.assert_close(got, KeyOnly()(q, k, v), rtol=1e-4, atol=1e-4)


def test_one_repeat_read_as_key_and_value_is_erased_once():
    class SameRepeat(torch.nn.Module):
        def forward(self, q, k, mask):
            kv = repeat_kv(k, 3)
            return torch.nn.functional.scaled_dot_product_attention(q, kv, kv, attn_mask=mask, scale=0.3)

    q, k, _, mask = _inputs(1)
    with torch.no_grad(), record_graphs() as graphs, collect_reports() as report, warnings.catch_warnings():
        warnings.filterwarnings("error", message="erase_node")  # FX warns on erasing a node twice
        got = _compile(SameRepeat())(q, k, mask)
    assert [r.swapped for r in report.regions] == [True]
    assert "expand" not in graphs.after[0]
    torch.testing.assert_close(got, SameRepeat()(q, k, mask), rtol=1e-4, atol=1e-5)
