"""A user's own SiluAndMul module swapped for a custom-op kernel: the graphs before and after,
the AOTAutograd forward and backward graphs, and the numerics."""

import expecttest
import torch

from twinkle_fx import register_external_layer, register_layer_kernel
from twinkle_fx.testing import record_graphs

from compile_kernels import GatedMLP, SiluAndMul, SiluAndMulKernel


def _register():
    register_layer_kernel(kernel_name="SiluAndMul", layer=SiluAndMulKernel, device="cpu")
    register_external_layer(SiluAndMul, "SiluAndMul")


class TestSiluAndMulSwap(expecttest.TestCase):
    def test_graph_diff_and_aot_graphs(self):
        _register()
        torch.manual_seed(0)
        model = GatedMLP()
        x = torch.randn(3, 8)
        with record_graphs() as graphs:
            out = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})(x)
            out.sum().backward()
        self.assertExpectedInline(graphs.diff(), """\
@@
 
-        getitem: "f32[3, 16]" = linear[(Ellipsis, slice(None, 16, None))]
-        silu: "f32[3, 16]" = torch.nn.functional.silu(getitem);  getitem = None
-        getitem_1: "f32[3, 16]" = linear[(Ellipsis, slice(16, None, None))];  linear = None
-        mul: "f32[3, 16]" = silu * getitem_1;  silu = getitem_1 = None
+        layer_silu_and_mul: "f32[3, 16]" = twinkle_layer_SiluAndMul(linear);  linear = None
 
-        linear_1: "f32[3, 8]" = torch._C._nn.linear(mul, l_self_modules_down_parameters_weight_, l_self_modules_down_parameters_bias_);  mul = l_self_modules_down_parameters_weight_ = l_self_modules_down_parameters_bias_ = None
+        linear_1: "f32[3, 8]" = torch._C._nn.linear(layer_silu_and_mul, l_self_modules_down_parameters_weight_, l_self_modules_down_parameters_bias_);  layer_silu_and_mul = l_self_modules_down_parameters_weight_ = l_self_modules_down_parameters_bias_ = None
         return (linear_1,)
""")
        self.assertExpectedInline(graphs.forward[0], """\
class GraphModule(torch.nn.Module):
    def forward(self, primals_1: "f32[32, 8]", primals_2: "f32[32]", primals_3: "f32[3, 8]", primals_4: "f32[8, 16]", primals_5: "f32[8]"):

        t: "f32[8, 32]" = torch.ops.aten.t.default(primals_1);  primals_1 = None
        addmm: "f32[3, 32]" = torch.ops.aten.addmm.default(primals_2, primals_3, t);  primals_2 = t = None

        silu_and_mul: "f32[3, 16]" = torch.ops.twinkle_test.silu_and_mul.default(addmm)

        t_1: "f32[16, 8]" = torch.ops.aten.t.default(primals_4)
        addmm_1: "f32[3, 8]" = torch.ops.aten.addmm.default(primals_5, silu_and_mul, t_1);  primals_5 = t_1 = None
        return (addmm_1, primals_3, primals_4, addmm, silu_and_mul)
""")
        self.assertExpectedInline(graphs.backward[0], """\
class GraphModule(torch.nn.Module):
    def forward(self, primals_3: "f32[3, 8]", primals_4: "f32[8, 16]", addmm: "f32[3, 32]", silu_and_mul: "f32[3, 16]", tangents_1: "f32[3, 8]"):

        t_1: "f32[16, 8]" = torch.ops.aten.t.default(primals_4);  primals_4 = None
        t_2: "f32[8, 16]" = torch.ops.aten.t.default(t_1);  t_1 = None
        mm: "f32[3, 16]" = torch.ops.aten.mm.default(tangents_1, t_2);  t_2 = None
        t_3: "f32[8, 3]" = torch.ops.aten.t.default(tangents_1)
        mm_1: "f32[8, 16]" = torch.ops.aten.mm.default(t_3, silu_and_mul);  t_3 = silu_and_mul = None
        t_4: "f32[16, 8]" = torch.ops.aten.t.default(mm_1);  mm_1 = None
        sum_1: "f32[1, 8]" = torch.ops.aten.sum.dim_IntList(tangents_1, [0], True);  tangents_1 = None
        view: "f32[8]" = torch.ops.aten.view.default(sum_1, [8]);  sum_1 = None
        t_5: "f32[8, 16]" = torch.ops.aten.t.default(t_4);  t_4 = None

        silu_and_mul_backward: "f32[3, 32]" = torch.ops.twinkle_test.silu_and_mul_backward.default(mm, addmm);  mm = addmm = None

        t_6: "f32[32, 3]" = torch.ops.aten.t.default(silu_and_mul_backward)
        mm_2: "f32[32, 8]" = torch.ops.aten.mm.default(t_6, primals_3);  t_6 = primals_3 = None
        t_7: "f32[8, 32]" = torch.ops.aten.t.default(mm_2);  mm_2 = None
        sum_2: "f32[1, 32]" = torch.ops.aten.sum.dim_IntList(silu_and_mul_backward, [0], True);  silu_and_mul_backward = None
        view_1: "f32[32]" = torch.ops.aten.view.default(sum_2, [32]);  sum_2 = None
        t_8: "f32[32, 8]" = torch.ops.aten.t.default(t_7);  t_7 = None
        return (t_8, view_1, None, t_5, view)
""")

    def test_numerics_match_eager(self):
        _register()
        torch.manual_seed(0)
        model = GatedMLP()
        x = torch.randn(2, 5, 8)
        compiled = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})
        got = compiled(x)
        got.square().sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        want = model(x)
        want.square().sum().backward()
        torch.testing.assert_close(got, want)
        for g, p in zip(grads, model.parameters()):
            torch.testing.assert_close(g, p.grad)
