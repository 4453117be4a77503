"""The TTIR memo (twinkle_fx.compiler.inner.ttir_memo): torch's per-launch Triton front-end run answered
once per kernel signature while Inductor compiles a twinkle graph, and torch's own function back
when the block exits."""

import pytest
import torch
from tiny_models import DEVICE, tiny

from twinkle_fx.compiler.inner import ttir_memo

triton_kernel_wrap = pytest.importorskip("torch._higher_order_ops.triton_kernel_wrap")


@pytest.fixture
def recorded(monkeypatch):
    """torch's generate_ttir replaced by a recorder that returns a new module object per call."""
    calls = []

    def generate_ttir(kernel, kwargs, tma_descriptor_metadata):
        calls.append((kernel, dict(kwargs)))
        return object(), [name for name in kwargs if isinstance(kwargs[name], torch.Tensor)]

    monkeypatch.setattr(triton_kernel_wrap, "generate_ttir", generate_ttir)
    monkeypatch.setattr(ttir_memo, "_memo", type(ttir_memo._memo)())
    return calls


def test_launches_with_one_signature_share_one_front_end_run(recorded):
    x = torch.empty(8, 4, dtype=torch.bfloat16)
    with ttir_memo.memoized_ttir():
        first = triton_kernel_wrap.generate_ttir("kernel", {"x": x, "y": x, "n": 32, "BLOCK": 64}, {})
        # another layer: other tensors (other shapes even) of the same dtypes, the same scalars
        again = triton_kernel_wrap.generate_ttir("kernel", {"x": torch.empty(3, dtype=torch.bfloat16),
                                                             "y": x, "n": 32, "BLOCK": 64}, {})
    assert len(recorded) == 1
    assert again[0] is first[0] and again[1] == first[1] == ["x", "y"]


@pytest.mark.parametrize("change", [
    {"x": torch.empty(8, dtype=torch.float32)},  # a tensor's dtype: another pointer type
    {"n": 33},  # a scalar's value: Triton specialises on divisibility and on 1
    {"BLOCK": 128},  # a constexpr
])
def test_anything_triton_specialises_on_runs_the_front_end_again(recorded, change):
    kwargs = {"x": torch.empty(8, dtype=torch.bfloat16), "n": 32, "BLOCK": 64}
    with ttir_memo.memoized_ttir():
        triton_kernel_wrap.generate_ttir("kernel", kwargs, {})
        triton_kernel_wrap.generate_ttir("kernel", {**kwargs, **change}, {})
        triton_kernel_wrap.generate_ttir("other kernel", kwargs, {})
    assert len(recorded) == 3


def test_tma_descriptors_and_undescribable_arguments_bypass_the_memo(recorded):
    kwargs = {"x": torch.empty(8, dtype=torch.bfloat16), "n": 32}
    with ttir_memo.memoized_ttir():
        for _ in range(2):
            triton_kernel_wrap.generate_ttir("kernel", kwargs, {"x": ("stable", ([64],))})
            triton_kernel_wrap.generate_ttir("kernel", {**kwargs, "table": [1, 2]}, {})
    assert len(recorded) == 4


def test_torch_function_is_back_after_the_outermost_block(recorded):
    original = triton_kernel_wrap.generate_ttir
    with ttir_memo.memoized_ttir():
        with ttir_memo.memoized_ttir():  # the backward's compile inside the forward's
            assert triton_kernel_wrap.generate_ttir is not original
        assert triton_kernel_wrap.generate_ttir is not original
    assert triton_kernel_wrap.generate_ttir is original
    with pytest.raises(RuntimeError), ttir_memo.memoized_ttir():
        raise RuntimeError("a compile that fails")
    assert triton_kernel_wrap.generate_ttir is original
    triton_kernel_wrap.generate_ttir("kernel", {"n": 1}, {})
    triton_kernel_wrap.generate_ttir("kernel", {"n": 1}, {})
    assert len(recorded) == 2  # outside the block nothing is memoized


@pytest.mark.gpu  # triton_op launches are traced (and analysed) only on a GPU
def test_a_compiled_model_analyses_each_kernel_signature_once():
    """Four identical decoder layers under backend="twinkle" with Inductor: the memo answers the
    repeated launches, and the compiled model still trains like eager."""
    from twinkle_fx.builtin import use_builtin_kernels

    use_builtin_kernels(devices=(DEVICE,), models=("qwen2",))
    eager = tiny("qwen2", layers=4)
    model = tiny("qwen2", layers=4)
    ids = torch.randint(0, 128, (2, 16), device=DEVICE)
    expected = eager(input_ids=ids, labels=ids).loss
    expected.backward()
    before = ttir_memo.stats()
    with torch._functorch.config.patch(enable_autograd_cache=False), \
            torch._inductor.config.patch(fx_graph_cache=False):
        loss = torch.compile(model, backend="twinkle", options={"compiler": "inductor"})(input_ids=ids, labels=ids).loss
        loss.backward()
    after = ttir_memo.stats()
    hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
    assert hits > 3 * misses > 0, after
    torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=name)


def test_launches_torch_wraps_in_new_autotuners_share_one_front_end_run(recorded):
    """A launch with num_warps reaches generate_ttir as a new one-config Autotuner every time (torch
    wraps it per launch); the TTIR is the wrapped kernel's with the config's kwargs."""
    triton = pytest.importorskip("triton")

    @triton.jit
    def kernel(x_ptr, BLOCK: "triton.language.constexpr"):
        pass

    def launch_wrapper(num_warps, block=64):
        return triton.autotune(configs=[triton.Config({"BLOCK": block}, num_warps=num_warps)], key=[])(kernel)

    x = {"x_ptr": torch.empty(4, dtype=torch.bfloat16)}
    with ttir_memo.memoized_ttir():
        triton_kernel_wrap.generate_ttir(launch_wrapper(4), x, {})
        triton_kernel_wrap.generate_ttir(launch_wrapper(4), x, {})  # another layer's launch
        triton_kernel_wrap.generate_ttir(launch_wrapper(8), x, {})  # launch options do not reach the TTIR
        triton_kernel_wrap.generate_ttir(launch_wrapper(4, block=128), x, {})  # a config constexpr does
    assert len(recorded) == 2
