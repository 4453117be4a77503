"""Compiling a mixture-of-experts model logs no error: the grouped experts (``torch._grouped_mm``) traced by
Dynamo, differentiated by AOTAutograd and lowered by Inductor, under Inductor alone and under twinkle's
backend, forward and backward. An ERROR record on a compile that succeeds is a wall of tracebacks for the user,
or a frame that fell back to eager without saying so."""

from __future__ import annotations

import logging

import pytest
import torch
from log_records import describe, records_at

from twinkle_fx.bench.workloads import build_model, get_workload, make_batch
from twinkle_fx.builtin import use_builtin_kernels

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("backend", ["inductor", "twinkle"])
def test_an_moe_model_compiles_forward_and_backward_without_an_error_record(family, backend, device):
    workload = get_workload(family)
    model = build_model(workload, tiny=True, dtype=torch.bfloat16, device=device, seed=0)
    input_ids, labels = make_batch(workload, tiny=True, batch=2, seq=16, device=device, seed=0)
    reference = model(input_ids=input_ids, labels=labels).loss
    if backend == "twinkle":  # the built-in kernels on this device too: the experts' region is searched and swapped
        use_builtin_kernels(devices=(device,), models=(family,))
    torch._dynamo.reset()
    try:
        with records_at(logging.ERROR) as errors:
            loss = torch.compile(model, backend=backend)(input_ids=input_ids, labels=labels).loss
            loss.backward()
    finally:
        torch._dynamo.reset()
    assert not errors, describe(errors)
    torch.testing.assert_close(loss, reference, rtol=2e-2, atol=2e-2)
