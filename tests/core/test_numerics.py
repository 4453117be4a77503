"""``numerics.compare`` (the comparison eager and compile-time verify share) and the tolerance table."""

import math

import pytest
import torch

from twinkle_fx.core.numerics import compare
from twinkle_fx.core.tolerances import TOLERANCES, tolerance


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_values_within_the_dtype_tolerance_pass_and_beyond_it_fail(dtype):
    tol = tolerance(dtype)
    reference = torch.linspace(-2, 2, 64, dtype=torch.float64)
    inside = (reference * (1 + tol.rtol / 2) + tol.atol / 2).to(dtype)
    outside = (reference * (1 + 3 * tol.rtol) + 3 * tol.atol).to(dtype)
    reference = reference.to(dtype)
    assert compare(inside, reference)[1] is None
    error, problem = compare(outside, reference)
    assert problem.startswith("leaf 0: max abs difference") and f"rtol={tol.rtol:g}" in problem and error > 0


def test_nan_where_the_reference_has_nan_agrees_and_elsewhere_does_not():
    reference = torch.tensor([1.0, math.nan, 3.0])
    assert compare(reference.clone(), reference) == (0.0, None)
    assert "non-finite" in compare(torch.tensor([1.0, 2.0, 3.0]), reference)[1]


def test_integers_are_compared_exactly_and_structure_dtype_device_shape_must_match():
    assert "compared exactly" in compare(torch.tensor([1, 2]), torch.tensor([1, 3]))[1]
    assert "structure differs" in compare((torch.ones(2),), [torch.ones(2)])[1]
    assert "dtype torch.float64 vs the reference's torch.float32" in compare(torch.ones(2).double(), torch.ones(2))[1]
    assert "shape" in compare(torch.ones(3), torch.ones(2))[1]
    assert "'a' vs the reference's 'b'" in compare(("a", torch.ones(1)), ("b", torch.ones(1)))[1]


def test_compile_verify_uses_the_same_comparison():
    from twinkle_fx.compiler.inner import verify

    class Shifted(torch.nn.Module):
        def __init__(self, shift):
            super().__init__()
            self.shift = shift

        def forward(self, x):
            return x + self.shift

    x = torch.tensor([1.0, math.nan])
    exact, off = torch.fx.symbolic_trace(Shifted(0.0)), torch.fx.symbolic_trace(Shifted(1e-3))
    assert verify.compare(exact, torch.fx.symbolic_trace(Shifted(0.0)), [x]) is None  # NaN in both: agreement
    assert verify.compare(exact, off, [x]) == compare(off(x), exact(x), leaf="output", reference_name="the original")[1]


def test_every_floating_dtype_has_its_tolerances_and_others_fall_back_to_float32():
    assert set(TOLERANCES) == {torch.float64, torch.float32, torch.bfloat16, torch.float16}
    assert tolerance(torch.float8_e4m3fn) == TOLERANCES[torch.float32]
