"""The matmul_sums rewrite: a sum of matrix products read only by opaque ops (a layer input's gradient from q, k
and v before a swapped norm's backward) becomes twinkle_fx::matmul_sum, GEMMs that accumulate, with the numbers
of the add; sums Inductor would fuse, or with other terms, stay."""

import logging
import re

import expecttest
import pytest
import torch
import transformers
from tiny_models import TINY, compiled_afresh, eager_grads, input_ids

import twinkle_fx
from twinkle_fx.builtin import use_builtin_kernels
from twinkle_fx.compiler.inner.matmul_sums import matmul_sum, rewrite_matmul_sums
from twinkle_fx.testing import record_graphs

from device_under_test import DEVICE
from dtype_tolerance import assert_close


def _llama(layers: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("llama", **{**TINY, "num_hidden_layers": layers})
    return transformers.AutoModelForCausalLM.from_config(config).to(DEVICE)


def _compiled_step(model, ids, options=None, dynamic=None):
    """The backward graph's code and every gradient of one step compiled with aot_eager, the built-in kernels
    swapped (the norms' backward, an opaque op, reads each layer input's gradient)."""
    model.zero_grad()
    with twinkle_fx.scoped_registry(), record_graphs() as graphs:
        use_builtin_kernels(devices=(DEVICE,))
        compiled = twinkle_fx.compile(model, options={"compiler": "aot_eager", **(options or {})}, dynamic=dynamic)
        compiled(ids, labels=ids).loss.backward()
    return graphs.backward[0], [p.grad.clone() for p in model.parameters()]


def test_each_layer_inputs_gradient_sum_is_one_accumulating_chain_with_the_gradients_of_eager():
    model, ids = _llama(layers=2), input_ids()
    code, grads = _compiled_step(model, ids)
    products = [len(a.split(",")) for a in re.findall(r"twinkle_fx\.matmul_sum\.default\(\[([^]]*)\]", code)]
    assert sorted(products) == [2, 2, 3, 3]  # per layer: q/k/v's three products and gate/up's two
    for got, want in zip(grads, eager_grads(model, ids)):
        assert_close(got, want, torch.float32, "gradient")


def test_symbolic_token_counts_are_rewritten_with_the_graphs_own_sizes():
    model, ids = _llama(layers=1), input_ids(seq=7)
    code, grads = _compiled_step(model, ids, dynamic=True)
    assert code.count("twinkle_fx.matmul_sum.default(") == 2 and '"Sym(' in code  # sizes are graph inputs
    for got, want in zip(grads, eager_grads(model, ids)):
        assert_close(got, want, torch.float32, "gradient")


def test_the_option_and_the_registry_each_turn_it_off():
    model, ids = _llama(layers=1), input_ids()
    code, _ = _compiled_step(model, ids, {"matmul_sums": False})
    assert "matmul_sum" not in code
    torch._dynamo.reset()
    with twinkle_fx.scoped_registry() as registry:
        registry.remove_graph_rewrite("matmul_sums")
        code, _ = _compiled_step(model, ids)
    assert "matmul_sum" not in code


def test_a_rewrite_that_raises_is_reported_and_the_graph_compiles_without_it(monkeypatch, caplog):
    from twinkle_fx.compiler.inner import matmul_sums
    from twinkle_fx.compiler.inner.post_grad import PostGradRewrite

    def broken(graph):
        raise RuntimeError("no such node")

    monkeypatch.setattr(matmul_sums, "REWRITE", PostGradRewrite("matmul_sums", broken, lambda: "broken"))
    model, ids = _llama(layers=1), input_ids()
    with caplog.at_level(logging.WARNING, logger="twinkle_fx.compiler.inner.post_grad"):
        code, grads = _compiled_step(model, ids)
    assert "matmul_sum" not in code and "embedding_grad_sums" in code  # the other rewrite still ran
    assert any("the matmul_sums rewrite failed on a graph (RuntimeError: no such node)" in r.getMessage()
               and "options={'matmul_sums': False}" in r.getMessage() for r in caplog.records)
    for got, want in zip(grads, eager_grads(model, ids)):
        assert_close(got, want, torch.float32, "gradient")


def _traced(fn, *args):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*args)


def _opaque_read(x, w=None):
    """An op Inductor cannot fuse into (a custom op): the sum it reads is a kernel of its own."""
    w = x.new_ones((x.shape[-1], 1)) if w is None else w
    return torch.ops.twinkle_fx.matmul_sum.default([x.reshape(-1, x.shape[-1])], [w])


class TestExpectedRewrite(expecttest.TestCase):
    def test_three_products_of_the_tokens_become_one_chain_largest_inner_dimension_first(self):
        def grad_of_input(dq, wq, dk, wk, dv, wv, w):
            total = (dv @ wv).view(2, 3, 8) + (dk @ wk).view(2, 3, 8)
            return _opaque_read(total + (dq @ wq).view(2, 3, 8), w)

        args = tuple(torch.randn(*shape, device=DEVICE) for shape in ((6, 8), (8, 8), (6, 4), (4, 8), (6, 4), (4, 8),
                                                                       (8, 2)))
        traced = _traced(grad_of_input, *args)
        assert rewrite_matmul_sums(traced.graph) == 1
        traced.recompile()
        torch.testing.assert_close(traced(*args), grad_of_input(*args))
        self.assertExpectedInline(traced.code.strip(), """\
def forward(self, dq_1, wq_1, dk_1, wk_1, dv_1, wv_1, w_1):
    matmul_sum_default = torch.ops.twinkle_fx.matmul_sum.default([dq_1, dv_1, dk_1], [wq_1, wv_1, wk_1]);  dq_1 = dv_1 = dk_1 = wq_1 = wv_1 = wk_1 = None
    view_default = torch.ops.aten.view.default(matmul_sum_default, [2, 3, 8]);  matmul_sum_default = None
    view_3 = torch.ops.aten.view.default(view_default, [-1, 8]);  view_default = None
    matmul_sum = torch.ops.twinkle_fx.matmul_sum.default([view_3], [w_1]);  view_3 = w_1 = None
    return matmul_sum""")


def _a(m=6, k=8):
    return torch.randn(m, k, device=DEVICE)


def _b(k=8, n=5):
    return torch.randn(k, n, device=DEVICE)


_LEFT_ALONE = {
    "pointwise reader": lambda a, b, c, d: ((a @ b) + (c @ d)).relu(),
    "another term": lambda a, b, c, d: _opaque_read((a @ b) + (c @ d) + a[:, :5]),
    "broadcast": lambda a, b, c, d: _opaque_read((a @ b) + (c[:1] @ d)),
    "product read twice": lambda a, b, c, d: (lambda p: (_opaque_read(p + (c @ d)), p))(a @ b),
    "two dtypes": lambda a, b, c, d: _opaque_read((a @ b) + (c.double() @ d.double())),
}


@pytest.mark.parametrize("case", _LEFT_ALONE)
def test_sums_inductor_fuses_or_that_are_not_all_products_of_one_type_stay(case):
    traced = _traced(_LEFT_ALONE[case], _a(), _b(), _a(k=3), _b(k=3))
    assert rewrite_matmul_sums(traced.graph) == 0


def test_a_higher_order_op_reading_the_sum_through_a_view_counts_as_opaque():
    """On a GPU the built-in kernels are triton_ops: in the traced graph the norm's backward is its kernel launch,
    a higher-order op, reading the sum through a reshape."""
    import torch.fx as fx
    from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_functional

    traced = _traced(lambda a, b, c, d: ((a @ b) + (c @ d)).view(-1), _a(), _b(), _a(k=3), _b(k=3))
    assert rewrite_matmul_sums(_traced(lambda a, b, c, d: ((a @ b) + (c @ d)).view(-1), _a(), _b(), _a(k=3),
                                       _b(k=3)).graph) == 1  # the graph's output reads it
    graph = traced.graph
    out = next(n for n in graph.nodes if n.op == "output")
    flat = out.args[0][0] if isinstance(out.args[0], (list, tuple)) else out.args[0]
    with graph.inserting_before(out):
        launch = graph.call_function(triton_kernel_wrapper_functional,
                                     kwargs={"kernel_idx": 0, "constant_args_idx": 0, "grid": [(1, 1, 1)],
                                             "tma_descriptor_metadata": {}, "kwargs": {"x": flat},
                                             "tensors_to_clone": []})
    out.args = (launch,)
    assert isinstance(launch, fx.Node) and rewrite_matmul_sums(graph) == 1


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("terms", (1, 2, 3))
def test_the_op_against_the_products_summed_forward_and_backward_on_odd_shapes_and_strides(dtype, terms):
    torch.manual_seed(terms)
    m, n, ks = 37, 19, (23, 5, 41)[:terms]
    # a[1] and b[0] transposed views, as a backward graph hands them (the weight read as [in, out])
    a = [torch.randn(m, k, device=DEVICE, dtype=dtype) if i != 1 else
         torch.randn(k, m, device=DEVICE, dtype=dtype).t() for i, k in enumerate(ks)]
    b = [torch.randn(k, n, device=DEVICE, dtype=dtype) if i != 0 else
         torch.randn(n, k, device=DEVICE, dtype=dtype).t() for i, k in enumerate(ks)]
    for t in a + b:
        t.requires_grad_(True)
    got = matmul_sum(a, b)
    want = sum((x.double() @ y.double() for x, y in zip(a, b)), torch.zeros((), dtype=torch.float64, device=DEVICE))
    torch_sum = sum(x @ y for x, y in zip(a, b))  # the products rounded, then added: what the graph computed
    grad = torch.randn_like(got)

    def error(x):
        return ((x.double() - want).norm() / want.norm()).item()

    # within the error of PyTorch's own sum in this dtype, against fp64 (the roundings differ, not their number)
    assert error(got) <= 2 * error(torch_sum) + 1e-6
    for g, w in zip(torch.autograd.grad(got, a + b, grad), torch.autograd.grad(want, a + b, grad.double())):
        assert_close(g, w, dtype, "gradient")  # both in the inputs' dtype, the reference's from fp64


def test_opcheck():
    a, b = [_a(), _a(k=3)], [_b(), _b(k=3)]
    torch.library.opcheck(torch.ops.twinkle_fx.matmul_sum.default, (a, b))


@pytest.mark.parametrize("a, b, error, words", [
    ([], [], ValueError, "at least one"),
    ([torch.ones(2, 3)], [torch.ones(3, 4), torch.ones(3, 4)], ValueError, "the same number"),
    ([torch.ones(2, 3, 1)], [torch.ones(3, 4)], ValueError, "a[0] is not a 2-D tensor"),
    ([torch.ones(2, 3)], [torch.ones(4, 4)], ValueError, "inner dimensions differ"),
    ([torch.ones(2, 3), torch.ones(3, 3)], [torch.ones(3, 4), torch.ones(3, 4)], ValueError, "one shape"),
    ([torch.ones(2, 3)], [torch.ones(3, 4, dtype=torch.float64)], TypeError, "b[0] is torch.float64"),
])
def test_arguments_it_cannot_sum_are_refused_by_name(a, b, error, words):
    with pytest.raises(error, match=words.replace("[", r"\[").replace("]", r"\]")):
        matmul_sum(a, b)


@pytest.mark.slow
def test_under_inductor_the_sums_are_rewritten_with_the_gradients_of_eager(caplog):
    model, ids = _llama(layers=1), input_ids()
    model.to(torch.bfloat16)
    model.zero_grad()
    with caplog.at_level(logging.INFO, logger="twinkle_fx.compiler.inner.matmul_sums"), compiled_afresh(), \
            twinkle_fx.scoped_registry():
        use_builtin_kernels(devices=(DEVICE,))
        # every region swapped: the norms' backward (opaque) reads the sums, as under CUDA graphs
        twinkle_fx.compile(model, options={"swap_policy": "always"})(ids, labels=ids).loss.backward()
    assert any(r.getMessage().startswith("matmul_sums: 2 sum(s) of matrix products") for r in caplog.records)
    grads = [p.grad.clone() for p in model.parameters()]
    for got, want in zip(grads, eager_grads(model, ids)):
        assert_close(got, want, torch.bfloat16, "gradient")
