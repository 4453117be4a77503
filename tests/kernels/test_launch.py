"""The cached launcher (``twinkle_triton._launch``): its cache key separates every launch Triton
would compile differently, and on a GPU it launches the same kernel with the same results as
``kernel[grid](...)``."""

import itertools

import pytest
import torch
import triton
import triton.language as tl
from triton.backends import BaseBackend

from twinkle_triton import _launch

native_specialize_impl = pytest.importorskip("triton._C.libtriton").native_specialize_impl


def _triton_specialization(args: tuple) -> tuple:
    """What Triton's JIT specializes a kernel on for ``args`` (its own native function)."""
    return tuple(native_specialize_impl(BaseBackend, a, False, True, True) for a in args)


def test_same_key_means_same_triton_specialization():
    base = torch.empty(64, dtype=torch.bfloat16, device="cpu")
    tensors = [base, base[1:], base[8:], base.float(), base[16:]]  # aligned, 2-byte offset, 16-byte offset, fp32
    ints = [0, 1, 2, 16, 17, 896, 4864, 2**31 - 16, 2**31, 2**40 + 1]
    seen: dict[tuple, tuple] = {}
    for t1, t2, i1, i2 in itertools.product(tensors, tensors, ints, ints):
        for args in ((t1, i1, t2, i2, 1e-6), (t1, i1, t2, i2, True)):
            plan = _launch._Plan(tuple(map(type, args)))
            key = (tuple(map(type, args)), _launch.specialization_key(plan, args))
            spec = _triton_specialization(args)
            assert seen.setdefault(key, spec) == spec, (key, spec, seen[key])
    # and the key does not separate what Triton treats alike: all-aligned calls of one shape share it
    plan = _launch._Plan((torch.Tensor, int))
    assert (_launch.specialization_key(plan, (base, 896)) ==
            _launch.specialization_key(plan, (torch.empty_like(base), 896)))


def test_helpers_match_triton():
    for n in range(0, 70000, 7):
        assert _launch.next_power_of_2(max(n, 1)) == triton.next_power_of_2(max(n, 1))
        assert _launch.cdiv(n, 1024) == triton.cdiv(n, 1024)


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * scale, mask=mask)


@pytest.mark.interpreter
def test_the_interpreter_gets_the_kernel_itself():
    assert _launch.interpreting()
    assert _launch.cached_launcher(_scale_kernel) is _scale_kernel


@pytest.mark.skipif(not torch.cuda.is_available() or _launch.interpreting(), reason="compiled kernels need a GPU")
def test_cached_launches_equal_jit_launches():
    launcher = _launch.cached_launcher(_scale_kernel)
    assert isinstance(launcher, _launch.CachedLauncher) and launcher is _launch.cached_launcher(_scale_kernel)
    x = torch.randn(1000, device="cuda")
    for view in (x, x[1:], x[3:998]):  # aligned, then 4- and 12-byte offsets: other specializations
        n = view.numel()
        want = torch.empty_like(view)
        _scale_kernel[(triton.cdiv(n, 256),)](view, want, n, 0.5, BLOCK=256)
        for _ in range(2):  # the first call compiles/caches through the JIT, the second is the cached launch
            got = torch.full_like(view, float("nan"))
            launcher[(triton.cdiv(n, 256),)](view, got, n, 0.5, BLOCK=256)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert len(launcher._compiled) == 3


def test_dot_options_keep_fp32_exact_unless_told_to_follow_the_matmul_precision():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")  # TF32 allowed, as F.linear would use it
        assert _launch.dot_options(torch.float32)["DOT_PRECISION"] == "ieee"
        assert _launch.dot_options(torch.float32, fp32_like_matmul=True)["DOT_PRECISION"] == "tf32"
        torch.set_float32_matmul_precision("highest")
        assert _launch.dot_options(torch.float32, fp32_like_matmul=True)["DOT_PRECISION"] == "ieee"
    finally:
        torch.set_float32_matmul_precision(before)
    upcast = {dtype: _launch.dot_options(dtype)["DOT_UPCAST"] for dtype in (torch.float32, torch.bfloat16)}
    assert upcast == {torch.float32: False, torch.bfloat16: _launch.interpreting()}
