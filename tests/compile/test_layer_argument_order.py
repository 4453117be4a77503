"""A layer kernel is called with ``forward``'s arguments in the signature's order, not in the order
the graph first reads them: a layer whose body reads its second argument first still gets ``(x, y)``."""

import torch

from twinkle_fx import kernelize_model, register_external_layer, register_layer_kernel
from twinkle_fx.compiler import collect_reports


class ReadsYFirst(torch.nn.Module):
    """``forward(x, y)`` whose body reads ``y`` before ``x``: the graph meets them as (y, x)."""

    def forward(self, x, y):
        return y * 2 + x.sin()


class ReadsYFirstKernel(torch.nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, x, y):
        return y * 2 + x.sin() + 0.5  # the offset shows that the kernel ran


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.layer = ReadsYFirst()

    def forward(self, x, y):
        return self.layer(self.proj(x), y)


def test_a_layer_kernel_gets_its_arguments_in_signature_order_whatever_the_graph_reads_first():
    register_layer_kernel(kernel_name="ReadsYFirst", layer=ReadsYFirstKernel, device="cpu")
    register_external_layer(ReadsYFirst, "ReadsYFirst")
    torch.manual_seed(0)
    model = Model()
    # different shapes and values: swapped arguments would broadcast to other numbers
    x, y = torch.randn(4, 8), torch.linspace(-1, 1, 8)
    with torch.no_grad():
        original = model(x, y)
        with collect_reports() as report:
            got = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})(x, y)
        kernelize_model(model, mode="inference", device="cpu", use_fallback=False)
        want = model(x, y)
    assert [r.swapped for g in report.graphs for r in g.regions] == [True], report.summary()
    assert not torch.allclose(want, original)
    torch.testing.assert_close(got, want)
