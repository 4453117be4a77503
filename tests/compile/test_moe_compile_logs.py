"""Compiling a mixture-of-experts model logs no error: the grouped experts (``torch._grouped_mm``) traced by
Dynamo, differentiated by AOTAutograd and lowered by Inductor, under Inductor alone and under twinkle's
backend, forward and backward. An ERROR record on a compile that succeeds is a wall of tracebacks for the user,
or a frame that fell back to eager without saying so."""

from __future__ import annotations

import logging

import pytest
import torch

from twinkle_fx.bench.workloads import build_model, get_workload, make_batch

pytestmark = pytest.mark.slow


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("backend", ["inductor", "twinkle"])
def test_an_moe_model_compiles_forward_and_backward_without_an_error_record(family, backend, device):
    workload = get_workload(family)
    model = build_model(workload, tiny=True, dtype=torch.bfloat16, device=device, seed=0)
    input_ids, labels = make_batch(workload, tiny=True, batch=2, seq=16, device=device, seed=0)
    reference = model(input_ids=input_ids, labels=labels).loss
    errors = _Errors()
    # torch's loggers may not propagate to the root logger: listen where the records start
    loggers = [logging.getLogger(name) for name in ("torch", "twinkle_fx", "transformers", "")]
    for logger in loggers:
        logger.addHandler(errors)
    try:
        torch._dynamo.reset()
        loss = torch.compile(model, backend=backend)(input_ids=input_ids, labels=labels).loss
        loss.backward()
    finally:
        for logger in loggers:
            logger.removeHandler(errors)
        torch._dynamo.reset()
    assert not errors.records, "\n\n".join(
        f"{r.name}: {r.getMessage()}\n{logging.Formatter().formatException(r.exc_info) if r.exc_info else ''}"
        for r in errors.records[:3])
    torch.testing.assert_close(loss, reference, rtol=2e-2, atol=2e-2)
