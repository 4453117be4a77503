"""Shared helpers of the kernel tests: per-dtype tolerances and forward+backward comparisons.

(A uniquely named module, not ``helpers.py``: test folders have no ``__init__.py``, so pytest puts
each on ``sys.path`` and module names must not collide across tests/.)

How results are judged: a kernel computes in fp32 and rounds once, while the PyTorch reference
rounds intermediate results in half precision, so the two can differ by more than a fixed
tolerance where the reference itself is off (e.g. a weight gradient summed over rows). Each result
is therefore compared with the *truth* (the reference run on fp64 copies of the inputs), twice:

- per element, within the dtype's tolerance plus the reference's own error at that element: "no
  worse than PyTorch's own result in this dtype, up to one tolerance". The tolerances are the
  library's (:mod:`twinkle_fx.core.tolerances`, which says how they were chosen), the ones verify
  mode and ``twinkle_fx check`` apply to the same kernels. In bf16 they are 2.5 eps per element
  (atol 2e-2 besides), wide enough to let a systematic error of a few percent through: a wrong
  divisor in a norm's backward, gradients given to rows with an ignored label (small entries, far
  under atol).
- for bf16 / fp16 results of 16 elements or more, as a whole: the L2 norm of the error at most
  ``2 * ||reference - truth|| + sqrt(roundings) * eps * ||truth||`` (:func:`relative_error_bound`).
  That is the error of the op as PyTorch computes it in that dtype, twice over, plus one rounding to
  the dtype (eps = 2^-7 for bf16; a rounding costs eps / sqrt(12) RMS, eps / sqrt(3) where the
  interpreter truncates) for each of ``roundings``: kernels that round partial sums to the dtype pass
  how many they add. A few-percent error is several bf16 eps over the whole tensor and fails.
"""

import math

import torch

from twinkle_fx.core.tolerances import tolerance

from dtype_tolerance import assert_close  # noqa: F401 - the kernel tests import it from here

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


HALF_DTYPES = (torch.bfloat16, torch.float16)
# Below this many elements a norm says little more than the elements do: only they are checked.
MIN_ELEMENTS_FOR_NORM = 16
# An error norm this small per element (RMS) passes whatever the truth: results that cancel to 0 in
# exact arithmetic (a softmax over one key has no gradient) come out as fp32 rounding noise.
NORM_FLOOR = 2.0**-20


def relative_error_bound(reference_error: float, truth_norm: float, numel: int, dtype: torch.dtype,
                         roundings: int = 1) -> float:
    """The largest L2 norm of ``actual - truth`` a bf16 / fp16 result may have (module docstring)."""
    eps = torch.finfo(dtype).eps
    return 2 * reference_error + math.sqrt(roundings) * eps * truth_norm + NORM_FLOOR * math.sqrt(numel)


def assert_as_accurate(actual, reference, truth, dtype: torch.dtype, what: str, *, roundings: int = 1) -> None:
    """``actual`` is within the dtype's tolerance of ``truth``, widened by ``reference``'s error, per
    element; and, for bf16 / fp16, within :func:`relative_error_bound` of it as a whole."""
    assert actual.shape == reference.shape and actual.dtype == reference.dtype, (
        f"{what}: got {tuple(actual.shape)} {actual.dtype}, reference {tuple(reference.shape)} {reference.dtype}"
    )
    rtol, atol = tolerance(dtype).rtol, tolerance(dtype).atol
    truth = truth.double()
    err = (actual.double() - truth).abs()
    allowed = atol + rtol * truth.abs() + (reference.double() - truth).abs()
    bad = ~(err <= allowed) & ~(actual.isnan() & truth.isnan())  # nan where the truth is nan is right
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(
            f"{what} ({dtype}): {int(bad.sum())}/{bad.numel()} elements off; first at flat index {i}: "
            f"got {actual.flatten()[i].item()}, reference {reference.flatten()[i].item()}, "
            f"truth {truth.flatten()[i].item()}, allowed error {allowed.flatten()[i].item():.3g}"
        )
    finite = truth.isfinite()
    if dtype not in HALF_DTYPES or int(finite.sum()) < MIN_ELEMENTS_FOR_NORM:
        return
    # where the truth is infinite or nan the elements above already matched it
    truth, got, ref = truth[finite], actual.double()[finite], reference.double()[finite]
    error, reference_error, truth_norm = ((got - truth).norm().item(), (ref - truth).norm().item(),
                                          truth.norm().item())
    bound = relative_error_bound(reference_error, truth_norm, truth.numel(), dtype, roundings)
    if not error <= bound:
        eps = torch.finfo(dtype).eps
        raise AssertionError(
            f"{what} ({dtype}): error norm {error:.3g} ({error / max(truth_norm, 1e-300) / eps:.2f} eps of the "
            f"truth's norm {truth_norm:.3g}) over {truth.numel()} elements; PyTorch in {dtype}: {reference_error:.3g} "
            f"({reference_error / max(truth_norm, 1e-300) / eps:.2f} eps); allowed {bound:.3g} "
            f"(twice PyTorch's, plus {roundings} rounding(s) of the dtype)"
        )


def leaf(t, dtype=None):
    """A leaf copy keeping ``t``'s strides (non-contiguous inputs stay non-contiguous); float
    tensors optionally converted to ``dtype`` and made to require grad."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        return t
    if dtype is not None:
        # An expanded view (a stride of 0) cannot be copied into at its own strides: its
        # conversion is contiguous (only the truth is converted, whose layout does not matter).
        strides = t.stride() if 0 not in t.stride() else torch.empty(t.shape).stride()
        t = torch.empty_strided(t.shape, strides, dtype=dtype).copy_(t)
    return t.detach().requires_grad_(True)


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def check_forward_backward(fn, reference, inputs, dtype, what: str, *, truth_fn=None, roundings: int = 1,
                           output_in_gradient: float = 0.0) -> None:
    """Compare ``fn``'s outputs and input gradients with ``reference``'s (see module docstring),
    for one shared random output gradient.

    ``truth_fn`` (defaults to ``reference``) is run on fp64 copies for the truth: pass one where the
    op is defined to round an intermediate to the input dtype (add_rms_norm's sum), which an fp64
    run of the reference would not do. ``roundings``: how many times the kernel rounds a result or
    its partial sums to the dtype (1: once, at the end). ``output_in_gradient``: the output gradient
    is random plus this times the output (as the gradient of a loss that depends on the output's
    size): a norm's backward then has a projection onto the normalised input as large as the rest,
    where a random gradient leaves it ~1/sqrt(hidden) of the rest and an error in it unseen in bf16.
    """
    ours = [leaf(t) for t in inputs]
    refs = [leaf(t) for t in inputs]
    truths = [leaf(t, torch.float64) for t in inputs]
    truth_fn = truth_fn or reference
    out, ref, truth = _as_tuple(fn(*ours)), _as_tuple(reference(*refs)), _as_tuple(truth_fn(*truths))
    for i, (o, r, t) in enumerate(zip(out, ref, truth)):
        assert_as_accurate(o, r, t, dtype, f"{what} output {i}", roundings=roundings)
    if all(r.numel() == 0 for r in ref):
        return
    grads_out = [torch.randn_like(r) + output_in_gradient * r.detach() for r in ref]
    diff = lambda ts: [t for t in ts if isinstance(t, torch.Tensor) and t.requires_grad]  # noqa: E731
    got = torch.autograd.grad(out, diff(ours), grads_out)
    want = torch.autograd.grad(ref, diff(refs), grads_out)
    exact = torch.autograd.grad(truth, diff(truths), [g.double() for g in grads_out])
    for i, (g, w, e) in enumerate(zip(got, want, exact)):
        assert_as_accurate(g, w, e, dtype, f"{what} grad of input {i}", roundings=roundings)


def decode_step_inputs(dtype, device, batch, heads, kv_heads, length, dim, max_len):
    """(q, k, v, cos, sin, key_cache, value_cache) of a decode step's attention with a static cache: q, k and v are
    the ``view(...).transpose(1, 2)`` of a projection's output (strided, as transformers passes them), the caches
    ``[batch, kv_heads, max_len, dim]`` of random contents."""
    def projected(h):
        flat = torch.randn(batch, length, h * dim, dtype=dtype, device=device)
        return flat.view(batch, length, h, dim).transpose(1, 2)

    q, k, v = projected(heads), projected(kv_heads), projected(kv_heads)
    cos, sin = (torch.randn(1, length, dim, dtype=dtype, device=device) for _ in range(2))
    caches = [torch.randn(batch, kv_heads, max_len, dim, dtype=dtype, device=device) for _ in range(2)]
    return q, k, v, cos, sin, *caches
