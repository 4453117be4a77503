"""Backend behaviour: options, mode, recompiles with dynamic shapes, train/eval, graph breaks,
models with nothing registered, opaque kernels, shape guards and verify."""

import functools
import logging
import re

import pytest
import torch
import torch.nn.functional as F
from compile_kernels import GatedMLP, SiluAndMul, SiluAndMulKernel, silu_and_mul_reference

import twinkle_fx
from twinkle_fx import register_external_layer, register_layer_kernel
from twinkle_fx.compiler import collect_reports
from twinkle_fx.core.reasons import ReasonKind
from twinkle_fx.testing import record_graphs


def _register(kernel=SiluAndMulKernel, **kwargs):
    register_layer_kernel(kernel_name="SiluAndMul", layer=kernel, device="cpu", **kwargs)
    register_external_layer(SiluAndMul, "SiluAndMul")


def test_backend_name_resolves_to_the_twinkle_backend():
    from twinkle_fx.compiler.backend import twinkle_backend

    assert torch._dynamo.lookup_backend("twinkle") is twinkle_backend


def test_unknown_option_is_an_error_naming_it():
    # raised when the backend first runs (torch.compile passes options to a backend only then), as
    # the ValueError itself: not wrapped in Dynamo's BackendCompilerFailed
    with pytest.raises(ValueError, match="'compilr'.*valid options: compiler, mode, verify, report") as e:
        torch.compile(GatedMLP(), backend="twinkle", options={"compilr": "eager"})(torch.randn(2, 8))
    assert not isinstance(e.value, torch._dynamo.exc.BackendCompilerFailed)
    with pytest.raises(ValueError, match="valid compilers: inductor, aot_eager, eager"):
        torch.compile(GatedMLP(), backend="twinkle", options={"compiler": "tvm"})(torch.randn(2, 8))


def test_mode_defaults_to_training_with_grad_else_inference_and_an_option_overrides():
    model, x = GatedMLP(), torch.randn(2, 8)
    with collect_reports() as report:
        torch.compile(model, backend="twinkle", options={"compiler": "eager"})(x)
        with torch.no_grad():
            torch.compile(model, backend="twinkle", options={"compiler": "eager"})(x)
        torch._dynamo.reset()
        torch.compile(model, backend="twinkle", options={"compiler": "eager", "mode": "inference"})(x)
    assert [g.mode for g in report.graphs] == ["train+compile", "inference+compile", "inference+compile"]


def test_dynamic_shapes_recompile_keeps_the_rewrite():
    _register()
    model = GatedMLP()
    compiled = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})
    with record_graphs() as graphs, collect_reports() as report:
        for seq in (5, 7):
            x = torch.randn(2, seq, 8)
            torch.testing.assert_close(compiled(x), model(x))
    assert report.graph_count == 2
    header = graphs.after[1].split("def forward", 1)[1].split("):", 1)[0]
    assert re.search(r'\bs\d+: "Sym\(', header), header  # a SymInt input: the recompile made a dynamic graph
    assert not re.search(r'\bs\d+: "Sym\(', graphs.after[0].split("def forward", 1)[1].split("):", 1)[0])
    assert all(len(g.regions) == 1 and g.regions[0].swapped for g in report.graphs)
    assert "twinkle_test.silu_and_mul" in graphs.forward[1]


class TrainOnly(SiluAndMulKernel):
    pass


class InferenceOnly(SiluAndMulKernel):
    has_backward = False


def test_train_eval_switch_selects_per_mode():
    _register(TrainOnly, mode="train+compile")
    register_layer_kernel(kernel_name="SiluAndMul", layer=InferenceOnly, device="cpu", mode="compile")
    model = GatedMLP()
    compiled = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})
    with collect_reports() as report:
        compiled(torch.randn(3, 8)).sum().backward()
        model.eval()
        with torch.no_grad():
            compiled(torch.randn(3, 8))
    kernels = [(g.mode, g.regions[0].kernel.split(" from ")[1]) for g in report.graphs]
    assert kernels == [("train+compile", "impl TrainOnly"), ("inference+compile", "impl InferenceOnly")]


class BreakingSiluAndMul(torch.nn.Module):
    def forward(self, x):
        d = x.shape[-1] // 2
        gate = F.silu(x[..., :d])
        torch._dynamo.graph_break()
        return gate * x[..., d:]


def test_graph_break_inside_a_registered_layer_is_reported_not_swapped():
    register_layer_kernel(kernel_name="SiluAndMul", layer=SiluAndMulKernel, device="cpu")
    register_external_layer(BreakingSiluAndMul, "SiluAndMul")
    model = GatedMLP()
    model.act = BreakingSiluAndMul()
    x = torch.randn(3, 8)
    with collect_reports() as report:
        out = torch.compile(model, backend="twinkle", options={"compiler": "eager"})(x)
    torch.testing.assert_close(out, model(x))
    assert report.graph_breaks >= 1 and report.swapped == []
    (split,) = {(r.target, r.reason.kind) for r in report.not_swapped}
    assert split == ("BreakingSiluAndMul -> SiluAndMul", ReasonKind.GRAPH_BREAK)


def test_model_without_registered_targets_is_unchanged():
    _register()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    with record_graphs() as graphs, collect_reports() as report:
        torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})(torch.randn(2, 8))
    assert graphs.before == graphs.after
    assert report.regions == [] and "(graph unchanged)" in str(report)


class _NumpySiluAndMul(torch.autograd.Function):
    """Forward through numpy: needs real data, like a raw Triton launch on data pointers."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.from_numpy(silu_and_mul_reference(x.detach()).numpy().copy())

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            leaf = x.detach().requires_grad_()
            return torch.autograd.grad(silu_and_mul_reference(leaf), leaf, grad)[0]


class UntraceableKernel(torch.nn.Module):
    has_backward = True
    can_torch_compile = False

    def forward(self, x):
        return _NumpySiluAndMul.apply(x)


@pytest.mark.parametrize("train", [False, True])
def test_untraceable_kernel_is_wrapped_opaquely(train):
    _register(UntraceableKernel)
    model = GatedMLP().train(train)
    x = torch.randn(3, 8)
    with collect_reports() as report, torch.set_grad_enabled(train):
        out = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})(x)
    (region,) = report.regions
    assert region.swapped and region.how == "opaque custom op, can_torch_compile=False"
    torch.testing.assert_close(out, model(x))
    if train:
        grads = torch.autograd.grad(out.sum(), list(model.parameters()))
        want = torch.autograd.grad(model(x).sum(), list(model.parameters()))
        for g, w in zip(grads, want):
            torch.testing.assert_close(g, w)


class WrongShapeKernel(SiluAndMulKernel):
    def forward(self, x):
        return x * 2


def test_shape_guard_keeps_the_region():
    _register(WrongShapeKernel)
    report = twinkle_fx.explain(GatedMLP(), torch.randn(3, 8))
    (region,) = report.regions
    assert not region.swapped and region.reason.kind is ReasonKind.SHAPE_GUARD
    # the detail names both shapes (the report shows it)
    assert "float32[3, 32]" in str(region.reason) and "float32[3, 16]" in str(region.reason)


class WrongValueKernel(SiluAndMulKernel):
    def forward(self, x):
        return torch.ops.twinkle_test.silu_and_mul(x) + 1


def test_verify_falls_back_to_the_original_graph_on_a_wrong_kernel():
    _register(WrongValueKernel)
    model, x = GatedMLP(), torch.randn(3, 8)
    with collect_reports() as report:
        out = torch.compile(model, backend="twinkle", options={"compiler": "eager", "verify": True})(x)
    torch.testing.assert_close(out, model(x))
    (region,) = report.regions
    assert region.reason.kind is ReasonKind.VERIFY_FAILED


class Gelu(torch.nn.Module):
    def forward(self, x):
        return F.gelu(x)


class WrongForOddWidths(torch.nn.Module):
    """An opaque kernel (run with real tensors) whose edge handling is wrong for odd widths only."""

    can_torch_compile = False

    def forward(self, x):
        out = F.gelu(x)
        return out + 1 if x.shape[-1] % 2 else out


class OpaqueGelu(torch.nn.Module):
    can_torch_compile = False

    def forward(self, x):
        return F.gelu(x)


class WithGelu(torch.nn.Module):
    def __init__(self, pairs=False):
        super().__init__()
        self.act, self.pairs = Gelu(), pairs

    def forward(self, x):
        out = self.act(x) * 2
        return out.reshape(-1, 2).sum(-1) if self.pairs else out  # pairs: the model refuses odd sizes itself


def test_verify_with_dynamic_shapes_checks_an_awkward_size_too():
    register_layer_kernel(kernel_name="Gelu", layer=WrongForOddWidths, device="cpu")
    register_external_layer(Gelu, "Gelu")
    model = WithGelu()
    compiled = torch.compile(model, backend="twinkle", options={"compiler": "eager", "verify": True})
    with collect_reports() as report:
        for width in (4, 6, 5):  # 6 recompiles with a dynamic width, which then serves 5
            x = torch.randn(3, width)
            torch.testing.assert_close(compiled(x), model(x))
    dynamic = report.graphs[-1]
    (region,) = dynamic.regions
    assert region.reason.kind is ReasonKind.VERIFY_FAILED
    assert re.search(r"at s\d+=7 \(example 6\)", str(region.reason)), region.reason


def test_verify_says_when_only_the_example_shapes_were_checked(caplog):
    register_layer_kernel(kernel_name="Gelu", layer=OpaqueGelu, device="cpu")
    register_external_layer(Gelu, "Gelu")
    model = WithGelu(pairs=True)
    compiled = torch.compile(model, backend="twinkle", options={"compiler": "eager", "verify": True}, dynamic=True)
    with collect_reports() as report:
        x = torch.randn(3, 4)
        torch.testing.assert_close(compiled(x), model(x))
    (graph,) = report.graphs
    assert graph.regions[0].swapped
    assert graph.verified.startswith("only the example shapes were checked: the original graph does not run at")
    assert f"verify: {graph.verified}" in report.summary()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("only the example shapes were checked" in w for w in warnings), warnings


class _CountingBackend:
    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def test_registering_after_compiling_warns_once_with_what_to_do(caplog):
    model, x = GatedMLP(), torch.randn(2, 8)
    compiled = torch.compile(model, backend="twinkle", options={"compiler": "eager"})
    with torch.no_grad(), caplog.at_level("WARNING", logger="twinkle_fx"):
        compiled(x)
        assert "found no registered kernels" in caplog.text
        caplog.clear()
        _register()  # after the graph was compiled
        compiled(x)
        compiled(x)
    stale = [r for r in caplog.records if "runs with the kernels chosen at compile time" in r.getMessage()]
    assert len(stale) == 1 and "torch.compiler.reset()" in stale[0].getMessage()
    assert "kernels were registered or replaced since" in stale[0].getMessage()
    torch.compiler.reset()
    with collect_reports() as report, torch.no_grad():
        compiled(x)
    assert [r.swapped for r in report.regions] == [True]


def test_a_scoped_registry_that_exited_is_noticed(caplog):
    model, x = GatedMLP(), torch.randn(2, 8)
    with twinkle_fx.scoped_registry():
        _register()
        compiled = torch.compile(model, backend="twinkle", options={"compiler": "eager"})
        with torch.no_grad():
            compiled(x)
    with torch.no_grad(), caplog.at_level("WARNING", logger="twinkle_fx"):
        compiled(x)
    assert "the scoped_registry it was compiled in has exited" in caplog.text


def test_undo_kernelize_after_compiling_recompiles():
    _register()
    model, x = GatedMLP(), torch.randn(2, 8)
    twinkle_fx.kernelize_model(model, mode="inference")
    compiled = torch.compile(model, backend="twinkle", options={"compiler": "eager"})
    with collect_reports() as report, torch.no_grad():
        compiled(x)
        twinkle_fx.undo_kernelize(model)
        compiled(x)
    # first graph: the eager kernel is in the graph; after undo Dynamo recompiles and the backend swaps
    assert [[r.swapped for r in g.regions] for g in report.graphs] == [[False], [True]]


def test_report_is_published_only_when_the_inner_compiler_succeeds(monkeypatch):
    from twinkle_fx.compiler import backend

    def failing(*args, **kwargs):
        raise RuntimeError("inner compiler broke")

    monkeypatch.setattr(backend, "_inner_compile", failing)
    _register()
    with collect_reports() as report, pytest.raises(Exception, match="inner compiler broke"):
        torch.compile(GatedMLP(), backend="twinkle")(torch.randn(2, 8))
    assert report.graphs == []


def test_explain_leaves_the_callers_compiled_code_alone():
    _register()
    model, x = GatedMLP(), torch.randn(2, 8)
    counting = _CountingBackend()
    compiled = torch.compile(model, backend=counting)
    compiled(x)
    report = twinkle_fx.explain(model, x)
    assert [r.swapped for r in report.regions] == [True]
    compiled(x)
    assert counting.graphs == 1  # still compiled: explain neither reset Dynamo nor reused this code


class EpsNorm(torch.nn.Module):
    def __init__(self, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


EPS_NORM_SEEN: list = []  # module level: a layer kernel class has no members beyond forward and its declarations


class EpsNormKernel(torch.nn.Module):
    can_torch_compile = True

    def forward(self, x):
        EPS_NORM_SEEN.append(self.eps)
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class WithNorm(torch.nn.Module):
    def __init__(self, eps):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.norm = EpsNorm(eps)

    def forward(self, x):
        return self.norm(self.proj(x))


def test_a_float_attribute_lifted_to_a_graph_input_is_read_from_the_graph():
    # Two models of one class whose eps differ: Dynamo lifts eps to a graph input on the second
    # compile, and one graph then serves every eps. The layer is still swapped, with the value
    # read from the graph, and a model with yet another eps never runs a kernel with the wrong one.
    register_layer_kernel(kernel_name="EpsNorm", layer=EpsNormKernel, device="cpu")
    register_external_layer(EpsNorm, "EpsNorm")
    EPS_NORM_SEEN.clear()
    torch.manual_seed(0)
    x = torch.randn(2, 8)

    with collect_reports() as report, torch.no_grad():
        for eps in (1e-5, 1e-1, 0.5):
            model = WithNorm(eps)
            compiled = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})
            torch.testing.assert_close(compiled(x), model(x))
    assert all(g.regions and all(r.swapped for r in g.regions) for g in report.graphs), report.summary()
    # each model's kernel ran with that model's own eps (Dynamo may serve several with one graph)
    assert {1e-5, 1e-1, 0.5} <= set(EPS_NORM_SEEN)


def test_compile_time_verify_notices_a_different_number_of_outputs():
    from twinkle_fx.compiler.inner import verify

    class Two(torch.nn.Module):
        def forward(self, x):
            return x + 1, x * 2

    class One(torch.nn.Module):
        def forward(self, x):
            return (x + 1,)

    x = torch.randn(3)
    reason = verify.compare(torch.fx.symbolic_trace(Two()), torch.fx.symbolic_trace(One()), [x])
    assert reason is not None and "1 output(s)" in reason and "the original 2" in reason
    fake = torch._subclasses.fake_tensor.FakeTensorMode().from_tensor(x)
    assert verify.compare(torch.fx.symbolic_trace(Two()), torch.fx.symbolic_trace(Two()), [fake]).startswith("not checked")


class FusedHead(torch.nn.Module):
    """A root-module kernel: bound to a base class, compiled through a subclass instance."""

    can_torch_compile = True

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class SubclassedMLP(GatedMLP):
    pass


def test_compiled_root_reports_subclasses_of_bound_classes():
    register_layer_kernel(kernel_name="Head", layer=FusedHead, device="cpu")
    register_external_layer(GatedMLP, "Head")
    report = twinkle_fx.explain(SubclassedMLP(), torch.randn(2, 8))
    assert [(r.location, r.reason.kind) for r in report.regions] == [("<compiled module>", ReasonKind.COMPILED_ROOT)]


def test_opaque_ops_are_registered_once_per_region_across_recompiles():
    from twinkle_fx.compiler.regions.splice import registered_opaque_ops

    _register(UntraceableKernel)
    model, x = GatedMLP(), torch.randn(3, 8)
    compiled = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})
    with collect_reports() as report:
        compiled(x)
        first = registered_opaque_ops()
        torch._dynamo.reset()  # a recompile of the same region
        compiled(x)
    assert [r.how for r in report.regions] == ["opaque custom op, can_torch_compile=False"] * 2
    assert registered_opaque_ops() == first
    ops = {name for name in torch._C._dispatch_get_all_op_names() if name.startswith("twinkle_opaque::")}
    compiled(torch.randn(5, 8))  # a new shape: Dynamo recompiles, the region's code differs, one more op
    torch._dynamo.reset()
    compiled(x)
    assert registered_opaque_ops() <= first + 1
    assert {name for name in torch._C._dispatch_get_all_op_names() if name.startswith("twinkle_opaque::")} >= ops


class BreakFirst(torch.nn.Module):
    def forward(self, x):
        torch._dynamo.graph_break()
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


def test_graph_break_on_the_first_line_of_a_layer_inside_sequential_is_reported():
    register_layer_kernel(kernel_name="SiluAndMul", layer=SiluAndMulKernel, device="cpu")
    register_external_layer(BreakFirst, "SiluAndMul")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), BreakFirst(), torch.nn.Linear(8, 8))
    x = torch.randn(3, 8)
    with collect_reports() as report:
        out = torch.compile(model, backend="twinkle", options={"compiler": "eager"})(x)
    torch.testing.assert_close(out, model(x))
    kept = {(r.target, r.reason.kind) for r in report.not_swapped}
    assert ("BreakFirst -> SiluAndMul", ReasonKind.GRAPH_BREAK) in kept, report.summary()


def test_the_report_holds_only_graphs_that_run():
    from twinkle_fx.compiler.backend import twinkle_backend

    _register()
    model, x = GatedMLP(), torch.randn(2, 8)
    gm = torch.fx.symbolic_trace(model)
    with collect_reports() as report:
        compiled = twinkle_backend(gm, [x], options={"compiler": "eager"})
        assert report.graphs == []  # compiled, not run: Dynamo may still discard it
        compiled(x)
        compiled(x)
    assert report.graph_count == 1


def test_dump_graphs_writes_each_graph_before_and_after_each_pass(tmp_path, monkeypatch):
    from twinkle_fx.compiler.backend import PASSES

    _register()
    monkeypatch.setenv("TWINKLE_FX_DUMP_GRAPHS", str(tmp_path / "env"))
    torch.compile(GatedMLP(), backend="twinkle", options={"compiler": "eager"})(torch.randn(2, 8))
    torch._dynamo.reset()
    monkeypatch.delenv("TWINKLE_FX_DUMP_GRAPHS")
    torch.compile(GatedMLP(), backend="twinkle",
                  options={"compiler": "eager", "dump_graphs": str(tmp_path / "option")})(torch.randn(2, 8))
    for root in ("env", "option"):
        (graph,) = (tmp_path / root).iterdir()
        names = sorted(p.name for p in graph.iterdir())
        assert names == sorted(f"{i:02d}_{p.name}.{when}.py" for i, p in enumerate(PASSES, 1) for when in ("before", "after"))
        swapped = graph / "02_layer_regions.after.py"
        assert "twinkle_layer_SiluAndMul" in swapped.read_text()
        assert "twinkle_layer" not in (graph / "02_layer_regions.before.py").read_text()


def _shared_wrapper(forward):
    """Like transformers' decorators on every *ForCausalLM.forward: one wrapper code for all classes."""

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        if getattr(self, "breaks_in_wrapper", False):
            args = (args[0] * 1,)
            torch._dynamo.graph_break()  # Dynamo breaks in transformers' wrapper on MoE models
        return forward(self, *args, **kwargs)

    return wrapper


class WrappedHead(torch.nn.Module):
    can_torch_compile = True

    @_shared_wrapper
    def forward(self, x):
        return x * 2


class OtherWrappedHead(torch.nn.Module):
    breaks_in_wrapper = True

    @_shared_wrapper
    def forward(self, x):
        return x * 3 + 1


def test_graph_break_is_attributed_to_the_class_whose_own_forward_broke():
    register_layer_kernel(kernel_name="Head", layer=WrappedHead, device="cpu")
    register_external_layer(WrappedHead, "Head")
    model, x = OtherWrappedHead(), torch.randn(2, 8)
    with collect_reports() as report:
        torch.testing.assert_close(torch.compile(model, backend="twinkle", options={"compiler": "eager"})(x), model(x))
    assert report.graph_breaks == 1
    # the break is in the wrapper OtherWrappedHead (no kernel) shares with WrappedHead: no region of WrappedHead
    assert [r for r in report.not_swapped if r.reason.kind is ReasonKind.GRAPH_BREAK] == [], report.summary()


class TaggedMLP(GatedMLP):
    """A root class reached through a ``kernel_layer_name`` tag, as transformers tags its classes."""

    kernel_layer_name = "Head"


def test_compiled_root_reports_kernel_layer_name_tagged_classes():
    register_layer_kernel(kernel_name="Head", layer=FusedHead, device="cpu")
    report = twinkle_fx.explain(TaggedMLP(), torch.randn(2, 8))
    assert [(r.location, r.reason.kind) for r in report.regions] == [("<compiled module>", ReasonKind.COMPILED_ROOT)]


def test_a_pass_failing_on_one_region_keeps_it_with_the_reason_and_goes_on(monkeypatch):
    from twinkle_fx.compiler.passes import layer_regions

    class TwoActs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = SiluAndMul(), SiluAndMul()

        def forward(self, x):
            return self.second(torch.cat([self.first(x), self.first(x)], -1))

    _register()
    calls = []
    real_place = layer_regions.place_kernel

    def place_failing_once(gm, region, call, choice, **where):
        calls.append(region.location)
        if len(calls) == 1:
            raise RuntimeError("a bug in a pass")
        return real_place(gm, region, call, choice, **where)

    monkeypatch.setattr(layer_regions, "place_kernel", place_failing_once)
    model, x = TwoActs(), torch.randn(3, 8)
    with collect_reports() as report:
        torch.testing.assert_close(torch.compile(model, backend="twinkle", options={"compiler": "eager"})(x), model(x))
    outcome = [(r.swapped, r.reason and r.reason.kind) for r in report.regions]
    assert outcome == [(False, ReasonKind.PASS_FAILED), (True, None), (True, None)], report.summary()
    assert isinstance(report.regions[0].reason.exception, RuntimeError)
