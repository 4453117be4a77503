"""scale_in_place: a tensor multiplied by a one-element scale in place, the scale read on the device, nothing
touched when it is 1."""

import importlib

import pytest
import torch
from kernel_test_utils import assert_close

import twinkle_triton as tt
from twinkle_triton._launch import interpreting


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16, torch.float64))
@pytest.mark.parametrize("scale", (1.0, 0.375, -3.0))
def test_the_product_in_place(dtype, scale):
    x = torch.randn(37, 29, dtype=dtype)  # over several blocks of several programs on the GPU
    out = x.clone()
    assert tt.scale_in_place(out, torch.tensor(scale)) is None
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    want = (x.to(compute) * scale).to(dtype)
    reference = x.clone()
    tt.scale_in_place_reference(reference, torch.tensor(scale))
    assert torch.equal(reference, want)
    if interpreting() and dtype == torch.bfloat16:  # the interpreter rounds to bf16 by truncation: one step
        torch.testing.assert_close(out.float(), want.float(), rtol=2**-7, atol=0)
    else:
        assert torch.equal(out, want)  # rounded once, as out * scale is


def test_programs_that_loop_over_several_blocks(small_blocks, monkeypatch):
    """16-element blocks and a third as many programs as blocks: every program scales several, on the CPU and the
    GPU alike, and a scale of 1 still leaves them all."""
    module = importlib.import_module("twinkle_triton.scale_in_place")  # the package's attribute is the function
    monkeypatch.setattr(module, "persistent_programs", lambda blocks, device, per_sm: max(1, blocks // 3))
    x = torch.randn(37, 29)
    out = x.clone()
    tt.scale_in_place(out, torch.tensor(-0.5))
    assert torch.equal(out, x * -0.5)
    tt.scale_in_place(out, torch.tensor(1.0))
    assert torch.equal(out, x * -0.5)


def test_a_scale_of_one_leaves_every_bit_and_one_of_another_dtype_or_shape_is_read_as_a_number():
    x = torch.randn(3, 1000, dtype=torch.bfloat16)
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 1e-40])
    out = x.clone()
    tt.scale_in_place(out, torch.ones((), dtype=torch.bfloat16))
    assert torch.equal(out.view(torch.int16), x.view(torch.int16))  # nan, inf, -0 and subnormals as they were
    tt.scale_in_place(out, torch.full((1, 1), 2.0, dtype=torch.float64))
    assert_close(out[1:], x[1:] * 2, torch.bfloat16, "scaled")
    # an fp64 scale is rounded to fp32 first, as the kernel reads it: the reference gives the same bits
    x, third = torch.randn(64), torch.tensor(1 / 3, dtype=torch.float64)
    out, reference = x.clone(), x.clone()
    tt.scale_in_place(out, third)
    tt.scale_in_place_reference(reference, third)
    assert torch.equal(out, reference) and torch.equal(reference, x * third.float())


def test_a_non_finite_scale_reaches_every_element_and_empty_tensors_pass():
    out = torch.randn(5, 7)
    tt.scale_in_place(out, torch.tensor(float("nan")))
    assert out.isnan().all()
    tt.scale_in_place(torch.empty(0, 3), torch.tensor(2.0))


def test_opcheck():
    for scale in (1.0, 0.5):
        torch.library.opcheck(torch.ops.twinkle.scale_in_place.default, (torch.randn(10, 8), torch.tensor(scale)))


def test_rejects_bad_inputs_with_a_useful_message():
    out = torch.randn(10, 8)
    with pytest.raises(ValueError, match="contiguous"):
        tt.scale_in_place(torch.randn(8, 10).t(), torch.tensor(1.0))
    with pytest.raises(ValueError, match="one-element scale"):
        tt.scale_in_place(out, torch.ones(2))
    with pytest.raises(TypeError, match="scale"):
        tt.scale_in_place(out, torch.tensor(1))
    with pytest.raises(TypeError, match="out"):
        tt.scale_in_place(torch.ones(3, dtype=torch.int32), torch.tensor(1.0))
