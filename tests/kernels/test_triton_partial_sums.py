"""sum_partials: the partial weight-gradient sums of a norm's persistent backward programs, added up in one
kernel, against torch's sum."""

import pytest
import torch
from kernel_test_utils import assert_close

from twinkle_triton._partial_sums import sum_partials


@pytest.mark.parametrize("partial_dtype, dtype", [(torch.float32, torch.bfloat16), (torch.float32, torch.float32),
                                                  (torch.float64, torch.float64)])
@pytest.mark.parametrize("shape", [(1, 5), (150, 77), (132, 2048)])  # rows past one loop step, a ragged column block
def test_the_partials_column_sums_in_the_gradients_dtype(shape, partial_dtype, dtype):
    partial = torch.randn(shape, dtype=partial_dtype)
    got = sum_partials(partial, dtype)
    assert got.dtype == dtype and got.shape == (shape[1],)
    assert_close(got, partial.sum(0).to(dtype), dtype, "summed partials")
    assert torch.equal(got, sum_partials(partial, dtype))  # the rows in one order: the same bits every run


def test_no_columns():
    assert sum_partials(torch.empty(4, 0), torch.bfloat16).shape == (0,)
