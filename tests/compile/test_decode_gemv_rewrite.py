"""The decode_gemv pass: linears on a few rows become GEMV kernel calls, q/k/v in one launch, gate/up
with the SwiGLU product, o/down with the residual add."""

from __future__ import annotations

import expecttest
import pytest
import torch

from tiny_models import DEVICE, tiny
from twinkle_fx.compiler import collect_reports
from twinkle_fx.core.registry import scoped_registry
from twinkle_fx.testing import record_graphs


class Block(torch.nn.Module):
    """A decoder layer's linears: q/k/v with biases on one input, o and down added to the residual,
    gate and up in a SwiGLU product."""

    def __init__(self, hidden: int = 8, inter: int = 12) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(hidden, n) for n in (hidden, hidden // 2, hidden // 2))
        self.o = torch.nn.Linear(hidden, hidden, bias=False)
        self.gate, self.up = (torch.nn.Linear(hidden, inter, bias=False) for _ in range(2))
        self.down = torch.nn.Linear(inter, hidden, bias=False)

    def forward(self, h):
        attn = self.q(h) * torch.cat([self.k(h), self.v(h)], dim=-1)
        h = h + self.o(attn)
        return h + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


def _compile(model, **options):
    return torch.compile(model, backend="twinkle", dynamic=False,
                         options={"compiler": "aot_eager", "decode_gemv": True, **options})


def _swapped(report):
    return [(r.target, r.kernel) for r in report.regions if r.swapped]


class TestExpectedRewrite(expecttest.TestCase):
    def test_a_decoder_layers_linears_at_one_row(self):
        model = Block().to(DEVICE)
        h = torch.randn(1, 1, 8, device=DEVICE)
        with torch.no_grad(), record_graphs() as graphs, collect_reports() as report:
            got = _compile(model)(h)
        torch.testing.assert_close(got, model(h), rtol=1e-5, atol=1e-5)
        self.assertEqual(_swapped(report), [
            ("3 linear(s) on 1 row(s)", "twinkle_triton.gemv"),
            ("linear + residual on 1 row(s)", "twinkle_triton.gemv"),
            ("silu(linear) * linear on 1 row(s)", "twinkle_triton.gemv_swiglu"),
            ("linear + residual on 1 row(s)", "twinkle_triton.gemv"),
        ])
        self.assertExpectedInline(graphs.after[0].split("def forward")[1], """\
(self, L_self_modules_q_parameters_weight_: "f32[8, 8]", L_self_modules_q_parameters_bias_: "f32[8]", L_h_: "f32[1, 1, 8]", L_self_modules_k_parameters_weight_: "f32[4, 8]", L_self_modules_k_parameters_bias_: "f32[4]", L_self_modules_v_parameters_weight_: "f32[4, 8]", L_self_modules_v_parameters_bias_: "f32[4]", L_self_modules_o_parameters_weight_: "f32[8, 8]", L_self_modules_gate_parameters_weight_: "f32[12, 8]", L_self_modules_up_parameters_weight_: "f32[12, 8]", L_self_modules_down_parameters_weight_: "f32[8, 12]"):
        l_self_modules_q_parameters_weight_ = L_self_modules_q_parameters_weight_
        l_self_modules_q_parameters_bias_ = L_self_modules_q_parameters_bias_
        l_h_ = L_h_
        l_self_modules_k_parameters_weight_ = L_self_modules_k_parameters_weight_
        l_self_modules_k_parameters_bias_ = L_self_modules_k_parameters_bias_
        l_self_modules_v_parameters_weight_ = L_self_modules_v_parameters_weight_
        l_self_modules_v_parameters_bias_ = L_self_modules_v_parameters_bias_
        l_self_modules_o_parameters_weight_ = L_self_modules_o_parameters_weight_
        l_self_modules_gate_parameters_weight_ = L_self_modules_gate_parameters_weight_
        l_self_modules_up_parameters_weight_ = L_self_modules_up_parameters_weight_
        l_self_modules_down_parameters_weight_ = L_self_modules_down_parameters_weight_

        gemv: "f32[1, 1, 16]" = twinkle_gemv(l_h_, [l_self_modules_q_parameters_weight_, l_self_modules_k_parameters_weight_, l_self_modules_v_parameters_weight_], [l_self_modules_q_parameters_bias_, l_self_modules_k_parameters_bias_, l_self_modules_v_parameters_bias_], None);  l_self_modules_q_parameters_weight_ = l_self_modules_k_parameters_weight_ = l_self_modules_v_parameters_weight_ = l_self_modules_q_parameters_bias_ = l_self_modules_k_parameters_bias_ = l_self_modules_v_parameters_bias_ = None
        narrow: "f32[1, 1, 8]" = torch.narrow(gemv, -1, 0, 8)
        narrow_1: "f32[1, 1, 4]" = torch.narrow(gemv, -1, 8, 4)
        narrow_2: "f32[1, 1, 4]" = torch.narrow(gemv, -1, 12, 4);  gemv = None
        cat: "f32[1, 1, 8]" = torch.cat([narrow_1, narrow_2], dim = -1);  narrow_1 = narrow_2 = None
        attn: "f32[1, 1, 8]" = narrow * cat;  narrow = cat = None

        gemv_1: "f32[1, 1, 8]" = twinkle_gemv(attn, [l_self_modules_o_parameters_weight_], None, l_h_);  attn = l_self_modules_o_parameters_weight_ = l_h_ = None

        gemv_swiglu: "f32[1, 1, 12]" = twinkle_gemv_swiglu(gemv_1, l_self_modules_gate_parameters_weight_, l_self_modules_up_parameters_weight_);  l_self_modules_gate_parameters_weight_ = l_self_modules_up_parameters_weight_ = None
        gemv_2: "f32[1, 1, 8]" = twinkle_gemv(gemv_swiglu, [l_self_modules_down_parameters_weight_], None, gemv_1);  gemv_swiglu = l_self_modules_down_parameters_weight_ = gemv_1 = None
        return (gemv_2,)
""")


@pytest.mark.parametrize("rows", [(1, 1), (2, 3)])
def test_matches_eager_and_leaves_no_linear(rows):
    model = Block(hidden=16, inter=24).to(DEVICE)
    h = torch.randn(*rows, 16, device=DEVICE)
    with torch.no_grad(), record_graphs() as graphs:
        got = _compile(model)(h)
    torch.testing.assert_close(got, model(h), rtol=1e-5, atol=1e-5)
    assert "linear(" not in graphs.after[0]
    assert graphs.after[0].count("twinkle_gemv(") == 3 and graphs.after[0].count("twinkle_gemv_swiglu(") == 1


def test_auto_rewrites_only_inference_graphs_on_cuda_at_one_row():
    model = Block().to(DEVICE)
    for rows, grad in (((1, 1), False), ((1, 2), False), ((1, 1), True)):
        torch._dynamo.reset()
        h = torch.randn(*rows, 8, device=DEVICE)
        with torch.set_grad_enabled(grad), collect_reports() as report:
            _compile(model, decode_gemv="auto")(h)
        rewritten = bool(_swapped(report))
        assert rewritten == (DEVICE == "cuda" and rows == (1, 1) and not grad), (rows, grad, _swapped(report))


def test_more_rows_than_the_kernel_takes_are_left_to_the_gemm():
    model = Block().to(DEVICE)
    with torch.no_grad(), collect_reports() as report:
        _compile(model)(torch.randn(17, 8, device=DEVICE))
    assert _swapped(report) == []


def test_a_linear_read_twice_keeps_its_own_output():
    class TwoUses(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.up, self.o = (torch.nn.Linear(8, 8, bias=False) for _ in range(3))

        def forward(self, h):
            g = self.gate(h)  # read by silu and by the residual add below: no SwiGLU fusion
            y = torch.nn.functional.silu(g) * self.up(h)
            return y + g + self.o(h)

    model = TwoUses().to(DEVICE)
    h = torch.randn(1, 8, device=DEVICE)
    with torch.no_grad(), collect_reports() as report:
        got = _compile(model)(h)
    torch.testing.assert_close(got, model(h), rtol=1e-5, atol=1e-5)
    assert [t for t, _ in _swapped(report)] == ["3 linear(s) on 1 row(s)"]


def test_auto_leaves_an_lm_head_to_cublas(monkeypatch):
    """A lone linear with a weight over AUTO_MAX_LONE_WEIGHT elements stays cuBLAS's under "auto"; with a
    residual to add, or grouped, it is rewritten."""
    from twinkle_fx.compiler.passes import decode_gemv

    monkeypatch.setattr(decode_gemv, "AUTO_MAX_LONE_WEIGHT", 8 * 8 - 1)  # the Block's o_proj is 8 x 8
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    torch.compile(Block().to(DEVICE), backend=backend)(torch.randn(1, 8, device=DEVICE))
    linears = [n for n in graphs[0].graph.nodes if decode_gemv.linear_args(n) is not None]
    lone = [[n] for n in linears]
    # q, k, v, o, gate, up, down taken one by one: q (64 elements), gate and up (96) are left; k and v are
    # small; o and down add the residual
    assert [decode_gemv.left_to_cublas(group) for group in lone] == [True, False, False, False, True, True, False]
    assert not decode_gemv.left_to_cublas(lone[0] + lone[1])  # q with k: one launch, no concatenation


def test_removed_from_the_registry_it_rewrites_nothing():
    model = Block().to(DEVICE)
    with scoped_registry() as registry, torch.no_grad(), collect_reports() as report:
        registry.remove_graph_rewrite("decode_gemv")
        _compile(model)(torch.randn(1, 8, device=DEVICE))
    assert _swapped(report) == []


@pytest.mark.slow
def test_a_qwen2_decode_step_keeps_its_logits():
    model = tiny("qwen2").eval()
    ids = torch.randint(0, 128, (1, 9), device=DEVICE)
    with torch.no_grad():
        cache = model(ids[:, :-1], use_cache=True).past_key_values
        want = model(ids[:, -1:], past_key_values=cache).logits
        cache = model(ids[:, :-1], use_cache=True).past_key_values
        with collect_reports() as report:
            got = _compile(model)(ids[:, -1:], past_key_values=cache).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    kernels = [k for _, k in _swapped(report)]
    layers = model.config.num_hidden_layers
    assert kernels.count("twinkle_triton.gemv_swiglu") == layers, _swapped(report)
    assert kernels.count("twinkle_triton.gemv") == 3 * layers + 1, _swapped(report)  # qkv, o, down; lm_head


@pytest.mark.slow
def test_swapped_norms_and_mlps_open_into_the_gemvs():
    """With the built-in layer kernels swapped in, each MLP layer call becomes its two GEMVs (the residual added
    in down's) and each norm before q/k/v or the MLP moves into the GEMVs' prologue; the final norm, read by the
    LM head, stays a layer call."""
    from twinkle_fx.builtin import use_builtin_kernels

    model = tiny("qwen2").eval()
    ids = torch.randint(0, 128, (1, 9), device=DEVICE)
    layers = model.config.num_hidden_layers
    with torch.no_grad():
        cache = model(ids[:, :-1], use_cache=True).past_key_values
        want = model(ids[:, -1:], past_key_values=cache).logits
        cache = model(ids[:, :-1], use_cache=True).past_key_values
        with scoped_registry(), record_graphs() as graphs, collect_reports() as report:
            use_builtin_kernels(devices=(torch.device(DEVICE).type,), models=("qwen2",))
            got = _compile(model)(ids[:, -1:], past_key_values=cache).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    targets = [t for t, _ in _swapped(report)]
    assert targets.count("SwiGLUMLP layer + residual on 1 row(s)") == layers, targets
    assert targets.count("RMSNorm layer into 1 GEMV(s) on 1 row(s)") == 2 * layers, targets
    graph = graphs.after[-1]
    assert "SwiGLUMLP(" not in graph and graph.count("RMSNorm(") == 1, graph
    assert graph.count("twinkle_gemv_swiglu(") == layers
